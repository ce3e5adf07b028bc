"""Where a training run stands, and how that state starts, is saved, resumed and shared.

:class:`TrainOptions` says how to train, :class:`TrainState` where a run stands: everything a
checkpoint stores (the parameters, Adam's moments, the step, the seed and the data position
``(epoch, batches consumed in that epoch)``), plus what the caller reads back.

A run starts fresh (:func:`start`: parameters from the model's ``init_params``), or, with
``resume=True``, from the latest checkpoint of its run directory after checking that it fits:
it must pass :mod:`minitfm.usable`'s check (kind, parameters, dtypes, finite values, Adam's
moments), and the config, the vocabulary, the seed and ``run_meta`` must match
(``checkpoint.CheckpointError`` says which does not); nothing in the run directory is written
before those checks pass. Started as several workers, every worker continues from rank 0's
state (:func:`share`), and only rank 0 reads and writes the run directory (:func:`for_this_worker`).

Choosing by validation (:mod:`minitfm.validation`): every checkpoint stores the run's validation
record (the best so far, the patience count, the kept-best set, the automatic dropout start), and
a checkpoint saved at a validation also that validation's results. With ``best_metric``, every
validation saves a checkpoint (so that each validated model is on disk, ranked by its metric);
``checkpoint_best.npz`` is a second name for the best one (:meth:`RunDirectory.name_best`), and
rotation spares the ``keep_best`` best.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm import tqdm

from minitfm import backend, checkpoint, distributed, flat, models, usable, validation
from minitfm.divergence import diverged
from minitfm.gradscale import INITIAL_SCALE, LossScaler
from minitfm.models import ModelConfig as Config      # the config of any registered model
from minitfm.optim import Adam
from minitfm.rundir import RunDirectory
from minitfm.stops import interrupts_deferred

__all__ = ["TrainOptions", "TrainState", "start", "save", "for_this_worker", "share", "say"]


@dataclass
class TrainOptions:
    """How to train; the model itself is described by its ``Config``."""

    steps: int                          # total number of updates, counted from the first one
    out_dir: str | None = None          # checkpoints and log.jsonl; None: keep nothing on disk
    seed: int = 0                       # parameter init, dropout masks (and the caller's data)
    lr_factor: float = 1.0              # scales the paper's learning-rate schedule
    warmup: int = 4000
    schedule: Callable[[int, float], float] | None = None   # lr(step, time_fraction); None: paper
    weight_decay: float = 0.0           # AdamW's decoupled weight decay (optim.Adam)
    dropout_start: float = 0.0          # dropout off before this fraction of the run ("late")
    dropout_start_step: int = 0         # ... or for this many updates
    dropout_start_auto: float | None = None   # ... or until a validation perplexity improves by
                                        # less than this margin (relative) on the one before
    on_dropout_start: Callable[[], None] | None = None   # called once, when dropout starts
    clip_norm: float | None = None      # global gradient-norm clipping; None: no clipping
    update_freq: int = 1                # batches summed into one update
    log_every: int = 10                 # steps between log lines
    valid_every: int = 0                # steps between validations; 0: only at the end
    save_every: int = 0                 # steps between checkpoints; 0: only at the end
    keep_last: int = 5                  # checkpoints kept in out_dir
    best_metric: str | None = None      # choose by this validation result (validation.py)
    keep_best: int = 0                  # the checkpoints of the best validations, also kept
    patience: int = 0                   # stop after this many validations without improvement
    resume: bool = False                # continue from the latest checkpoint in out_dir
    time_limit: float | None = None     # seconds of training (over all sessions of the run)
    vocab_id: str | None = None         # identifies the vocabulary; must match on resume
    vocab_model: bytes | None = None    # the tokenizer model, stored in every checkpoint
    run_meta: dict = field(default_factory=dict)   # JSON values that must match on resume
    run_info: dict | None = None        # JSON written to out_dir/run.json once checks pass
    progress: bool = True               # tqdm bar and validation messages on the console
    loss_scale: float = INITIAL_SCALE   # mixed precision (--precision fp16): the initial scale

    def __post_init__(self) -> None:
        for name in ("steps", "warmup", "update_freq", "log_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainOptions.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("valid_every", "save_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainOptions.{name} must be >= 0 (0: only at the end), "
                                 f"got {getattr(self, name)}")
        for name in ("keep_best", "patience", "dropout_start_step"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainOptions.{name} must be >= 0 (0: none), "
                                 f"got {getattr(self, name)}")
        if not 0.0 <= self.dropout_start < 1.0:
            raise ValueError(f"TrainOptions.dropout_start must be in [0, 1), got "
                             f"{self.dropout_start}")
        if self.best_metric is not None:
            validation.check_metric(self.best_metric)
        elif self.keep_best or self.patience:
            raise ValueError("TrainOptions.keep_best and patience judge validations by "
                             "best_metric: set it (e.g. 'valid_loss')")
        if self.dropout_start_auto is not None and not 0.0 <= self.dropout_start_auto < 1.0:
            raise ValueError(f"TrainOptions.dropout_start_auto (a margin) must be in [0, 1), "
                             f"got {self.dropout_start_auto}")
        if sum((self.dropout_start > 0, self.dropout_start_step > 0,
                self.dropout_start_auto is not None)) > 1:
            raise ValueError("give one of TrainOptions.dropout_start, dropout_start_step and "
                             "dropout_start_auto")
        if self.time_limit is not None and self.time_limit <= 0:
            raise ValueError(f"TrainOptions.time_limit must be > 0 seconds, got {self.time_limit}")
        if self.resume and not self.out_dir:
            raise ValueError("TrainOptions.resume=True needs out_dir, the run directory to resume")


@dataclass
class TrainState:
    """Where a run stands: everything a checkpoint stores, plus what the caller reads back."""

    params: dict
    optimizer: Adam
    seed: int
    step: int = 0                 # updates done
    epoch: int = 0                # data position: the epoch being read ...
    batches_done: int = 0         # ... and how many of its batches are consumed
    tokens: int = 0               # target tokens trained on so far
    elapsed: float = 0.0          # training seconds so far, over all sessions of the run
    valid: dict = field(default_factory=dict)   # the latest validation results
    last_checkpoint: str | None = None
    interrupted: bool = False     # stopped by a signal (a checkpoint was saved if out_dir is set)
    stop_signal: int | None = None   # which: SIGINT (also a KeyboardInterrupt raised in code),
                                     # SIGTERM or SIGHUP
    out_of_time: bool = False     # stopped by options.time_limit (likewise)
    out_of_patience: bool = False   # stopped by options.patience (likewise)
    record: validation.Record = field(default_factory=validation.Record)   # judged so far
    grads: dict | None = field(default=None, repr=False)     # flat gradient buffers, reused by
    scratch: dict | None = field(default=None, repr=False)   # every update (see _accumulate)
    scaler: LossScaler | None = None    # mixed precision's loss scale (--precision fp16)



def save(state: TrainState, cfg: Config, options: TrainOptions, run_dir: RunDirectory) -> None:
    """Write a checkpoint of ``state`` (refusing non-finite parameters), name it
    ``checkpoint_best.npz`` when it holds the best validation, and rotate old ones."""
    validated = state.valid if state.valid.get("step") == state.step else None

    def write(path: str) -> None:
        checkpoint.save(
            path, state.params, optimizer_state=state.optimizer.state_dict(),
            step=state.step, config=cfg.to_dict(), vocab_id=options.vocab_id,
            vocab_model=options.vocab_model, kind=models.of(cfg).KIND,
            extra={"seed": state.seed, "epoch": state.epoch,
                   "batches_done": state.batches_done, "tokens": state.tokens,
                   "elapsed": state.elapsed, "run_meta": options.run_meta,
                   "validation": state.record.to_dict(),
                   **({"valid": validated} if validated else {}),
                   **({"loss_scaler": state.scaler.state_dict()} if state.scaler else {})})

    try:
        with interrupts_deferred():
            state.last_checkpoint = run_dir.save_checkpoint(state.step, write,
                                                            state.last_checkpoint)
            if state.record.best_step == state.step:
                run_dir.name_best(state.last_checkpoint)
            run_dir.rotate(state.last_checkpoint,
                           spare=state.record.kept_steps(options.keep_best))
    except checkpoint.NonFiniteError as exc:
        raise diverged(f"{exc.what} holds NaN or Inf", state.step, state) from exc


def _check_same_run(ckpt: checkpoint.Checkpoint, options: TrainOptions) -> None:
    """Refuse to resume with another seed or other ``run_meta`` than the checkpoint's."""
    if "batches_done" not in ckpt.extra or ckpt.optimizer_state is None:
        raise checkpoint.CheckpointError(
            f"checkpoint {ckpt.path} is not a training checkpoint (no optimizer state or data "
            f"position; an averaged model?): resume from a checkpoint written by train(), or "
            f"start a new run in another directory")
    problems = []
    if ckpt.extra["seed"] != options.seed:
        problems.append(f"seed: checkpoint has {ckpt.extra['seed']}, "
                        f"current run has {options.seed}")
    problems += [f"{key!r}: checkpoint has {saved}, current run has {current}"
                 for key, saved, current in
                 checkpoint.config_differences(ckpt.extra.get("run_meta", {}), options.run_meta)]
    if problems:
        raise checkpoint.CheckpointError(
            f"checkpoint {ckpt.path} belongs to another run:\n  " + "\n  ".join(problems)
            + "\nResume with the settings it was trained with, or start a new run in another "
              "directory")


