"""The training loop shared by ``train_toy.py``, ``train_wmt.py`` and ``train_lm.py``.

One call, ``train(cfg, batches, options)``, runs ``options.steps`` updates:

    for each step k = 1, 2, ..., steps:
        take update_freq batches; count their target tokens N
        grads = sum of loss_and_grads(batch, normalizer=N)       exact gradient accumulation
        clip the global gradient norm (optional); Adam at lr = schedule(k)      (paper, 5.3)
        log (stopping with an error if the loss is NaN or Inf), validate, save when due

The update never waits for the device. Parameters, gradients and Adam's moments are flat buffers
(:mod:`minitfm.flat`), so accumulating a micro-batch, clipping and the Adam step are a few
whole-buffer operations; token counts and lengths are read from the host batches; the loss, the
gradient norm and the finite checks are read only when a log line is written (``log_every``).

The config says which model trains (``models.of(cfg)``, the registry): a translator ``Config``
the encoder-decoder Transformer on ``(src, tgt)`` batches, an ``LMConfig`` the language model on
``(x, y)`` blocks; the loop talks to the model interface (``models.base.Model``) only.
The learning rate follows the paper's schedule unless ``options.schedule`` gives another, and
``options.weight_decay`` makes Adam AdamW.

Reproducibility. The whole random state of a run is ``(seed, step)`` plus the data position:
the dropout masks of the i-th batch of step k come from ``backend.rng(seed, k, i)`` (NumPy's
generator of ``[seed, k, i]`` on the CPU; on the GPU the Philox stream keyed on them, which
creates no generator on the device: :mod:`minitfm.philox`), and ``batches(epoch)`` must yield
the same batches in the same order for the same epoch (derive any shuffling from the seed and
the epoch). A checkpoint stores the parameters, Adam's moments, the step, the seed and the
position ``(epoch, batches consumed in that epoch)``; ``resume=True`` restores them and skips
the consumed batches, so a resumed run reaches bit-identical parameters to an uninterrupted one
on the same backend (unless the batches themselves are drawn anew, as with BPE-dropout).

Time. ``time_limit`` stops the run, with a validation and a checkpoint, after the update that
exhausts it; the clock (``state.elapsed``, validation included) carries over when a run is resumed.
The schedule is called as ``schedule(step, time_fraction)``, the fraction of the time limit spent
(0 without one), so that a decay (:class:`~minitfm.optim.WarmupDecaySchedule`,
:class:`~minitfm.optim.Cooldown`) ends at the limit if that comes before ``steps``; its rate then
follows the clock, so a resumed run is not bit-identical to an uninterrupted one.
``dropout_start`` (late dropout: none early on, while the model underfits) measures the run the
same way: every dropout (``models.DROPOUTS``) is off until that fraction of the steps, or of the
time limit, has passed; ``on_dropout_start``, if given, is called once, before the batches of the
first update with dropout are read (it can start dropout in the data, e.g. BPE-dropout).
Either way the run ends, by the step count or the time limit, the last step is validated (when
there is anything to validate) and ``state.valid`` holds the results.

Failures. Ctrl-C (SIGINT), SIGTERM (``kill``, ``docker stop``, batch schedulers) and SIGHUP all
stop training the same way: the update under way is finished (never cut in half), a checkpoint of
the last completed step is saved, and ``train`` returns with ``state.interrupted`` set and
``state.stop_signal`` naming the signal. Once stopping, further signals are counted and ignored,
so a second Ctrl-C cannot cut that save short. A NaN or Inf loss, parameters that are no longer
finite, or a loss that stays above twice chance (2 ln V) for ``DIVERGED_WINDOWS`` logged windows
after the warmup raise :class:`TrainingDiverged` naming the step, before any checkpoint of the
broken state is written. A checkpoint or log line that cannot be written (disk full, file too
large, read-only file system) raises :class:`WriteFailed` naming the file, the reason and the
latest checkpoint, which is left intact. Resuming from a checkpoint of another config, vocabulary
or seed, or from a damaged file, raises ``checkpoint.CheckpointError`` saying which; nothing in
the run directory is written before those checks pass.

Workers. Started by an MPI launcher (``mpiexec -n N``; :mod:`minitfm.distributed`), N workers
with ``update_freq`` k each make every update over N*k batches with the arithmetic of one worker
with ``update_freq`` N*k. Every worker reads the same batch order and takes its k consecutive
batches of each update's N*k (``World.shard``); the gradients are normalised by the update's
target tokens over all workers (a sum of host numbers) and summed by one all-reduce of the flat
gradient buffer; the i-th batch of the update draws its dropout masks from ``rng(seed, k, i)`` on
whichever worker it lands. Rank 0's parameters, Adam's moments and position (fresh or resumed)
are broadcast at the start, and since every worker applies the same update they stay equal. The
checkpoint's position counts batches of the one global order, so a run resumes with any number
of workers. Only rank 0 reads and writes the run directory, logs, shows progress and validates.
Signals never interrupt a worker: they are gathered at the end of every update, and when any
worker received one, all stop after that update (rank 0 saves a checkpoint) and ``train``
returns on every worker with ``interrupted`` set. The time limit uses the slowest worker's clock.

Output in ``out_dir``: ``checkpoint_{step:08d}.npz`` (the last ``keep_last`` of them) and
``log.jsonl``, one JSON object per logged step (step, loss, nll, lr, tokens, tokens_per_s,
elapsed; grad_norm when clipping) or validation (step, valid_loss, valid_nll, valid_ppl and what
the ``valid_metric`` callback returns, e.g. valid_acc or valid_bleu); and ``run.json`` when
``options.run_info`` is given, written once the checks have passed.
"""

