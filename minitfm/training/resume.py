"""Where a run starts: a fresh state, or the state of the latest checkpoint of its run directory,
and every worker's copy of rank 0's. :class:`~minitfm.training.run.Run` reads the checkpoint when
it is opened (:func:`latest_checkpoint`), and at :meth:`~minitfm.training.run.Run.start` makes the
state (:func:`resumed_state` or :func:`fresh_state`) and shares it (:func:`share_state`).

Resuming (``options.resume``) continues from the latest checkpoint of ``options.out_dir``, read
once when the run is opened. Nothing in the directory is written before it passes every check:
a directory with checkpoints needs ``resume``; one with an earlier run's ``checkpoint_best.npz``
and no other checkpoint is refused (a new run would replace it); the checkpoint must pass the
check of :mod:`minitfm.usable` (kind, parameters, dtypes, finite values, Adam's moments) and be
a training checkpoint; the options that define the run (``options.defining``) and the seed must
be those it started with; at the start, the config, the vocabulary and ``run_meta`` (what the
trainer's data must match) must be the checkpoint's too. A resumed run reaches bit-identical
parameters to an uninterrupted one.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from minitfm import checkpoint, flat, models, usable
from minitfm.backend import products
from minitfm.workers import distributed
from minitfm.gradscale import LossScaler
from minitfm.optim import Adam
from minitfm.training.record import changed_options
from minitfm.training.rundir import BEST_NAME, RunDirectory
from minitfm.training.state import TrainOptions, TrainState
from minitfm.training.validation import Record

__all__ = ["latest_checkpoint", "resumed_state", "fresh_state", "share_state"]


def latest_checkpoint(run_dir: RunDirectory | None, options: TrainOptions, kind: str,
                      say: Callable[[str], None]) -> checkpoint.Checkpoint | None:
    """The latest checkpoint of the run directory, read back whole and checked, or None; ``say``
    shows a line on the console."""
    latest = run_dir.latest_checkpoint() if run_dir else None
    if latest is None and run_dir and os.path.lexists(run_dir.best_path):
        raise FileExistsError(
            f"{options.out_dir} holds {BEST_NAME}, the best checkpoint of an earlier "
            f"run, and no numbered checkpoint (checkpoint_<step>.npz) to continue from: a new "
            f"run there would replace it. Move it out of {options.out_dir}, or choose "
            f"another --out")
    if latest is None:
        if options.resume:
            say(f"no checkpoint in {options.out_dir}: starting from scratch")
        return None
    if not options.resume:
        raise FileExistsError(f"{options.out_dir} already holds checkpoints of a run: "
                              f"continue it with --resume, or choose another --out")
    ckpt = usable.load(latest, kind).ckpt    # kind, names, shapes, dtypes, finite
    if "batches_done" not in ckpt.extra or ckpt.optimizer_state is None:
        raise checkpoint.CheckpointError(
            f"checkpoint {latest} is not a training checkpoint (no optimizer state or data "
            f"position; an averaged model?): resume from a checkpoint written by training, "
            f"or start a new run in another directory")
    _check_same_options(ckpt, run_dir, options)
    return ckpt


def _check_same_options(ckpt: checkpoint.Checkpoint, run_dir: RunDirectory,
                        options: TrainOptions) -> None:
    """The seed and the options that define the run (``run.json``) are the run's own."""
    started = {**run_dir.record.started_args(),      # none recorded: the checkpoint
               "seed": ckpt.extra["seed"]}            # is checked alone
    now = {**options.command, "seed": options.seed}
    changed = changed_options(started, now, ("seed", *options.defining), ckpt.config)
    if changed:
        raise checkpoint.CheckpointError(
            f"cannot resume {options.out_dir} with other options:\n  " + "\n  ".join(changed)
            + "\nResume with the options it was started with, or start a new run with "
              "another --out")


