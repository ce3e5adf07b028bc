"""The training loop shared by ``train_toy.py``, ``train_wmt.py`` and ``train_lm.py``.

One call, ``train(cfg, batches, options)``, runs ``options.steps`` updates:

    for each step k = 1, 2, ..., steps:
        take update_freq batches; count their target tokens N
        grads = sum of loss_and_grads(batch, normalizer=N)       exact gradient accumulation
        clip the global gradient norm (optional); Adam at lr = schedule(k)      (paper, 5.3)
        log (stopping with an error if the loss is NaN or Inf), validate, save when due

Under mixed precision (``--precision fp16``, minitfm.mixed) the products read a float16 copy of
the parameters made for the update, the loss is scaled, and the gradients are unscaled, checked
and the update skipped on the device when they overflowed (``state.scaler``, minitfm.gradscale).

The update never waits for the device. Parameters, gradients and Adam's moments are flat buffers
(:mod:`minitfm.flat`), so accumulating a micro-batch, clipping and the Adam step are a few
whole-buffer operations; token counts and lengths are read from the host batches; the loss, the
gradient norm and the finite checks are read only when a log line is written (``log_every``).

The config says which model trains (``models.of(cfg)``, the registry): a translator ``Config``
the encoder-decoder Transformer on ``(src, tgt)`` batches, an ``LMConfig`` the language model on
``(x, y)`` blocks; the loop talks to the model interface (``models.base.Model``) only.
The learning rate follows the paper's schedule unless ``options.schedule`` gives another, and
``options.weight_decay`` makes Adam AdamW. Around the loop, each in its own module:
:mod:`minitfm.trainstate` (the options, the state, a fresh start or a resume, the checkpoints),
:mod:`minitfm.rundir` (the files of ``out_dir``: checkpoints, ``log.jsonl``, ``run.json``),
:mod:`minitfm.stops` (signals) and :mod:`minitfm.divergence` (a loss that ran off).

Reproducibility. The whole random state of a run is ``(seed, step)`` plus the data position:
the dropout masks of the i-th batch of step k come from ``backend.rng(seed, k, i)`` (NumPy's
generator of ``[seed, k, i]`` on the CPU; on the GPU the Philox stream keyed on them, which
creates no generator on the device: :mod:`minitfm.philox`), and ``batches(epoch)`` must yield
the same batches in the same order for the same epoch (derive any shuffling from the seed and
the epoch). ``resume=True`` restores a checkpoint and skips the consumed batches, so a resumed
run reaches bit-identical parameters to an uninterrupted one on the same backend (unless the
batches themselves are drawn anew, as with BPE-dropout).

Time. ``time_limit`` stops the run, with a validation and a checkpoint, after the update that
exhausts it; the clock (``state.elapsed``, validation included) carries over when a run is resumed.
The schedule is called as ``schedule(step, time_fraction)``, the fraction of the time limit spent
(0 without one), so that a decay (:class:`~minitfm.optim.WarmupDecaySchedule`,
:class:`~minitfm.optim.Cooldown`) ends at the limit if that comes before ``steps``; its rate then
follows the clock, so a resumed run is not bit-identical to an uninterrupted one.
``dropout_start`` (late dropout: none early on, while the model underfits) measures the run the
same way: every dropout (``models.DROPOUTS``) is off until that fraction of the steps, or of the
time limit, has passed; ``dropout_start_step`` counts updates instead, the same on any machine;
``dropout_start_auto`` (a margin) starts dropout after the first validation whose perplexity
improved by less than that margin on the previous one (the step is logged and kept in the
checkpoints). ``on_dropout_start``, if given, is called once, before the batches of the
first update with dropout are read (it can start dropout in the data, e.g. BPE-dropout).
Either way the run ends, by the step count or the time limit, the last step is validated (when
there is anything to validate) and ``state.valid`` holds the results.

Choosing by validation (:mod:`minitfm.validation`). With ``best_metric`` (a key of the
validation results, its direction implied: ``valid_loss`` lower, ``valid_bleu`` higher), every
validation is judged against the best so far, saves a checkpoint (which records its results),
and its log line carries the best value and its step; ``checkpoint_best.npz`` names the best
checkpoint, ``keep_best`` spares the best few from rotation, ``run.json`` holds the best, and
``patience`` ends the run, as a success (``state.out_of_patience``), after that many validations
without improvement. The record of all this is in every checkpoint: a resumed run judges, keeps
and stops exactly as an uninterrupted one (a validation a signal cut short is made on resume).

Failures. A signal (Ctrl-C, SIGTERM, SIGHUP) lets the update under way finish, a checkpoint of
the last completed step is saved, and ``train`` returns with ``state.interrupted`` set and
``state.stop_signal`` naming the signal. A NaN or Inf loss, non-finite parameters or a loss far
above chance raise :class:`TrainingDiverged` naming the step, before any checkpoint of the broken
state is written; a file that cannot be written raises :class:`WriteFailed`.

Workers. Started by an MPI launcher (``mpiexec -n N``; :mod:`minitfm.distributed`), N workers
with ``update_freq`` k each make every update over N*k batches with the arithmetic of one worker
with ``update_freq`` N*k. Every worker reads the same batch order and takes its k consecutive
batches of each update's N*k (``World.shard``); the gradients are normalised by the update's
target tokens over all workers (a sum of host numbers) and summed by one all-reduce of the flat
gradient buffer; the i-th batch of the update draws its dropout masks from ``rng(seed, k, i)`` on
whichever worker it lands. Since every worker starts from rank 0's state and applies the same
update, they stay equal. Only rank 0 writes the run directory, logs, shows progress and
validates. Signals are gathered at the end of every update; when any worker received one, all
stop after that update. The time limit uses the slowest worker's clock.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Iterator

from tqdm import tqdm

from minitfm import backend, distributed, flat, mixed, models
from minitfm.divergence import DIVERGED_WINDOWS, DivergenceWatch, TrainingDiverged, check_finite
from minitfm.models import DROPOUTS
from minitfm.models import ModelConfig as Config      # the config of any registered model
from minitfm.gradscale import clip_grad_norm
from minitfm.optim import LRSchedule, run_progress
from minitfm.rundir import LOG_NAME, RUN_INFO_NAME, RunDirectory, WriteFailed
from minitfm.stops import (AgreedStop, StopRequests, describe_signal, interrupts_deferred,
                           stop_if_any_worker_asks)
from minitfm.trainstate import TrainOptions, TrainState, for_this_worker, save, say, share, start
from minitfm.validating import (Batch, ValidMetric, check_options, cut_short, due, evaluate,
                                validate_and_save)

__all__ = ["TrainOptions", "TrainState", "TrainingDiverged", "WriteFailed", "train", "evaluate",
           "LOG_NAME", "RUN_INFO_NAME", "DIVERGED_WINDOWS"]

Batches = Callable[[int], Iterable[Batch]] | Iterable[Batch]


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
        s, _ = trained.loss_and_grads(state.params, cfg, src, tgt, rng, normalizer=total, out=out,
                                      **({} if state.scaler is None
                                         else {"loss_scale": state.scaler.scale}))
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


def _time_fraction(state: TrainState, options: TrainOptions) -> float:
    """The fraction of the time limit spent before this update (0 without a limit)."""
    if options.time_limit is None:
        return 0.0
    return min(1.0, state.elapsed / options.time_limit)


def _dropout_off(step: int, time_fraction: float, options: TrainOptions,
                 started: int | None = None) -> bool:
    """Late dropout: no dropout for the first ``options.dropout_start`` of the run, measured as
    the cool-down measures it (optim.run_progress); or for the first ``dropout_start_step``
    updates; or, with ``dropout_start_auto``, before update ``started`` (the validation record's
    ``dropout_from``; None: not yet)."""
    if options.dropout_start_auto is not None:
        return started is None or step < started
    if options.dropout_start_step:
        return step <= options.dropout_start_step
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
    if _dropout_off(step, time_fraction, options, state.record.dropout_from):
        cfg = dataclasses.replace(cfg, **{name: 0.0 for name in DROPOUTS})
    with mixed.half_copies(state.params):        # fp16: the products' copy of the parameters
        stats, grads = _accumulate(state, cfg, micro_batches, step, state.seed, first=first,
                                   tokens=tokens)
    world.allreduce_sum(grads.buffer)            # one collective: the sum over all workers
    if state.scaler is not None:                 # fp16: g / S, clipped; S updated, on the device
        norm = state.scaler.unscale(grads, options.clip_norm)
        if options.clip_norm is not None:
            stats["grad_norm"] = norm
    elif options.clip_norm is not None:
        stats["grad_norm"] = clip_grad_norm(grads, options.clip_norm)   # leaves NaN/Inf alone
    stats["lr"] = schedule(step, time_fraction)
    with interrupts_deferred():
        state.optimizer.update(state.params, grads, stats["lr"], state.scaler)
        state.step = step
        state.epoch, state.batches_done = taken[-1][:2]     # the position in the global order
        state.tokens += stats["tokens"]
    return stats


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

    ``options.out_dir`` is taken (locked: one run per directory) for the call, unless this process
    holds it already (``RunDirectory.open``, e.g. with ``lock=False`` where files cannot be locked).
    """
    world = distributed.world()
    options = for_this_worker(options, world)
    if world.is_root:
        check_options(options, valid_batches, valid_metric)
    run_dir = RunDirectory.open(options.out_dir, options.keep_last) if options.out_dir else None
    try:
        return _train(cfg, batches, options, world, run_dir, params, valid_batches, valid_metric)
    finally:
        if run_dir:
            run_dir.close()         # the lock: released here unless the caller holds it too