from __future__ import annotations

import contextlib
import dataclasses
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

from minitfm import backend, checkpoint, distributed, flat, models
from minitfm.models import DROPOUTS
from minitfm.models import ModelConfig as Config      # the config of any registered model
from minitfm.optim import Adam, LRSchedule, clip_grad_norm, run_progress

__all__ = ["TrainOptions", "TrainState", "TrainingDiverged", "WriteFailed", "train", "evaluate",
           "LOG_NAME", "RUN_INFO_NAME", "DIVERGED_WINDOWS"]

LOG_NAME = "log.jsonl"
RUN_INFO_NAME = "run.json"
DIVERGED_WINDOWS = 3     # logged windows above 2 ln V, after the warmup, that stop a run
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))

Batch = tuple            # (src (B, S), tgt (B, T+1)), or (x (B, T), y (B, T)) for lm: token ids
Batches = Callable[[int], Iterable[Batch]] | Iterable[Batch]
ValidMetric = Callable[[dict, Config], dict]


class TrainingDiverged(RuntimeError):
    """The loss or the parameters stopped being finite numbers, or the loss ran far off."""


class WriteFailed(RuntimeError):
    """A checkpoint or log line could not be written; the message names the intact checkpoint."""


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
    on_dropout_start: Callable[[], None] | None = None   # called once, when dropout starts
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
    run_info: dict | None = None        # JSON written to out_dir/run.json once checks pass
    progress: bool = True               # tqdm bar and validation messages on the console

    def __post_init__(self) -> None:
        for name in ("steps", "warmup", "update_freq", "log_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainOptions.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("valid_every", "save_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainOptions.{name} must be >= 0 (0: only at the end), "
                                 f"got {getattr(self, name)}")
        if not 0.0 <= self.dropout_start < 1.0:
            raise ValueError(f"TrainOptions.dropout_start must be in [0, 1), got "
                             f"{self.dropout_start}")
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
    grads: dict | None = field(default=None, repr=False)     # flat gradient buffers, reused by
    scratch: dict | None = field(default=None, repr=False)   # every update (see _accumulate)


# ---- validation ---------------------------------------------------------------------------

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


# ---- one update ---------------------------------------------------------------------------

class _StopRequests:
    """SIGINT, SIGTERM and SIGHUP while training: the first one stops the run, raised as a
    KeyboardInterrupt where it arrives, or held back to the end of a block that must not be cut
    (:meth:`held`: an update, a save). Later ones are counted and ignored: the run is stopping
    already, and they must not cut its final save short.

    ``always_held``: a signal is only recorded, never raised (the workers of a distributed run
    agree on stopping at update boundaries; see :func:`_stop_if_any_worker_asks`)."""

    def __init__(self, always_held: bool = False) -> None:
        self.signum: int | None = None
        self.ignored = 0
        self._holding = 1 if always_held else 0
        self._raised = False
        self._previous: dict = {}

    def __enter__(self) -> _StopRequests:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._receive)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def _receive(self, signum, frame) -> None:
        if self.signum is not None:
            self.ignored += 1
            return
        self.signum = signum
        if not self._holding:
            self._raised = True
            raise KeyboardInterrupt

    def stopping(self) -> None:
        """From now on every signal is ignored (the run is stopping for another reason)."""
        if self.signum is None:
            self.signum = signal.SIGINT
        self._raised = True

    @contextlib.contextmanager
    def held(self):
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
        if self.signum is not None and not self._raised and not self._holding:
            self._raised = True
            raise KeyboardInterrupt