def resumed_state(ckpt: checkpoint.Checkpoint, cfg, vocab_id: str | None, run_meta: dict,
                  options: TrainOptions, say: Callable[[str], None]) -> TrainState:
    """The state of ``ckpt``, the checkpoint read when the run was opened, checked against the
    run: its config ``cfg``, its vocabulary and ``run_meta``. The state copies what it needs."""
    checkpoint.check_compatible(ckpt, cfg.to_dict(), vocab_id)
    problems = [f"{key!r}: checkpoint has {saved}, current run has {current}"
                for key, saved, current in checkpoint.config_differences(
                    ckpt.extra.get("run_meta", {}), run_meta)]
    if problems:
        raise checkpoint.CheckpointError(
            f"checkpoint {ckpt.path} belongs to another run:\n  " + "\n  ".join(problems)
            + "\nResume with the settings it was trained with, or start a new run in "
              "another directory")
    record = Record.from_dict(ckpt.extra.get("validation"))
    if record.best is not None and record.metric != options.best_metric:
        raise checkpoint.CheckpointError(
            f"checkpoint {ckpt.path} belongs to a run that chooses by {record.metric}, not "
            f"{options.best_metric or 'no metric'}: resume with the metric it was started "
            f"with")
    record.metric = options.best_metric
    params = flat.flatten(checkpoint.params_to_device(ckpt.params))
    optimizer = Adam(params, weight_decay=options.weight_decay)
    optimizer.load_state_dict(ckpt.optimizer_state)
    extra = ckpt.extra
    valid = extra.get("valid", {}) if record.last_validated == ckpt.step else {}
    scaler = _loss_scaler(options)
    if scaler is not None and "loss_scaler" in extra:
        scaler.load_state_dict(extra["loss_scaler"])     # as it was: a resume continues exactly
    say(f"resuming from {ckpt.path} (step {ckpt.step})")
    return TrainState(params=params, optimizer=optimizer, seed=extra["seed"], step=ckpt.step,
                      epoch=extra["epoch"], batches_done=extra["batches_done"],
                      tokens=extra["tokens"], elapsed=extra["elapsed"],
                      last_checkpoint=ckpt.path, valid=dict(valid), record=record,
                      scaler=scaler, out_of_patience=bool(options.patience)
                      and record.since_best >= options.patience)


def fresh_state(cfg, params: dict | None, options: TrainOptions) -> TrainState:
    """The state of a new run: ``params`` (default: the model's ``init_params``), Adam's."""
    trained = models.of(cfg)
    params = trained.init_params(cfg, options.seed) if params is None else params
    trained.check_params(params, cfg)
    return TrainState(params=params,
                      optimizer=Adam(params, weight_decay=options.weight_decay),
                      seed=options.seed, record=Record(metric=options.best_metric),
                      scaler=_loss_scaler(options))


def _loss_scaler(options: TrainOptions) -> LossScaler | None:
    """A loss scaler under mixed precision (``products.precision() == "fp16"``), else None."""
    return LossScaler(options.loss_scale) if products.precision() == "fp16" else None


def share_state(world: distributed.World, state: TrainState) -> None:
    """Every worker continues from rank 0's state, fresh or resumed: its parameters, Adam's
    moments and step, the data position, the token count, the clock, and what the
    validation record decides for every worker (the step of the latest validation, the
    automatic dropout start)."""
    if not world.distributed:
        return
    for arrays in (state.params, state.optimizer.m, state.optimizer.v):
        world.broadcast_params(arrays)
    if state.scaler is not None:
        world.broadcast_params({"loss_scaler": state.scaler.state})
    numbers = world.broadcast_numbers([state.step, state.optimizer.step, state.epoch,
                                       state.batches_done, state.tokens, state.elapsed])
    (state.step, state.optimizer.step, state.epoch, state.batches_done,
     state.tokens) = (int(n) for n in numbers[:5])
    state.elapsed = numbers[5]
    decided = world.broadcast_numbers([-1 if n is None else n for n in
                                       (state.record.last_validated,
                                        state.record.dropout_from)]
                                      + [float(state.out_of_patience)])
    state.record.last_validated, state.record.dropout_from = (None if n < 0 else int(n)
                                                              for n in decided[:2])
    state.out_of_patience = bool(decided[2])