def _train(cfg: Config, batches: Batches, options: TrainOptions, world: distributed.World,
           run_dir: RunDirectory | None, params: dict | None,
           valid_batches: Iterable[Batch] | None, valid_metric: ValidMetric | None) -> TrainState:
    state = start(cfg, options, params, run_dir)
    share(state, world)
    validating = world.is_root and (valid_batches is not None or valid_metric is not None)
    if (validating or not world.is_root) and cut_short(state, options):
        # a signal came before the validation of the checkpoint's step: make it now, as an
        # uninterrupted run did, and record it in that checkpoint
        validate_and_save(state, cfg, options, run_dir, world, validating, valid_batches,
                          valid_metric, save_now=run_dir is not None
                          and options.best_metric is not None)
    if state.out_of_patience:
        say(options, f"nothing to do: the run stopped at step {state.step}, "
                     f"{options.patience} validations without improvement")
        return state
    if state.step >= options.steps:
        say(options, f"nothing to do: the run is at step {state.step} of {options.steps}")
        return state
    schedule = options.schedule or LRSchedule(cfg.d_model, options.warmup, options.lr_factor)
    stream = _batch_stream(batches, state.epoch, state.batches_done)
    dropout_waits = options.on_dropout_start is not None
    per_update = options.update_freq * world.size        # batches of the global order per update
    window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "seconds": 0.0, "steps": 0}
    session_start, elapsed_before = time.perf_counter(), state.elapsed
    watch = DivergenceWatch(models.of(cfg).output_vocab(cfg), options.warmup, state)
    bar = tqdm(total=options.steps, initial=state.step, disable=not options.progress,
               unit="step", dynamic_ncols=True)
    with StopRequests(always_held=world.distributed) as stops:
        try:
            while state.step < options.steps:
                started = time.perf_counter()
                if dropout_waits and not _dropout_off(state.step + 1,
                                                      _time_fraction(state, options), options,
                                                      state.record.dropout_from):
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
                if due(state.step, options.log_every, options.steps):
                    watch.check(_log_step(state, stats, window, run_dir, bar, world))
                    window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "seconds": 0.0, "steps": 0}
                out_of_time = options.time_limit is not None and state.elapsed >= options.time_limit
                validate_now = out_of_time or due(state.step, options.valid_every, options.steps)
                save_now = run_dir is not None and (
                    out_of_time or due(state.step, options.save_every, options.steps)
                    or (validate_now and validating and options.best_metric is not None))
                if validate_now:
                    validate_and_save(state, cfg, options, run_dir, world, validating,
                                      valid_batches, valid_metric, save_now)
                elif save_now:
                    save(state, cfg, options, run_dir)
                if save_now:
                    watch.saved()
                if world.distributed:
                    stop_if_any_worker_asks(world, stops)
                if out_of_time:
                    state.out_of_time = True
                    break
                if state.out_of_patience:
                    break
        except KeyboardInterrupt as interrupt:
            agreed = interrupt.requests if isinstance(interrupt, AgreedStop) else {}
            if world.distributed and not agreed:
                raise       # raised in this worker's code alone: fail_together ends all workers
            stops.stopping()                # from here on, further signals are ignored
            state.interrupted, state.stop_signal = True, stops.signum
            if run_dir and state.last_checkpoint != run_dir.checkpoint_path(state.step):
                save(state, cfg, options, run_dir)
            say(options, f"{describe_signal(state.stop_signal)} at step {state.step}"
                 + (f" ({distributed.describe_stops(agreed)})" if agreed else "")
                 + (f"; checkpoint {state.last_checkpoint}" if run_dir else ""))
        finally:
            bar.close()
    return state