_active_stops: _StopRequests | None = None    # the running train()'s


@contextlib.contextmanager
def _interrupts_deferred():
    """Hold back Ctrl-C (and SIGTERM, SIGHUP) until the block is done, so an update or a save is
    never cut in half; the held-back signal then raises KeyboardInterrupt."""
    if _active_stops is not None:
        with _active_stops.held():
            yield
        return
    with _StopRequests() as stops, stops.held():
        yield


def _accumulate(state: TrainState, cfg: Config, micro_batches: list, step: int,
                seed: int, *, first: int = 0, tokens: int | None = None) -> tuple[dict, dict]:
    """Loss statistics and gradients of one update, summed over its batches.

    The first batch writes its gradients into ``state.grads``, a flat buffer kept for the run;
    each further batch writes into ``state.scratch`` and is added with one whole-buffer sum.
    ``first``: the index of the first of ``micro_batches`` among the update's batches (a worker's
    share starts further on); ``tokens``: the normaliser, the target tokens of the whole update
    (default: those of ``micro_batches``).
    """
    if state.grads is None:
        state.grads = flat.zeros_like(state.params)
    trained = models.of(cfg)
    total = (sum(trained.batch_tokens(batch, cfg) for batch in micro_batches) if tokens is None
             else tokens)
    stats = {"loss": 0.0, "nll": 0.0, "tokens": total}
    for i, (src, tgt) in enumerate(micro_batches):
        if i == 1 and state.scratch is None:
            state.scratch = flat.zeros_like(state.params)
        out = state.grads if i == 0 else state.scratch
        rng = backend.rng(seed, step, first + i)    # dropout masks: a function of the seed, the
                                                    # step and the batch's place in the update
        s, _ = trained.loss_and_grads(state.params, cfg, src, tgt, rng, normalizer=total, out=out)
        stats["loss"] = stats["loss"] + s["loss"]          # 0-d arrays: read at the log line
        stats["nll"] = stats["nll"] + s["nll"]
        if i > 0:
            _add_into(state.grads, state.scratch)
    return stats, state.grads


def _add_into(total: dict, part: dict) -> None:
    """total += part, for two gradient dicts of one layout (one operation on flat buffers)."""
    buffers = flat.buffer_of(total, part)
    if buffers is not None:
        total_buffer, part_buffer = buffers
        total_buffer += part_buffer
        return
    for name, g in total.items():
        g += part[name]


def _diverged(what: str, step: int | str, state: TrainState,
              good: str | None = None) -> TrainingDiverged:
    """``step``: the step, or a phrase such as "steps 11-20" for a logged window."""
    good = state.last_checkpoint if good is None else good
    if good:
        kept = f"the last good checkpoint, {good}, is intact"
    elif state.last_checkpoint:
        kept = f"every checkpoint up to {state.last_checkpoint} was written after the loss ran off"
    else:
        kept = "no checkpoint was written"
    return TrainingDiverged(
        f"{what} at {step if isinstance(step, str) else f'step {step}'}; training stopped and "
        f"{kept}. Lower the learning rate (--lr-factor, or --lr), lengthen the warmup (--warmup) "
        f"or clip gradients (--clip-norm), then start again or resume from the last good "
        f"checkpoint")


def _time_fraction(state: TrainState, options: TrainOptions) -> float:
    """The fraction of the time limit spent before this update (0 without a limit)."""
    if options.time_limit is None:
        return 0.0
    return min(1.0, state.elapsed / options.time_limit)


def _dropout_off(step: int, time_fraction: float, options: TrainOptions) -> bool:
    """Late dropout: no dropout for the first ``options.dropout_start`` of the run, measured as
    the cool-down measures it (optim.run_progress)."""
    return run_progress(step, options.steps, time_fraction) < options.dropout_start


