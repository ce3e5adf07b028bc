"""Validation inside the training loop (:mod:`minitfm.train`): the loss and perplexity of the
validation batches, when a validation is due, what it records, and the checkpoint saved with it.

A validation (rank 0) evaluates the validation batches (:func:`evaluate`) and the caller's
metric (BLEU, exact match), judges the results against the run's record (best so far, kept best,
patience, automatic dropout start: :class:`minitfm.validation.Record`), and logs them; every
worker then learns what it must (a stop for patience, the dropout start) before the checkpoint
due at that step is saved.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from minitfm import distributed, models
from minitfm.models import ModelConfig as Config
from minitfm.rundir import RunDirectory
from minitfm.stops import interrupts_deferred
from minitfm.trainstate import TrainOptions, TrainState, save, say

__all__ = ["Batch", "ValidMetric", "evaluate", "due", "check_options", "cut_short",
           "validate_and_save"]

Batch = tuple            # (src (B, S), tgt (B, T+1)), or (x (B, T), y (B, T)) for lm: token ids
ValidMetric = Callable[[dict, Config], dict]


def evaluate(params: dict, cfg: Config, batches: Iterable[Batch]) -> dict:
    """Loss, NLL and perplexity per target token over ``batches``, without dropout."""
    loss_sum = nll_sum = 0.0
    tokens = 0
    for src, tgt in batches:
        stats, _ = models.of(cfg).loss_and_grads(params, cfg, src, tgt, grads=False,
                                                normalizer=1.0)
        loss_sum += stats["loss"]
        nll_sum += stats["nll"]
        tokens += stats["tokens"]
    if tokens == 0:
        raise ValueError("the validation batches hold no target tokens")
    nll = float(nll_sum) / tokens
    return {"valid_loss": float(loss_sum) / tokens, "valid_nll": nll,
            "valid_ppl": math.exp(min(nll, 700.0))}


def due(step: int, every: int, last: int) -> bool:
    """Whether something done ``every`` steps (0: only at the end) is due at ``step``."""
    return step == last or (every > 0 and step % every == 0)


def check_options(options: TrainOptions, valid_batches, valid_metric) -> None:
    """What chooses by validation needs something to validate: refuse it before any work."""
    if valid_batches is None and valid_metric is None:
        wanted = [name for name, value in (("best_metric", options.best_metric),
                                           ("dropout_start_auto", options.dropout_start_auto))
                  if value is not None]
        if wanted:
            raise ValueError(f"TrainOptions.{wanted[0]} judges validations, but there is "
                             f"nothing to validate: pass valid_batches or valid_metric")
    if options.dropout_start_auto is not None and valid_batches is None:
        raise ValueError("TrainOptions.dropout_start_auto watches the validation perplexity: "
                         "pass valid_batches")


def cut_short(state: TrainState, options: TrainOptions) -> bool:
    """Whether the validation due at a resumed run's step was never made (a signal came during
    that step's update or validation, and the checkpoint was saved without it). The same on
    every worker (the step and ``last_validated`` are shared)."""
    return (state.step > 0 and state.record.last_validated != state.step
            and due(state.step, options.valid_every, options.steps))


def validate_and_save(state: TrainState, cfg: Config, options: TrainOptions,
                      run_dir: RunDirectory | None, world: distributed.World, validating: bool,
                      valid_batches: Iterable[Batch] | None, valid_metric: ValidMetric | None,
                      save_now: bool) -> None:
    """The validation due at this step (rank 0), what every worker must know of it (a stop for
    patience, the automatic dropout start), and the checkpoint due with it."""
    if validating:
        _validate(state, cfg, options, run_dir, valid_batches, valid_metric)
    if world.distributed and (options.patience or options.dropout_start_auto is not None):
        agreed = world.broadcast_numbers([float(state.out_of_patience),
                                          -1 if state.record.dropout_from is None
                                          else state.record.dropout_from])
        state.out_of_patience = bool(agreed[0])
        state.record.dropout_from = None if agreed[1] < 0 else int(agreed[1])
    if save_now:
        save(state, cfg, options, run_dir)


def _validate(state: TrainState, cfg: Config, options: TrainOptions,
              run_dir: RunDirectory | None, valid_batches: Iterable[Batch] | None,
              valid_metric: ValidMetric | None) -> None:
    results = {}
    if valid_batches is not None:
        results.update(evaluate(state.params, cfg, valid_batches))
    if valid_metric is not None:
        results.update(valid_metric(state.params, cfg))
    record = state.record
    with interrupts_deferred():             # the record, the log and run.json agree
        improved, dropout_starts = record.judge(state.step, results, options.keep_best,
                                                options.dropout_start_auto)
        state.valid = {"step": state.step, **results}
        line = dict(state.valid)
        if record.metric is not None and record.best is not None:
            line.update({f"best_{record.metric}": record.best, "best_step": record.best_step})
        if record.dropout_from is not None:
            line["dropout_from"] = record.dropout_from
        if options.patience and record.since_best >= options.patience:
            state.out_of_patience = True
        if run_dir:
            run_dir.append_log(line, state.last_checkpoint)
            if improved:
                run_dir.record_best(record, state.last_checkpoint)
    say(options, f"step {state.step}: " + ", ".join(
        f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
        for key, value in results.items())
        + (f"; {record.describe_best()}" if record.best is not None else ""))
    if dropout_starts:
        say(options, dropout_starts)
    if state.out_of_patience:
        say(options, f"no better {record.metric} in {options.patience} validations "
                     f"({record.describe_best()}): stopping at step {state.step}")
