"""``python -m minitfm.learn train``: the copy task trained on the learner's passing exercises
in place of the library's code, beside the same run on the library's code from the same seed.

Both runs are the toy model of ``train_toy.py`` (the copy task's settings: 300 updates of 64
sequences of 10 symbols), on NumPy's plain code in float32, one after the other in this process:
first the library's, then the learner's, with every passing exercise's functions put in the
library's modules for the run (in memory: nothing is written into the package). The learner's
backward passes may leave the gradient rule's ``out`` arrays alone: what they return is written
there (added, for the embedding's table, which accumulates its uses). The two loss curves are
printed side by side; where the learner's code computes what the library's does, they agree
within float32 rounding, and both decode the held-out sequences to the same exact match.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import math
import time
import traceback
from pathlib import Path

import numpy

from minitfm import backend, exits, fused, optim, placement, rows, tasks
from minitfm.commands.train_toy import TASK_DEFAULTS
from minitfm.decode import greedy
from minitfm.learn import diagnose
from minitfm.learn.exercises import EXERCISES, Exercise
from minitfm.learn.learner import load, substituted, where_in
from minitfm.models import translator

__all__ = ["main", "train", "LearnerCode", "OUT_PARAMETERS", "copy_config"]

OUT_PARAMETERS = ("out", "dq_out", "dk_out", "dv_out")
ACCUMULATES = {"embedding": ("table",), "inputs": ("table",)}
LOG_EVERY = 25


def adapted(ex: Exercise, library_fn, fn):
    """The learner's ``fn`` standing for the library's ``library_fn``: called as the library's
    is, then what it returns written (or added) into the gradient rule's out arrays where it
    did not write there itself."""
    signature = inspect.signature(library_fn)
    outs = [name for name in signature.parameters if name in OUT_PARAMETERS]
    if not outs:
        return fn
    accumulate = ACCUMULATES.get(ex.name, ())

    @functools.wraps(fn)
    def run(*args, **kwargs):
        given = signature.bind(*args, **kwargs).arguments
        result = fn(*args, **kwargs)
        if given.get("out") is not None and isinstance(result, tuple) \
                and isinstance(result[-1], dict):
            result = (*result[:-1], _into(result[-1], given["out"], accumulate))
        for k, name in enumerate(("dq_out", "dk_out", "dv_out")):
            if given.get(name) is not None and result[k] is not given[name]:
                given[name][...] = result[k]
        return result
    return run


def _into(grads: dict, out: dict, accumulate: tuple) -> dict:
    written = dict(grads)
    for name, g in grads.items():
        if name in out and g is not out[name]:
            if name in accumulate:
                out[name] += g
            else:
                out[name][...] = g
            written[name] = out[name]
    return written


class LearnerCode:
    """The passing exercises' functions, put in the library's modules by :meth:`on` for a
    block; :meth:`library` puts the library's back inside it for a moment. ``schedule``: the
    learner's schedule class where the Adam exercise passes."""

    def __init__(self, workshop, exercises: list[Exercise]):
        self.swaps, self.schedule = [], optim.LRSchedule
        for ex in exercises:
            module = load(workshop.file(ex), ex.name)
            library = importlib.import_module(ex.module)
            if ex.kind == "optim":
                self.swaps.append((library, {"coefficients": module.coefficients,
                                             "adam_step": module.adam_step}))
                self.schedule = module.LRSchedule
                continue
            functions = {}
            for name in (*ex.write, *ex.keep):
                fn = getattr(module, name, None)
                if callable(fn) and not isinstance(fn, type):
                    functions[name] = adapted(ex, getattr(library, name), fn)
            self.swaps.append((library, functions))
        self.originals = [(library, {name: getattr(library, name) for name in functions})
                          for library, functions in self.swaps]

    @contextlib.contextmanager
    def on(self):
        with self._put(self.swaps):
            yield self

    def library(self):
        """The library's own functions back, for a block inside :meth:`on`."""
        return self._put(self.originals)

    @staticmethod
    @contextlib.contextmanager
    def _put(swaps):
        with contextlib.ExitStack() as stack:
            for library, functions in swaps:
                stack.enter_context(substituted(library, functions))
            yield


def train(steps: int, seed: int, schedule_class=optim.LRSchedule, report=None) -> dict:
    """The copy task's run: the loss of every update and the held-out exact match;
    ``report(step, loss, grads, params, batch)`` before each update."""
    settings = TASK_DEFAULTS["copy"]
    vocab, length = 10, 10
    cfg = copy_config()
    params = translator.init_params(cfg, seed=seed, dtype="float32")
    adam = optim.Adam(params)
    schedule = schedule_class(cfg.d_model, settings["warmup"], settings["lr_factor"])
    batches = tasks.train_batches("copy", vocab=vocab, length=length,
                                  batch_size=settings["batch_size"], seed=seed)(0)
    losses = []
    for step in range(1, steps + 1):
        batch = next(batches)
        stats, grads = translator.loss_and_grads(params, cfg, *batch)
        losses.append(float(stats["loss"]))
        if report is not None:
            report(step, losses[-1], grads, params, batch)
        adam.update(params, grads, schedule(step))
    inputs, outputs = tasks.held_out("copy", 500, vocab=vocab, length=length, seed=seed)
    src, _ = tasks.to_batch(inputs, inputs)
    hyps = greedy(params, cfg, backend.to_device(src), max_len=length + 1)
    return {"losses": losses, "exact_match": tasks.exact_match(hyps, outputs)}


