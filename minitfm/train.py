"""The training loop shared by ``train_toy.py`` and ``train_wmt.py``.

One call, ``train(cfg, batches, options)``, runs ``options.steps`` updates:

    for each step k = 1, 2, ..., steps:
        take update_freq batches; count their target tokens N
        grads = sum of loss_and_grads(batch, normalizer=N)       exact gradient accumulation
        stop with an error if the loss is NaN or Inf
        clip the global gradient norm (optional); Adam at lr = schedule(k)      (paper, 5.3)
        log, validate, save a checkpoint when due

Reproducibility. The whole random state of a run is ``(seed, step)`` plus the data position:
dropout masks of step k come from ``backend.rng(seed, k)``, and ``batches(epoch)`` must yield the
same batches in the same order for the same epoch (derive any shuffling from the seed and the
epoch). A checkpoint stores the parameters, Adam's moments, the step, the seed and the position
``(epoch, batches consumed in that epoch)``; ``resume=True`` restores them and skips the consumed
batches, so a resumed run reaches bit-identical parameters to an uninterrupted one on the same
backend.

Time. ``time_limit`` stops the run, with a validation and a checkpoint, after the update that
exhausts it; the clock (``state.elapsed``, validation included) carries over when a run is resumed.
Either way the run ends, by the step count or the time limit, the last step is validated (when
there is anything to validate) and ``state.valid`` holds the results.

Failures. Ctrl-C (KeyboardInterrupt) saves a checkpoint of the last completed step and returns
with ``state.interrupted`` set; an Adam update is never cut in half. A NaN or Inf loss, or
parameters that are no longer finite, raise :class:`TrainingDiverged` naming the step, before any
checkpoint of the broken state is written. Resuming from a checkpoint of another config,
vocabulary or seed, or from a damaged file, raises ``checkpoint.CheckpointError`` saying which.

Output in ``out_dir``: ``checkpoint_{step:08d}.npz`` (the last ``keep_last`` of them) and
``log.jsonl``, one JSON object per logged step (step, loss, nll, lr, tokens, tokens_per_s,
elapsed; grad_norm when clipping) or validation (step, valid_loss, valid_nll, valid_ppl and what
the ``valid_metric`` callback returns, e.g. valid_acc or valid_bleu).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from tqdm import tqdm

from minitfm import backend, checkpoint, model
from minitfm.model import Config
from minitfm.optim import Adam, LRSchedule, clip_grad_norm

__all__ = ["TrainOptions", "TrainState", "TrainingDiverged", "train", "evaluate", "LOG_NAME"]

LOG_NAME = "log.jsonl"

Batch = tuple            # (src (B, S), tgt (B, T+1)) token-id arrays, host or device
Batches = Callable[[int], Iterable[Batch]] | Iterable[Batch]
ValidMetric = Callable[[dict, Config], dict]


class TrainingDiverged(RuntimeError):
    """The loss or the parameters stopped being finite numbers."""


@dataclass
class TrainOptions:
    """How to train; the model itself is described by its ``Config``."""

    steps: int                          # total number of updates, counted from the first one
    out_dir: str | None = None          # checkpoints and log.jsonl; None: keep nothing on disk
    seed: int = 0                       # parameter init, dropout masks (and the caller's data)
    lr_factor: float = 1.0              # scales the paper's learning-rate schedule
    warmup: int = 4000
    clip_norm: float | None = None      # global gradient-norm clipping; None: no clipping
    update_freq: int = 1                # batches summed into one update
    log_every: int = 10                 # steps between log lines
    valid_every: int = 0                # steps between validations; 0: only at the end
    save_every: int = 0                 # steps between checkpoints; 0: only at the end
    keep_last: int = 5                  # checkpoints kept in out_dir
    resume: bool = False                # continue from the latest checkpoint in out_dir
    time_limit: float | None = None     # seconds of training (over all sessions of the run)
    vocab_id: str | None = None         # identifies the vocabulary; must match on resume
    vocab_model: bytes | None = None    # the tokenizer model, stored in every checkpoint
    run_meta: dict = field(default_factory=dict)   # JSON values that must match on resume
    progress: bool = True               # tqdm bar and validation messages on the console

    def __post_init__(self) -> None:
        for name in ("steps", "warmup", "update_freq", "log_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainOptions.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("valid_every", "save_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainOptions.{name} must be >= 0 (0: only at the end), "
                                 f"got {getattr(self, name)}")
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
    interrupted: bool = False     # stopped by Ctrl-C (a checkpoint was saved if out_dir is set)
    out_of_time: bool = False     # stopped by options.time_limit (likewise)


# ---- validation ---------------------------------------------------------------------------

def evaluate(params: dict, cfg: Config, batches: Iterable[Batch]) -> dict:
    """Loss, NLL and perplexity per target token over ``batches``, without dropout."""
    loss_sum = nll_sum = 0.0
    tokens = 0
    for src, tgt in batches:
        stats, _ = model.loss_and_grads(params, cfg, backend.to_device(src),
                                        backend.to_device(tgt), grads=False, normalizer=1.0)
        loss_sum += stats["loss"]
        nll_sum += stats["nll"]
        tokens += stats["tokens"]
    if tokens == 0:
        raise ValueError("the validation batches hold no target tokens")
    nll = nll_sum / tokens
    return {"valid_loss": loss_sum / tokens, "valid_nll": nll,
            "valid_ppl": math.exp(min(nll, 700.0))}


# ---- data ---------------------------------------------------------------------------------

def _batch_stream(batches: Batches, epoch: int, skip: int) -> Iterator[tuple[int, int, Batch]]:
    """Yield ``(epoch, batches consumed in it, batch)`` forever, starting after ``skip`` batches."""
    while True:
        source = batches(epoch) if callable(batches) else batches
        seen = skip
        for batch in itertools.islice(iter(source), skip, None):
            seen += 1
            yield epoch, seen, batch
        if seen == 0:
            raise ValueError(
                f"the batches of epoch {epoch} are empty: pass a factory batches(epoch) that "
                f"yields batches for every epoch, or a list (a generator is used up after one "
                f"pass)")
        epoch, skip = epoch + 1, 0


def _target_tokens(tgt, cfg: Config) -> int:
    return int((tgt[:, 1:] != cfg.pad_id).sum())


# ---- one update ---------------------------------------------------------------------------

@contextlib.contextmanager
def _interrupts_deferred():
    """Hold back Ctrl-C until the block is done, so an update is never applied halfway."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _accumulate(state: TrainState, cfg: Config, micro_batches: list, step: int,
                seed: int) -> tuple[dict, dict]:
    """Loss statistics and gradients of one update, summed over its batches."""
    total = sum(_target_tokens(tgt, cfg) for _, tgt in micro_batches)
    rng = backend.rng(seed, step)       # dropout masks of this step: a function of (seed, step)
    stats = {"loss": 0.0, "nll": 0.0, "tokens": total}
    grads = None
    for src, tgt in micro_batches:
        s, g = model.loss_and_grads(state.params, cfg, src, tgt, rng, normalizer=total)
        stats["loss"] += s["loss"]
        stats["nll"] += s["nll"]
        if grads is None:
            grads = g
        else:
            for name in grads:
                grads[name] += g[name]
    return stats, grads