def _update(state: TrainState, cfg: Config, options: TrainOptions, schedule: Callable,
            taken: list, world: distributed.World) -> dict:
    """Apply step ``state.step + 1`` with the update's batches ``taken`` (``(epoch, batches
    consumed, batch)`` each, all workers' shares); return its statistics (loss, nll, tokens, lr[,
    grad_norm]). Over several workers: each works on its share, and the normaliser and the
    gradients are summed over all (loss and nll stay this worker's part until a log line)."""
    step = state.step + 1
    micro_batches = [batch for _, _, batch in world.shard(taken)]   # host arrays: see _accumulate
    first = world.rank * len(micro_batches)
    tokens = sum(models.of(cfg).batch_tokens(batch, cfg) for batch in micro_batches)
    if world.distributed:
        tokens = int(world.allreduce_numbers([tokens])[0])
    time_fraction = _time_fraction(state, options)
    if _dropout_off(step, time_fraction, options):
        cfg = dataclasses.replace(cfg, **{name: 0.0 for name in DROPOUTS})
    stats, grads = _accumulate(state, cfg, micro_batches, step, state.seed, first=first,
                               tokens=tokens)
    world.allreduce_sum(grads.buffer)            # one collective: the sum over all workers
    if options.clip_norm is not None:
        stats["grad_norm"] = clip_grad_norm(grads, options.clip_norm)   # leaves NaN/Inf alone
    stats["lr"] = schedule(step, time_fraction)
    with _interrupts_deferred():
        state.optimizer.update(state.params, grads, stats["lr"])
        state.step = step
        state.epoch, state.batches_done = taken[-1][:2]     # the position in the global order
        state.tokens += stats["tokens"]
    return stats


# ---- checkpoints --------------------------------------------------------------------------

def _write_failed(what: str, exc: OSError, state: TrainState) -> WriteFailed:
    reason = exc.strerror or str(exc)
    kept = (f"the previous checkpoint {state.last_checkpoint} is intact" if state.last_checkpoint
            else "no checkpoint of this run was written yet")
    return WriteFailed(f"cannot write {what}: {reason}; {kept}. Free space (or make the "
                       f"directory writable) and continue with --resume")


def _save(state: TrainState, cfg: Config, options: TrainOptions) -> None:
    """Write a checkpoint of ``state`` (refusing non-finite parameters) and rotate old ones."""
    path = checkpoint.checkpoint_path(options.out_dir, state.step)
    try:
        with _interrupts_deferred():
            checkpoint.save(
                path, state.params, optimizer_state=state.optimizer.state_dict(),
                step=state.step, config=cfg.to_dict(), vocab_id=options.vocab_id,
                vocab_model=options.vocab_model, kind=models.of(cfg).KIND,
                extra={"seed": state.seed, "epoch": state.epoch,
                       "batches_done": state.batches_done, "tokens": state.tokens,
                       "elapsed": state.elapsed, "run_meta": options.run_meta})
            state.last_checkpoint = path
            checkpoint.keep_last(options.out_dir, options.keep_last)
    except checkpoint.NonFiniteError as exc:
        raise _diverged(f"{exc.what} holds NaN or Inf", state.step, state) from exc
    except OSError as exc:
        raise _write_failed(f"checkpoint {path}", exc, state) from exc


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
    checkpoint.check_kind(ckpt, models.of(cfg).KIND)
    checkpoint.check_compatible(ckpt, cfg.to_dict(), options.vocab_id)
    _check_same_run(ckpt, options)
    params = flat.flatten(checkpoint.params_to_device(ckpt.params))
    models.of(cfg).check_params(params, cfg)
    optimizer = Adam(params, weight_decay=options.weight_decay)
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
        trained = models.of(cfg)
        params = trained.init_params(cfg, options.seed) if params is None else params
        trained.check_params(params, cfg)
        optimizer = Adam(params, weight_decay=options.weight_decay)
        state = TrainState(params=params, optimizer=optimizer, seed=options.seed)
    if options.out_dir:
        try:
            os.makedirs(options.out_dir, exist_ok=True)
            _truncate_log(os.path.join(options.out_dir, LOG_NAME), state.step)
            if options.run_info is not None:
                _write_run_info(os.path.join(options.out_dir, RUN_INFO_NAME), options.run_info)
        except OSError as exc:
            raise _write_failed(f"the run directory {options.out_dir} ({exc.filename})", exc,
                                state) from exc
    return state


def _for_this_worker(options: TrainOptions, world: distributed.World) -> TrainOptions:
    """``options`` as rank 0 uses them; the other workers write no file (checkpoints, log,
    run.json) and show nothing: they take rank 0's state (:func:`_share_state`)."""
    if world.is_root:
        return options
    return dataclasses.replace(options, out_dir=None, resume=False, run_info=None, progress=False)