def copy_config() -> translator.Config:
    """train_toy.py's model of the copy task of 10 symbols."""
    vocab = tasks.model_vocab(10)
    return translator.PRESETS["toy"].replace(src_vocab=vocab, tgt_vocab=vocab,
                                             label_smoothing=0.1)


@contextlib.contextmanager
def plain_numpy():
    """NumPy's plain code for the block: the code the exercises are made of."""
    kernels, passes = fused.choice(), rows.state()
    placement.limit_blas_threads(1)         # the toy model's products: one thread is fastest
    with backend.using("numpy"):
        fused.use("plain")
        rows.use(False)
        try:
            yield
        finally:
            rows.use(*passes)
            fused.use(kernels)


def main(workshop, steps: int | None = None, seed: int = 0) -> int:
    steps = steps or TASK_DEFAULTS["copy"]["max_steps"]
    data = workshop.progress()
    passing = [e for e in EXERCISES if e.kind != "kernel" and workshop.state(e, data)
               == "passing"]
    layers = [e for e in EXERCISES if e.kind != "kernel"]
    print(f"the copy task, {steps} updates of {TASK_DEFAULTS['copy']['batch_size']} sequences, "
          f"seed {seed}, NumPy's plain code in float32")
    print(f"your code: {', '.join(e.name for e in passing) or 'none yet'} ({len(passing)} of "
          f"{len(layers)}); the library's for the rest", flush=True)
    code = LearnerCode(workshop, passing)
    with plain_numpy():
        started = time.perf_counter()
        library = train(steps, seed)
        print(f"the library's run: {time.perf_counter() - started:.1f} s; then yours, with the "
              f"library's code on your parameters at every {LOG_EVERY}th update", flush=True)
        print(f"{'update':>6}  {'library':>10}  {'yours':>10}  {'the library on yours':>20}  "
              f"its gradients' difference", flush=True)
        worst = []

        def report(step, loss, grads, params, batch):
            if step % LOG_EVERY and step != 1:
                return
            with code.library():
                same, right = translator.loss_and_grads(params, copy_config(), *batch)
            apart = (_difference(loss, float(same["loss"])),
                     diagnose.distance(_flat(grads), _flat(right)))
            worst.append(max(apart))
            print(f"{step:>6}  {library['losses'][step - 1]:>10.6f}  {loss:>10.6f}  "
                  f"{float(same['loss']):>20.6f}  {apart[1]:.1e}", flush=True)
        with code.on():
            try:
                yours = train(steps, seed, code.schedule, report)
            except Exception as exc:
                print(where_in(exc, _file_of(exc, workshop, passing)))
                return exits.FAILED
    print(f"exact match on 500 held-out sequences: the library's {100 * library['exact_match']:.1f}"
          f" %, yours {100 * yours['exact_match']:.1f} %")
    if max(worst) <= SAME:
        apart = max(_difference(a, b) for a, b in zip(yours["losses"], library["losses"]))
        print(f"your code computes the library's losses and gradients within float32 rounding "
              f"(at most {max(worst):.1e} apart on the same parameters)" +
              (", and its run is the library's bit for bit" if apart == 0 else
               f"; the two runs part by up to {apart:.1e}, as float32 rounding grows over "
               f"the updates"))
        return exits.DONE
    first = next(k for k, w in enumerate(worst) if w > SAME)
    print(f"your code parts from the library's on the same parameters (by {worst[first]:.1e} at "
          f"the {'first' if first == 0 else f'{first * LOG_EVERY}th'} update): one of your "
          f"passing exercises computes something else in float32, or on these sizes, than in "
          f"its float64 check")
    return exits.FAILED


SAME = 1e-4         # float32 rounding of a loss or of a gradient, relative


def _flat(grads: dict):
    return numpy.concatenate([numpy.ravel(backend.to_host(g)) for g in grads.values()])


def _difference(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(b), 1e-12)


def _file_of(exc, workshop, exercises):
    """The learner's file an exception came from (the last of theirs in its frames)."""
    files = {workshop.file(e).resolve(): workshop.file(e) for e in exercises}
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if Path(frame.filename).resolve() in files:
            return files[Path(frame.filename).resolve()]
    return Path("?")