def _diverged(what: str, step: int, state: TrainState) -> TrainingDiverged:
    kept = (f"the last good checkpoint, {state.last_checkpoint}, is intact" if state.last_checkpoint
            else "no checkpoint was written")
    return TrainingDiverged(
        f"{what} at step {step}; training stopped and {kept}. Lower the learning rate "
        f"(lr_factor), lengthen the warmup or clip gradients (clip_norm), then resume from the "
        f"last good checkpoint or start again")


def _update(state: TrainState, cfg: Config, options: TrainOptions, schedule: LRSchedule,
            micro_batches: list, position: tuple[int, int]) -> dict:
    """Apply step ``state.step + 1``; return its statistics (loss, nll, tokens, lr[, grad_norm])."""
    step = state.step + 1
    stats, grads = _accumulate(state, cfg, micro_batches, step, state.seed)
    if not math.isfinite(stats["loss"]):
        raise _diverged(f"the training loss is {stats['loss']}", step, state)
    if options.clip_norm is not None:
        stats["grad_norm"] = clip_grad_norm(grads, options.clip_norm)
        if not math.isfinite(stats["grad_norm"]):
            raise _diverged(f"the gradient norm is {stats['grad_norm']}", step, state)
    stats["lr"] = schedule(step)
    with _interrupts_deferred():
        state.optimizer.update(state.params, grads, stats["lr"])
        state.step = step
        state.epoch, state.batches_done = position
        state.tokens += stats["tokens"]
    return stats