def _resume(cfg: Config, options: TrainOptions, path: str) -> TrainState:
    """The state saved at ``path``, after checking that the checkpoint fits this run."""
    ckpt = usable.load(path, models.of(cfg).KIND).ckpt    # kind, names, shapes, dtypes, finite
    checkpoint.check_compatible(ckpt, cfg.to_dict(), options.vocab_id)
    _check_same_run(ckpt, options)
    params = flat.flatten(checkpoint.params_to_device(ckpt.params))
    optimizer = Adam(params, weight_decay=options.weight_decay)
    optimizer.load_state_dict(ckpt.optimizer_state)
    extra = ckpt.extra
    record = validation.Record.from_dict(extra.get("validation"))
    if record.best is not None and record.metric != options.best_metric:
        raise checkpoint.CheckpointError(
            f"checkpoint {path} belongs to a run that chooses by {record.metric}, not "
            f"{options.best_metric or 'no metric'}: resume with the metric it was started with")
    record.metric = options.best_metric
    valid = extra.get("valid", {}) if record.last_validated == ckpt.step else {}
    scaler = _scaler(options)
    if scaler is not None and "loss_scaler" in extra:
        scaler.load_state_dict(extra["loss_scaler"])     # as it was: a resume continues exactly
    return TrainState(params=params, optimizer=optimizer, seed=extra["seed"], step=ckpt.step,
                      scaler=scaler,
                      epoch=extra["epoch"], batches_done=extra["batches_done"],
                      tokens=extra["tokens"], elapsed=extra["elapsed"], last_checkpoint=path,
                      valid=dict(valid), record=record,
                      out_of_patience=bool(options.patience)
                      and record.since_best >= options.patience)