def _share_state(state: TrainState, world: distributed.World) -> None:
    """Every worker continues from rank 0's state, fresh or resumed: its parameters, Adam's
    moments and step, the data position, the token count and the clock."""
    if not world.distributed:
        return
    world.broadcast_params(state.params)
    world.broadcast_params(state.optimizer.m)
    world.broadcast_params(state.optimizer.v)
    numbers = world.broadcast_numbers([state.step, state.optimizer.step, state.epoch,
                                       state.batches_done, state.tokens, state.elapsed])
    (state.step, state.optimizer.step, state.epoch, state.batches_done,
     state.tokens) = (int(n) for n in numbers[:5])
    state.elapsed = numbers[5]


def _write_run_info(path: str, info: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(info, indent=1) + "\n")
    os.replace(tmp, path)


# ---- log ----------------------------------------------------------------------------------

def _say(options: TrainOptions, text: str) -> None:
    if options.progress:
        tqdm.write(text)


def _append_log(options: TrainOptions, record: dict, state: TrainState) -> None:
    if not options.out_dir:
        return
    path = os.path.join(options.out_dir, LOG_NAME)
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as exc:
        raise _write_failed(f"the log {path}", exc, state) from exc


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
    world = distributed.world()
    options = _for_this_worker(options, world)
    state = _start(cfg, options, params)
    _share_state(state, world)
    if state.step >= options.steps:
        _say(options, f"nothing to do: the run is at step {state.step} of {options.steps}")
        return state
    global _active_stops
    schedule = options.schedule or LRSchedule(cfg.d_model, options.warmup, options.lr_factor)
    validating = world.is_root and (valid_batches is not None or valid_metric is not None)
    stream = _batch_stream(batches, state.epoch, state.batches_done)
    dropout_waits = options.on_dropout_start is not None
    per_update = options.update_freq * world.size        # batches of the global order per update
    window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "seconds": 0.0, "steps": 0}
    session_start, elapsed_before = time.perf_counter(), state.elapsed
    watch = _DivergenceWatch(cfg, options, state)
    bar = tqdm(total=options.steps, initial=state.step, disable=not options.progress,
               unit="step", dynamic_ncols=True)
    with _StopRequests(always_held=world.distributed) as stops:
        _active_stops = stops
        try:
            while state.step < options.steps:
                started = time.perf_counter()
                if dropout_waits and not _dropout_off(state.step + 1,
                                                      _time_fraction(state, options), options):
                    options.on_dropout_start()      # before this update's batches are read
                    dropout_waits = False
                taken = list(itertools.islice(stream, per_update))
                stats = _update(state, cfg, options, schedule, taken, world)
                window["seconds"] += time.perf_counter() - started
                state.elapsed = elapsed_before + time.perf_counter() - session_start
                if world.distributed:                # the time limit: the slowest worker's clock
                    state.elapsed = world.allreduce_numbers([state.elapsed], "max")[0]
                for key in ("loss", "nll"):
                    window[key] += stats[key] * stats["tokens"]
                window["tokens"] += stats["tokens"]
                window["steps"] += 1
                bar.update(1)
                if _due(state.step, options.log_every, options.steps):
                    watch.check(_log_step(state, stats, window, options, bar, world))
                    window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "seconds": 0.0, "steps": 0}
                out_of_time = options.time_limit is not None and state.elapsed >= options.time_limit
                if validating and (out_of_time
                                   or _due(state.step, options.valid_every, options.steps)):
                    _validate(state, cfg, options, valid_batches, valid_metric)
                if options.out_dir and (out_of_time
                                        or _due(state.step, options.save_every, options.steps)):
                    _save(state, cfg, options)
                    watch.saved()
                if world.distributed:
                    _stop_if_any_worker_asks(world, stops)
                if out_of_time:
                    state.out_of_time = True
                    break
        except KeyboardInterrupt as interrupt:
            agreed = interrupt.requests if isinstance(interrupt, _AgreedStop) else {}
            if world.distributed and not agreed:
                raise       # raised in this worker's code alone: fail_together ends all workers
            stops.stopping()                # from here on, further signals are ignored
            state.interrupted, state.stop_signal = True, stops.signum
            if options.out_dir and state.last_checkpoint != checkpoint.checkpoint_path(
                    options.out_dir, state.step):
                _save(state, cfg, options)
            how = ("interrupted" if state.stop_signal == signal.SIGINT
                   else f"stopped by {signal.Signals(state.stop_signal).name}")
            _say(options, f"{how} at step {state.step}"
                 + (f" ({distributed.describe_stops(agreed)})" if agreed else "")
                 + (f"; checkpoint {state.last_checkpoint}" if options.out_dir else ""))
        finally:
            _active_stops = None
            bar.close()
    return state


