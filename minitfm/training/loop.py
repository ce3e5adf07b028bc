"""The training loop of ``train_toy.py``, ``train_wmt.py`` and ``train_lm.py``: the updates of a
started :class:`~minitfm.training.run.Run`, which does everything else.

    for each update k = 1, 2, ..., run.plan.steps:
        take update_freq batches (a worker's share); count the update's target tokens N
        grads = sum of loss_and_grads(batch, normalizer=N)       exact gradient accumulation
        clip the global gradient norm (optional); Adam at lr = schedule(k)      (paper, 5.3)
        then the hooks, when due: a log line (a loss that ran off stops the run), a validation,
        a checkpoint; the time limit, patience or a signal to any worker end the run

The update never waits for the device: parameters, gradients and Adam's moments are flat buffers
(:mod:`minitfm.flat`), so accumulating, clipping and Adam are a few whole-buffer operations;
token counts are read from the host batches, and the loss, the gradient norm and the finite
checks only when a log line is written. The loop never asks which model it trains: the config
does (``models.of(cfg)``). Under mixed precision (``--precision fp16``, minitfm.speed.mixed) the
products read a float16 copy of the parameters made for the update, the loss is scaled, and the
gradients are unscaled, checked and the update skipped on the device when they overflowed
(``state.scaler``, minitfm.gradscale).

Reproducibility: the dropout masks of the i-th batch of update k come from
``backend.rng(seed, k, i)``, and ``batches(epoch)`` yields the same batches in the same order for
the same epoch, so a resumed run skips the batches consumed and reaches the same parameters.

Several workers (``mpiexec -n N``): each takes its ``update_freq`` consecutive batches of every
update's N x ``update_freq`` (``World.shard``), normalised by the update's tokens over all of
them and summed by one all-reduce: one worker's update with N times the ``update_freq``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
import warnings
from collections.abc import Callable, Iterable, Iterator

from tqdm import tqdm

from minitfm import backend, flat, models
from minitfm.backend import products
from minitfm.gradscale import clip_grad_norm
from minitfm.models import DROPOUTS
from minitfm.training.divergence import DivergenceWatch
from minitfm.training.run import Run, due
from minitfm.training.state import TrainState
from minitfm.training.stops import (StopRequests, interrupts_deferred,
                                    stop_if_any_worker_asks)
from minitfm.training.validation import Batch
from minitfm.training.window import LogWindow

__all__ = ["Batches", "train", "update", "accumulate"]

Batches = Callable[[int], Iterable[Batch]] | Iterable[Batch]   # batches(epoch), or one list


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


def accumulate(state: TrainState, cfg, micro_batches: list, step: int, seed: int, *,
               first: int = 0, tokens: int | None = None) -> tuple[dict, dict]:
    """Loss statistics and gradients of one update, summed over its batches.

    The first batch writes its gradients into ``state.grads``, a flat buffer kept for the run;
    each further batch writes into ``state.scratch`` and is added with one whole-buffer sum.
    ``first``: the index of the first of ``micro_batches`` among the update's batches (a worker's
    share starts further on); ``tokens``: the normaliser, the target tokens of the whole update
    (default: those of ``micro_batches``)."""
    if state.grads is None:
        state.grads = flat.zeros_like(state.params)
    trained = models.of(cfg)
    total = sum(trained.batch_tokens(b, cfg) for b in micro_batches) if tokens is None else tokens
    stats = {"loss": 0.0, "nll": 0.0, "tokens": total}
    for i, (a, b) in enumerate(micro_batches):
        if i == 1 and state.scratch is None:
            state.scratch = flat.zeros_like(state.params)
        out = state.grads if i == 0 else state.scratch
        rng = backend.rng(seed, step, first + i)    # dropout masks: a function of the seed, the
                                                    # step and the batch's place in the update
        s, _ = trained.loss_and_grads(state.params, cfg, a, b, rng, normalizer=total, out=out,
                                      **({} if state.scaler is None
                                         else {"loss_scale": state.scaler.scale}))
        stats["loss"] = stats["loss"] + s["loss"]          # 0-d arrays: read at the log line
        stats["nll"] = stats["nll"] + s["nll"]
        if i > 0:
            flat.add_into(state.grads, state.scratch)
    return stats, state.grads


def update(run: Run, taken: list) -> dict:
    """Apply update ``run.state.step + 1`` with its batches ``taken`` (``(epoch, batches
    consumed, batch)`` each, all workers' shares); return its statistics (loss, nll, tokens, lr[,
    grad_norm]). The normaliser and the gradients are summed over all workers (loss and nll stay
    this worker's part until a log line)."""
    state, world, cfg = run.state, run.world, run.cfg
    step = state.step + 1
    micro_batches = [batch for _, _, batch in world.shard(taken)]
    tokens = sum(models.of(cfg).batch_tokens(batch, cfg) for batch in micro_batches)
    if world.distributed:
        tokens = int(world.allreduce_numbers([tokens])[0])
    time_fraction = run.time_fraction()
    if run.plan.dropout_off(step, time_fraction, state.record.dropout_from):
        cfg = dataclasses.replace(cfg, **{name: 0.0 for name in DROPOUTS})
    with _half_copies(state.params):             # fp16: the products' copy of the parameters
        stats, grads = accumulate(state, cfg, micro_batches, step, state.seed,
                                  first=world.rank * len(micro_batches), tokens=tokens)
    world.allreduce_sum(grads.buffer)            # one collective: the sum over all workers
    clip = run.options.clip_norm
    if state.scaler is not None:                 # fp16: g / S, clipped; S updated, on the device
        norm = state.scaler.unscale(grads, clip)
    else:
        norm = None if clip is None else clip_grad_norm(grads, clip)   # NaN/Inf left alone
    if clip is not None:
        stats["grad_norm"] = norm
    stats["lr"] = run.plan.schedule(step, time_fraction)
    with interrupts_deferred():
        state.optimizer.update(state.params, grads, stats["lr"], state.scaler)
        state.step = step
        state.epoch, state.batches_done = taken[-1][:2]     # the position in the global order
        state.tokens += stats["tokens"]
    return stats


def train(run: Run, batches: Batches) -> TrainState:
    """Make the started ``run``'s updates from ``batches`` (``batches(epoch)`` in an order fixed
    by the seed and the epoch, or a list read again every epoch); return its state.

    NumPy's floating-point warnings ("invalid value encountered in divide") are not shown while
    it trains: they come from updates that run off, which the divergence watch reports with the
    step, the intact checkpoint and the fix. Memory that runs out, in an update or a validation,
    ends the run with a ``MemoryError`` that names the checkpoint kept (Run.out_of_memory)."""
    try:
        return _train(run, batches)
    except MemoryError as exc:
        raise run.out_of_memory(exc) from exc


def _train(run: Run, batches: Batches) -> TrainState:
    state, world, steps = run.state, run.world, run.plan.steps
    if (run.validating or not world.is_root) and run.cut_short():
        # a signal came before the validation of the checkpoint's step: make it now, as an
        # uninterrupted run did, and record it in that checkpoint
        run.validate(save_now=run.run_dir is not None and run.options.best_metric is not None)
    if state.out_of_patience:
        run.say(f"nothing to do: the run stopped at step {state.step}, "
                f"{run.options.patience} validations without improvement")
        return state
    if state.step >= steps:
        run.say(f"nothing to do: the run is at step {state.step} of {steps}")
        return state
    stream = _batch_stream(batches, state.epoch, state.batches_done)
    watch = DivergenceWatch(models.of(run.cfg).output_vocab(run.cfg), run.options.warmup, state)
    window = LogWindow()
    dropout_waits = run.on_dropout_start is not None
    session_start, elapsed_before = time.perf_counter(), state.elapsed
    bar = tqdm(total=steps, initial=state.step, disable=not run.options.progress, unit="step",
               dynamic_ncols=True)
    with StopRequests(always_held=world.distributed) as stops, bar, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            while state.step < steps and not (state.out_of_time or state.out_of_patience):
                started = time.perf_counter()
                if dropout_waits and not run.plan.dropout_off(
                        state.step + 1, run.time_fraction(), state.record.dropout_from):
                    run.on_dropout_start()      # before this update's batches are read
                    dropout_waits = False
                taken = list(itertools.islice(stream, run.options.update_freq * world.size))
                stats = update(run, taken)
                window.add(stats, time.perf_counter() - started)
                state.elapsed = elapsed_before + time.perf_counter() - session_start
                if world.distributed:                # the time limit: the slowest worker's clock
                    state.elapsed = world.allreduce_numbers([state.elapsed], "max")[0]
                bar.update(1)
                _hooks(run, stats, window, watch, bar, stops)
        except KeyboardInterrupt as interrupt:
            run.stop(interrupt, stops)
    return state


def _hooks(run: Run, stats: dict, window: LogWindow, watch: DivergenceWatch, bar,
           stops: StopRequests) -> None:
    """What is due at the end of an update: the log line, the validation and the checkpoint,
    the time limit, and a stop any worker asks for."""
    state, options, steps = run.state, run.options, run.plan.steps
    if due(state.step, options.log_every, steps):
        watch.check(window.log(run, stats, bar))
    out_of_time = options.time_limit is not None and state.elapsed >= options.time_limit
    validate_now = out_of_time or due(state.step, options.valid_every, steps)
    save_now = run.run_dir is not None and (
        out_of_time or due(state.step, options.save_every, steps)
        or (validate_now and run.validating and options.best_metric is not None))
    if validate_now:
        run.validate(save_now)
    elif save_now:
        run.save()
    if save_now:
        watch.saved()
    if run.world.distributed:
        stop_if_any_worker_asks(run.world, stops)
    stops.raise_if_lost()
    state.out_of_time = out_of_time


def _half_copies(params):
    """Under ``--precision fp16`` the float16 copy of ``params`` for the update's products
    (:func:`minitfm.speed.mixed.half_copies`, imported only then); else nothing."""
    if products.precision() != "fp16":
        return contextlib.nullcontext()
    from minitfm.speed import mixed        # the float16 products: a fast path's machinery
    return mixed.half_copies(params)