def _log_step(state: TrainState, stats: dict, window: dict, run_dir: RunDirectory | None, bar,
              world: distributed.World) -> float:
    """Append the log line of the window that ends now; return its loss per token (the same on
    every worker)."""
    tokens = window["tokens"]                                   # all workers' already
    read = [window["loss"], window["nll"]] + ([stats["grad_norm"]] if "grad_norm" in stats else [])
    scaler = [] if state.scaler is None else [state.scaler.state]
    host = backend.to_host_together(*read, *scaler)            # wait for them here, once
    scaled = host.pop() if scaler else None
    sums = [float(v) for v in host]
    grad_norm = sums.pop() if "grad_norm" in stats else None
    if scaler and scaled[3]:            # the latest update was skipped: its norm is not finite
        grad_norm = None
    if world.distributed:
        sums = world.allreduce_numbers(sums)                    # this worker's part: sum them
    loss, nll = sums[0] / tokens, sums[1] / tokens
    check_finite(loss, nll, grad_norm, window["steps"], state)
    record = {"step": state.step, "loss": loss, "nll": nll,
              "lr": stats["lr"], "tokens": state.tokens,
              "tokens_per_s": tokens / max(window["seconds"], 1e-9),
              "elapsed": round(state.elapsed, 3)}
    if grad_norm is not None:
        record["grad_norm"] = grad_norm
    if scaler:                          # the loss scale now, and the updates skipped so far
        record.update(loss_scale=float(scaled[0]), skipped=int(scaled[2]))
    if run_dir:
        run_dir.append_log(record, state.last_checkpoint)
    bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}",
                    tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
    return record["loss"]