# ---- checkpoints --------------------------------------------------------------------------

def _save(state: TrainState, cfg: Config, options: TrainOptions) -> None:
    """Write a checkpoint of ``state`` (refusing non-finite parameters) and rotate old ones."""
    for name, value in state.params.items():
        if not bool(backend.xp.isfinite(value).all()):
            raise _diverged(f"parameter {name!r} holds NaN or Inf", state.step, state)
    path = checkpoint.save(
        checkpoint.checkpoint_path(options.out_dir, state.step), state.params,
        optimizer_state=state.optimizer.state_dict(), step=state.step, config=cfg.to_dict(),
        vocab_id=options.vocab_id, vocab_model=options.vocab_model,
        extra={"seed": state.seed, "epoch": state.epoch, "batches_done": state.batches_done,
               "tokens": state.tokens, "elapsed": state.elapsed, "run_meta": options.run_meta})
    checkpoint.keep_last(options.out_dir, options.keep_last)
    state.last_checkpoint = path


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
    ckpt = checkpoint.load(path)
    checkpoint.check_compatible(ckpt, cfg.to_dict(), options.vocab_id)
    _check_same_run(ckpt, options)
    params = checkpoint.params_to_device(ckpt.params)
    model.check_params(params, cfg)
    optimizer = Adam(params)
    optimizer.load_state_dict(ckpt.optimizer_state)
    extra = ckpt.extra
    return TrainState(params=params, optimizer=optimizer, seed=extra["seed"], step=ckpt.step,
                      epoch=extra["epoch"], batches_done=extra["batches_done"],
                      tokens=extra["tokens"], elapsed=extra["elapsed"], last_checkpoint=path)


def _start(cfg: Config, options: TrainOptions, params: dict | None) -> TrainState:
    """The latest checkpoint of ``out_dir`` when resuming, else a fresh state."""
    latest = checkpoint.latest(options.out_dir) if options.out_dir else None
    if latest and not options.resume:
        raise FileExistsError(
            f"{options.out_dir} already holds checkpoints of a run (latest: {latest}): resume it "
            f"(resume=True, --resume) or choose another output directory")
    if latest:
        state = _resume(cfg, options, latest)
        _say(options, f"resuming from {latest} (step {state.step})")
    else:
        if options.resume:
            _say(options, f"no checkpoint in {options.out_dir}: starting from scratch")
        params = model.init_params(cfg, options.seed) if params is None else params
        model.check_params(params, cfg)
        state = TrainState(params=params, optimizer=Adam(params), seed=options.seed)
    if options.out_dir:
        os.makedirs(options.out_dir, exist_ok=True)
        _truncate_log(os.path.join(options.out_dir, LOG_NAME), state.step)
    return state


# ---- log ----------------------------------------------------------------------------------

def _say(options: TrainOptions, text: str) -> None:
    if options.progress:
        tqdm.write(text)


def _append_log(options: TrainOptions, record: dict) -> None:
    if options.out_dir:
        with open(os.path.join(options.out_dir, LOG_NAME), "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def _logged_step(line: str) -> int | None:
    """The step of a log line, or None for a line a crash cut short."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def _truncate_log(path: str, step: int) -> None:
    """Drop log lines after ``step``: a resumed run rewrites the steps lost since its checkpoint."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f
                 if (logged := _logged_step(line)) is not None and logged <= step]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)


def _due(step: int, every: int, last: int) -> bool:
    return step == last or (every > 0 and step % every == 0)


# ---- the loop -----------------------------------------------------------------------------