def _stop_if_any_worker_asks(world: distributed.World, stops: _StopRequests) -> None:
    """At the end of an update, its validation and save: gather every worker's signal, if any.
    When some worker received one, all raise :class:`_AgreedStop` here, together, each taking
    the signal of the first worker that asked unless it received one itself."""
    requests = world.stop_requests(stops.signum or 0)
    if requests:
        if stops.signum is None:
            stops.signum = requests[min(requests)]
        raise _AgreedStop(requests)


class _AgreedStop(KeyboardInterrupt):
    """Every worker stops at this update boundary; ``requests``: ``{rank: signal}``."""

    def __init__(self, requests: dict[int, int]) -> None:
        super().__init__(distributed.describe_stops(requests))
        self.requests = requests


class _DivergenceWatch:
    """Stops a run whose loss stays far above chance: above 2 ln V (a model that guesses
    uniformly scores ln V) for ``DIVERGED_WINDOWS`` logged windows in a row after the warmup.
    NaN and Inf are caught at once by the update; this catches the finite blow-ups."""

    def __init__(self, cfg: Config, options: TrainOptions, state: TrainState) -> None:
        self.limit = 2.0 * math.log(models.of(cfg).output_vocab(cfg))
        self.warmup, self.state = options.warmup, state
        self.high = 0                             # windows in a row above the limit
        self.good_checkpoint = state.last_checkpoint

    def check(self, loss: float) -> None:
        if self.state.step <= self.warmup or loss <= self.limit:
            self.high = 0
            return
        self.high += 1
        if self.high >= DIVERGED_WINDOWS:
            raise _diverged(
                f"the training loss has stayed above 2 ln V = {self.limit:.2f} (twice chance) "
                f"for {self.high} logged windows after the warmup, at {loss:.4g} per token",
                self.state.step, self.state, good=self.good_checkpoint or "")

    def saved(self) -> None:
        if self.high == 0:
            self.good_checkpoint = self.state.last_checkpoint


def _log_step(state: TrainState, stats: dict, window: dict, options: TrainOptions, bar,
              world: distributed.World) -> float:
    """Append the log line of the window that ends now; return its loss per token (the same on
    every worker)."""
    tokens = window["tokens"]                                   # all workers' already
    read = [window["loss"], window["nll"]] + ([stats["grad_norm"]] if "grad_norm" in stats else [])
    sums = [float(v) for v in backend.to_host_together(*read)]  # wait for them here, once
    grad_norm = sums.pop() if "grad_norm" in stats else None
    if world.distributed:
        sums = world.allreduce_numbers(sums)                    # this worker's part: sum them
    loss, nll = sums[0] / tokens, sums[1] / tokens
    if not (math.isfinite(loss) and math.isfinite(nll)):
        first = state.step - window["steps"] + 1
        when = f"step {state.step}" if first == state.step else f"steps {first}-{state.step}"
        raise _diverged(f"the training loss is {loss}", when, state)
    if grad_norm is not None and not math.isfinite(grad_norm):
        raise _diverged(f"the gradient norm is {grad_norm}", f"step {state.step}", state)
    record = {"step": state.step, "loss": loss, "nll": nll,
              "lr": stats["lr"], "tokens": state.tokens,
              "tokens_per_s": tokens / max(window["seconds"], 1e-9),
              "elapsed": round(state.elapsed, 3)}
    if grad_norm is not None:
        record["grad_norm"] = grad_norm
    _append_log(options, record, state)
    bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}",
                    tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
    return record["loss"]


def _validate(state: TrainState, cfg: Config, options: TrainOptions,
              valid_batches: Iterable[Batch] | None, valid_metric: ValidMetric | None) -> None:
    results = {}
    if valid_batches is not None:
        results.update(evaluate(state.params, cfg, valid_batches))
    if valid_metric is not None:
        results.update(valid_metric(state.params, cfg))
    state.valid = {"step": state.step, **results}
    _append_log(options, state.valid, state)
    _say(options, f"step {state.step}: " + ", ".join(
        f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
        for key, value in results.items()))