def _scaler(options: TrainOptions) -> LossScaler | None:
    """A loss scaler under mixed precision (``backend.precision() == "fp16"``), else None."""
    return LossScaler(options.loss_scale) if backend.precision() == "fp16" else None


def start(cfg: Config, options: TrainOptions, params: dict | None,
          run_dir: RunDirectory | None) -> TrainState:
    """The latest checkpoint of ``run_dir`` when resuming, else a fresh state (from ``params``,
    if given); then ready ``run_dir`` for the run."""
    latest = run_dir.latest_checkpoint() if run_dir else None
    if latest and not options.resume:
        raise FileExistsError(
            f"{options.out_dir} already holds checkpoints of a run (latest: {latest}): resume it "
            f"(resume=True, --resume) or choose another output directory")
    if latest:
        state = _resume(cfg, options, latest)
        say(options, f"resuming from {latest} (step {state.step})")
    else:
        if options.resume:
            say(options, f"no checkpoint in {options.out_dir}: starting from scratch")
        trained = models.of(cfg)
        params = trained.init_params(cfg, options.seed) if params is None else params
        trained.check_params(params, cfg)
        optimizer = Adam(params, weight_decay=options.weight_decay)
        state = TrainState(params=params, optimizer=optimizer, seed=options.seed,
                           record=validation.Record(metric=options.best_metric),
                           scaler=_scaler(options))
    if run_dir:
        cut = run_dir.prepare(state.step, options.run_info, state.last_checkpoint)
        if cut:
            print(f"{run_dir.log_path}: dropped {'a line' if cut == 1 else f'{cut} lines'} cut "
                  f"short (the run ended while writing it); the log goes on from step "
                  f"{state.step}", file=sys.stderr, flush=True)
        if state.record.best is not None:       # as it was: run.json and checkpoint_best.npz
            run_dir.record_best(state.record, state.last_checkpoint)
            best = run_dir.checkpoint_path(state.record.best_step)
            if os.path.exists(best):            # a crash may have come before its naming
                run_dir.name_best(best, state.last_checkpoint)
    return state


def for_this_worker(options: TrainOptions, world: distributed.World) -> TrainOptions:
    """``options`` as rank 0 uses them; the other workers write no file (checkpoints, log,
    run.json) and show nothing: they take rank 0's state (:func:`share`)."""
    if world.is_root:
        return options
    return dataclasses.replace(options, out_dir=None, resume=False, run_info=None, progress=False)


def share(state: TrainState, world: distributed.World) -> None:
    """Every worker continues from rank 0's state, fresh or resumed: its parameters, Adam's
    moments and step, the data position, the token count, the clock, and what the validation
    record decides for every worker (the step of the latest validation, the automatic dropout
    start)."""
    if not world.distributed:
        return
    world.broadcast_params(state.params)
    world.broadcast_params(state.optimizer.m)
    world.broadcast_params(state.optimizer.v)
    if state.scaler is not None:
        world.broadcast_params({"loss_scaler": state.scaler.state})
    numbers = world.broadcast_numbers([state.step, state.optimizer.step, state.epoch,
                                       state.batches_done, state.tokens, state.elapsed])
    (state.step, state.optimizer.step, state.epoch, state.batches_done,
     state.tokens) = (int(n) for n in numbers[:5])
    state.elapsed = numbers[5]
    decided = world.broadcast_numbers([-1 if n is None else n for n in
                                       (state.record.last_validated, state.record.dropout_from)]
                                      + [float(state.out_of_patience)])
    state.record.last_validated, state.record.dropout_from = (None if n < 0 else int(n)
                                                              for n in decided[:2])
    state.out_of_patience = bool(decided[2])


def say(options: TrainOptions, text: str) -> None:
    """Show ``text`` on the console above the progress bar, unless ``options.progress`` is off."""
    if options.progress:
        tqdm.write(text)