def train(cfg: Config, batches: Batches, options: TrainOptions, *, params: dict | None = None,
          valid_batches: Iterable[Batch] | None = None,
          valid_metric: ValidMetric | None = None) -> TrainState:
    """Train for ``options.steps`` updates; return the final :class:`TrainState`.

    batches: ``batches(epoch)`` yielding ``(src, tgt)`` batches in an order fixed by the seed and
        the epoch, or a list of batches (read again every epoch).
    params: initial parameters, trained in place (default: ``init_params(cfg, options.seed)``);
        ignored when resuming from a checkpoint.
    valid_batches: a list of batches for the validation loss and perplexity.
    valid_metric: ``valid_metric(params, cfg) -> {"valid_acc": ...}`` or ``{"valid_bleu": ...}``,
        called at each validation.
    """
    state = _start(cfg, options, params)
    if state.step >= options.steps:
        _say(options, f"nothing to do: the run is at step {state.step} of {options.steps}")
        return state
    schedule = LRSchedule(cfg.d_model, options.warmup, options.lr_factor)
    validating = valid_batches is not None or valid_metric is not None
    stream = _batch_stream(batches, state.epoch, state.batches_done)
    window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "seconds": 0.0}
    session_start, elapsed_before = time.perf_counter(), state.elapsed
    bar = tqdm(total=options.steps, initial=state.step, disable=not options.progress,
               unit="step", dynamic_ncols=True)
    try:
        while state.step < options.steps:
            started = time.perf_counter()
            taken = list(itertools.islice(stream, options.update_freq))
            micro_batches = [(backend.to_device(src), backend.to_device(tgt))
                             for _, _, (src, tgt) in taken]
            stats = _update(state, cfg, options, schedule, micro_batches, taken[-1][:2])
            window["seconds"] += time.perf_counter() - started
            state.elapsed = elapsed_before + time.perf_counter() - session_start
            for key in ("loss", "nll"):
                window[key] += stats[key] * stats["tokens"]
            window["tokens"] += stats["tokens"]
            bar.update(1)
            if _due(state.step, options.log_every, options.steps):
                _log_step(state, stats, window, options, bar)
                window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "seconds": 0.0}
            out_of_time = options.time_limit is not None and state.elapsed >= options.time_limit
            if validating and (out_of_time or _due(state.step, options.valid_every, options.steps)):
                _validate(state, cfg, options, valid_batches, valid_metric)
            if options.out_dir and (out_of_time or _due(state.step, options.save_every, options.steps)):
                _save(state, cfg, options)
            if out_of_time:
                state.out_of_time = True
                break
    except KeyboardInterrupt:
        state.interrupted = True
        if options.out_dir and state.last_checkpoint != checkpoint.checkpoint_path(
                options.out_dir, state.step):
            _save(state, cfg, options)
        _say(options, f"interrupted at step {state.step}"
             + (f"; checkpoint {state.last_checkpoint}" if options.out_dir else ""))
    finally:
        bar.close()
    return state


def _log_step(state: TrainState, stats: dict, window: dict, options: TrainOptions, bar) -> None:
    tokens = window["tokens"]
    record = {"step": state.step, "loss": window["loss"] / tokens, "nll": window["nll"] / tokens,
              "lr": stats["lr"], "tokens": state.tokens,
              "tokens_per_s": tokens / max(window["seconds"], 1e-9),
              "elapsed": round(state.elapsed, 3)}
    if "grad_norm" in stats:
        record["grad_norm"] = stats["grad_norm"]
    _append_log(options, record)
    bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}",
                    tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)


def _validate(state: TrainState, cfg: Config, options: TrainOptions,
              valid_batches: Iterable[Batch] | None, valid_metric: ValidMetric | None) -> None:
    results = {}
    if valid_batches is not None:
        results.update(evaluate(state.params, cfg, valid_batches))
    if valid_metric is not None:
        results.update(valid_metric(state.params, cfg))
    state.valid = {"step": state.step, **results}
    _append_log(options, state.valid)
    _say(options, f"step {state.step}: " + ", ".join(
        f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
        for key, value in results.items()))
