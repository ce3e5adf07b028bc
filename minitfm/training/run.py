"""One training run: its options, its model and state, its run directory and its workers, and all
that happens to it besides the updates -- starting or resuming, saving, validating, stopping.
The loop (:mod:`minitfm.training.loop`) makes the updates and calls on it.

    with Run(options, kind) as run:      take the run directory; resuming, read and check its
                                         latest checkpoint (once, before any data is read)
        run.start(cfg, ...)              the fresh or resumed state, and the plan (plan.py)
        state = loop.train(run, batches)

Resuming (``options.resume``) continues from the latest checkpoint of ``options.out_dir``, read
once when the run is opened and checked against the run then and at :meth:`Run.start`
(:mod:`minitfm.training.resume`, with the fresh state and every worker's copy of rank 0's).

Every checkpoint stores the validation record (validation.py); a checkpoint saved at a
validation also that validation's results: it is saved before the validation (one that runs out
of memory loses no update) and again, atomically, once the results are in. With
``best_metric``, every validation saves a checkpoint (each validated model is on disk, ranked by
its metric); ``checkpoint_best.npz`` is a second name for the best one, and rotation spares the
``keep_best`` best.

Several workers (``mpiexec -n N``; :mod:`minitfm.workers.distributed`): only rank 0 reads and writes the
run directory, shows progress and validates; every worker continues from rank 0's state
(:meth:`Run.start`), learns what a validation decides for all (a stop for patience, the
automatic dropout start), and all stop together after the update in which any received a signal.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterable

from tqdm import tqdm

from minitfm import checkpoint, models
from minitfm.workers import distributed
from minitfm.training.divergence import diverged
from minitfm.training.plan import PlanError, plan
from minitfm.training.record import outcome
from minitfm.training.resume import fresh_state, latest_checkpoint, resumed_state, share_state
from minitfm.training.rundir import REPLACED_NAME, RunDirectory
from minitfm.training.state import TrainOptions, TrainState
from minitfm.training.stops import (AgreedStop, StopRequests, describe_signal,
                                    interrupts_deferred)
from minitfm.training import validation
from minitfm.training.validation import Batch, ValidMetric

__all__ = ["Run", "due"]


def due(step: int, every: int, last: int) -> bool:
    """Whether something done ``every`` steps (0: only at the end) is due at ``step``."""
    return step == last or (every > 0 and step % every == 0)


class Run:
    """A training run of a model of ``kind`` (a kind of the registry, minitfm.models)."""

    def __init__(self, options: TrainOptions, kind: str) -> None:
        if options.resume and not options.out_dir:
            raise ValueError("resume needs out_dir, the run directory to resume")
        self.world = distributed.world()
        self.kind = kind
        self.options = options if self.world.is_root else dataclasses.replace(
            options, out_dir=None, resume=False, progress=False)   # rank 0's run, shown once
        self.run_dir = (RunDirectory.open(self.options.out_dir, options.keep_last)
                        if self.options.out_dir else None)
        self.cfg = self.state = self.plan = None
        self.valid_batches: Iterable[Batch] | None = None
        self.valid_metric: ValidMetric | None = None
        self.on_dropout_start: Callable[[], None] | None = None
        try:
            self.resumed = latest_checkpoint(self.run_dir, self.options, kind, self.say)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Give the run directory back (unless the caller holds it too)."""
        if self.run_dir is not None:
            self.run_dir.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        try:
            if self.run_dir is not None and self.state is not None:
                self.run_dir.record.end(outcome(self.state, exc, self.options.patience),
                                        self.state.step, self.state.last_checkpoint)
        finally:
            self.close()

    def say(self, text: str) -> None:
        """Show ``text`` on the console above the progress bar, unless progress is off."""
        if self.options.progress:
            tqdm.write(text)

    # ---- start or resume ----------------------------------------------------------------------

    def resumed_vocab(self) -> tuple[str | None, bytes | None] | None:
        """The vocabulary (identifier, tokenizer model) of the checkpoint being resumed, on every
        worker; None for a fresh start."""
        ckpt, world = self.resumed, self.world
        if not world.distributed:
            return None if ckpt is None else (ckpt.vocab_id, ckpt.vocab_model)
        if not world.broadcast_numbers([ckpt is not None])[0]:     # rank 0 read the checkpoint
            return None
        vocab_id = world.broadcast_text((ckpt.vocab_id or "") if ckpt else "")
        model = world.broadcast_bytes((ckpt.vocab_model or b"") if ckpt else b"")
        return vocab_id or None, model or None

    def start(self, cfg, *, params: dict | None = None, epoch_updates: float | None = None,
              vocab_id: str | None = None, vocab_model: bytes | None = None,
              run_meta: dict | None = None, valid_batches: Iterable[Batch] | None = None,
              valid_metric: ValidMetric | None = None,
              on_dropout_start: Callable[[], None] | None = None) -> TrainState:
        """Start (or resume) training ``cfg``'s model; return the state.

        params: initial parameters, trained in place (default: the model's ``init_params``);
            ignored when resuming. epoch_updates: the updates of one epoch (plan.py).
        vocab_id, vocab_model: the vocabulary, stored in every checkpoint (a resumed run's must
            be the same); run_meta: JSON values the resumed checkpoint must match.
        valid_batches: batches for the validation loss; valid_metric: ``(params, cfg) ->
            {"valid_bleu": ...}``, called at each validation; on_dropout_start: called once,
            before the batches of the first update with dropout are read (BPE-dropout)."""
        if models.of(cfg).KIND != self.kind:
            raise ValueError(f"this run trains {models.describe(self.kind)}, not "
                             f"{models.describe(models.of(cfg).KIND)}")
        self.cfg, self.vocab = cfg, (vocab_id, vocab_model)
        self.run_meta = run_meta or {}
        self.valid_batches, self.valid_metric = valid_batches, valid_metric
        self.on_dropout_start = on_dropout_start
        self.plan = plan(self.options, cfg.d_model, epoch_updates)
        self._check_validation()
        self.state = self._resume() if self.resumed else fresh_state(cfg, params, self.options)
        share_state(self.world, self.state)
        if self.run_dir:
            self._prepare_directory()
        return self.state

    def _check_validation(self) -> None:
        """What chooses by validation needs something to validate (rank 0 validates)."""
        if not self.world.is_root:
            return
        if self.options.best_metric is not None:
            validation.check_metric(self.options.best_metric)
        if self.plan.dropout_start_auto is not None and self.valid_batches is None:
            raise PlanError("--dropout-start auto watches the validation perplexity, but there "
                            "are no validation batches: give the validation data")
        if self.options.best_metric is not None and not self.validating:
            raise PlanError("--best-metric judges validations, but there is nothing to "
                            "validate: give the validation data")

    @property
    def validating(self) -> bool:
        """Whether this worker validates: rank 0, given something to validate."""
        return self.world.is_root and (self.valid_batches is not None
                                       or self.valid_metric is not None)

    def _resume(self) -> TrainState:
        """The state of the checkpoint read when the run was opened, checked against the run.
        The state copies what it needs: the checkpoint's own arrays are let go."""
        ckpt, self.resumed = self.resumed, None
        return resumed_state(ckpt, self.cfg, self.vocab[0], self.run_meta, self.options, self.say)

    def _prepare_directory(self) -> None:
        """The log cut back to the state's step, run.json, and the best checkpoint named."""
        state, run_dir = self.state, self.run_dir
        info = {"args": self.options.command, "config": self.cfg.to_dict()}
        cut, replaced = run_dir.prepare(state.step, info, state.last_checkpoint,
                                        resumed=state.last_checkpoint is not None)
        if replaced:
            print(f"{run_dir.log_path}: {'a line' if replaced == 1 else f'{replaced} lines'} of "
                  f"the steps after {state.step}, which this run makes again, moved to "
                  f"{os.path.join(run_dir.path, REPLACED_NAME)}", file=sys.stderr, flush=True)
        if cut:
            print(f"{run_dir.log_path}: dropped {'a line' if cut == 1 else f'{cut} lines'} cut "
                  f"short (the run ended while writing it); the log goes on from step "
                  f"{state.step}", file=sys.stderr, flush=True)
        if state.record.best is not None:       # as it was: run.json and checkpoint_best.npz
            run_dir.record_best(state.record, state.last_checkpoint)
            best = run_dir.checkpoint_path(state.record.best_step)
            if os.path.exists(best):            # a crash may have come before its naming
                run_dir.name_best(best, state.last_checkpoint)

    def time_fraction(self) -> float:
        """The fraction of the time limit spent so far (0 without a limit)."""
        limit = self.options.time_limit
        return 0.0 if limit is None else min(1.0, self.state.elapsed / limit)

    # ---- save, validate, stop -----------------------------------------------------------------

    def save(self) -> None:
        """Write a checkpoint of the state (refusing non-finite parameters), name it
        ``checkpoint_best.npz`` when it holds the best validation, and rotate old ones (but the
        best kept and ``state.spared_step``, the last good one while the loss runs high)."""
        state, run_dir = self.state, self.run_dir
        validated = state.valid if state.valid.get("step") == state.step else None
        extra = {"seed": state.seed, "epoch": state.epoch, "batches_done": state.batches_done,
                 "tokens": state.tokens, "elapsed": state.elapsed, "run_meta": self.run_meta,
                 "validation": state.record.to_dict(), **({"valid": validated} if validated
                                                           else {}),
                 **({"loss_scaler": state.scaler.state_dict()} if state.scaler else {})}

        def write(path: str) -> None:
            checkpoint.save(path, state.params, optimizer_state=state.optimizer.state_dict(),
                            step=state.step, config=self.cfg.to_dict(), vocab_id=self.vocab[0],
                            vocab_model=self.vocab[1], kind=self.kind, extra=extra)

        try:
            with interrupts_deferred():
                state.last_checkpoint = run_dir.save_checkpoint(state.step, write,
                                                                state.last_checkpoint)
                if state.record.best_step == state.step:
                    run_dir.name_best(state.last_checkpoint, state.last_checkpoint)
                spare = state.record.kept_steps(self.options.keep_best)
                run_dir.rotate(state.last_checkpoint, spare=spare + (
                    [] if state.spared_step is None else [state.spared_step]))
        except checkpoint.NonFiniteError as exc:
            raise diverged(f"{exc.what} holds NaN or Inf", state.step, state) from exc

    def cut_short(self) -> bool:
        """Whether the validation due at a resumed run's step was never made (a signal came
        during that step's update or validation, and the checkpoint was saved without it)."""
        state = self.state
        return (state.step > 0 and state.record.last_validated != state.step
                and due(state.step, self.options.valid_every, self.plan.steps))

    def validate(self, save_now: bool) -> None:
        """The validation due at this step (rank 0), what every worker must know of it (a stop
        for patience, the automatic dropout start), and the checkpoint due with it (``save_now``).

        That checkpoint is saved before the validation, unless it is on disk already: a
        validation that fails (out of memory, in the run's last one, say) loses no update. Saved
        again once the validation is made, atomically, it then records its results too."""
        state, world = self.state, self.world
        if save_now and state.last_checkpoint != self.run_dir.checkpoint_path(state.step):
            self.save()
        if self.validating:
            self._validate()
        if world.distributed and (self.options.patience
                                  or self.plan.dropout_start_auto is not None):
            agreed = world.broadcast_numbers([float(state.out_of_patience),
                                              -1 if state.record.dropout_from is None
                                              else state.record.dropout_from])
            state.out_of_patience = bool(agreed[0])
            state.record.dropout_from = None if agreed[1] < 0 else int(agreed[1])
        if save_now and self.validating:
            self.save()

    def _validate(self) -> None:
        state, options, record = self.state, self.options, self.state.record
        results = {}
        if self.valid_batches is not None:
            results.update(validation.evaluate(state.params, self.cfg, self.valid_batches))
        if self.valid_metric is not None:
            results.update(self.valid_metric(state.params, self.cfg))
        with interrupts_deferred():             # the record, the log and run.json agree
            improved, dropout_starts = record.judge(state.step, results, options.keep_best,
                                                    self.plan.dropout_start_auto)
            state.valid = {"step": state.step, **results}
            line = dict(state.valid)
            if record.metric is not None and record.best is not None:
                line.update({f"best_{record.metric}": record.best, "best_step": record.best_step})
            if record.dropout_from is not None:
                line["dropout_from"] = record.dropout_from
            if options.patience and record.since_best >= options.patience:
                state.out_of_patience = True
            if self.run_dir:
                self.run_dir.append_log(line, state.last_checkpoint)
                if improved:
                    self.run_dir.record_best(record, state.last_checkpoint)
        self.say(f"step {state.step}: " + ", ".join(
            f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
            for key, value in results.items())
            + (f"; {record.describe_best()}" if record.best is not None else ""))
        if dropout_starts:
            self.say(dropout_starts)
        if state.out_of_patience:
            self.say(f"no better {record.metric} in {options.patience} validations "
                     f"({record.describe_best()}): stopping at step {state.step}")

    def out_of_memory(self, exc: MemoryError) -> MemoryError:
        """``exc``, raised in an update or a validation, saying after which update and which
        checkpoint is kept: that of the last update (a validation saves it first), or the newest
        this session has."""
        state, run_dir = self.state, self.run_dir
        done = f"after update {state.step}" if state.step else "before the first update"
        if run_dir is None:
            kept = ""
        elif state.last_checkpoint == run_dir.checkpoint_path(state.step):
            kept = (f"; its checkpoint, {state.last_checkpoint}, is saved: continue from it with "
                    f"--resume")
        elif state.last_checkpoint:
            kept = (f"; the newest checkpoint, {state.last_checkpoint}, is intact: continue "
                    f"from it with --resume")
        else:
            kept = "; no checkpoint of this run was saved yet"
        return MemoryError(f"{str(exc).rstrip('.')}{'; ' if str(exc) else ''}{done}{kept}")

    def stop(self, interrupt: KeyboardInterrupt, stops: StopRequests) -> None:
        """The run stops on a signal: a checkpoint of the last completed update (unless saved
        already), and the state says so. Raised in one worker's own code alone, the
        interrupt goes on (``World.fail_together`` ends every worker)."""
        agreed = interrupt.requests if isinstance(interrupt, AgreedStop) else {}
        if self.world.distributed and not agreed:
            raise interrupt
        stops.stopping()                    # from here on, further signals are ignored
        state = self.state
        state.interrupted, state.stop_signal = True, stops.signum
        if self.run_dir and state.last_checkpoint != self.run_dir.checkpoint_path(state.step):
            self.save()
        self.say(f"{describe_signal(state.stop_signal)} at step {state.step}"
                 + (f" ({distributed.describe_stops(agreed)})" if agreed else "")
                 + (f"; checkpoint {state.last_checkpoint}" if self.run_dir else ""))
