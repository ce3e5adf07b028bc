"""``python -m minitfm.learn train``: the copy task trained on the learner's passing exercises
in place of the library's code, beside the same run on the library's code from the same seed.

Both runs are the toy model of ``train_toy.py`` (the copy task's settings: 300 updates of 64
sequences of 10 symbols), on NumPy's plain code in float32. The library's runs here; the
learner's in a process of its own (:mod:`minitfm.learn.worker`), with every passing exercise's
functions put in the library's modules there (nothing is written into the package), under a
time limit. The learner's backward passes may leave the gradient rule's ``out`` arrays alone:
what they return is written there (added, for the embedding's table, which accumulates its
uses). Every 25th update the learner's run sends its parameters, batch, loss and gradients, and
the library's code computes the same update here, on those parameters: the two agree within
float32 rounding where the learner's code computes what the library's does. Where they part, each
passing exercise is tried alone on that update (in a process of its own again), and the ones that
part are named, with the gradients that differ most.

Which code ran is said as it is: the exercises whose code is the learner's, and the rest, the
library's; with no exercise passing there is nothing of the learner's to train, and the command
says so and how to get one, and the command ends with a failure status.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import math
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy

from minitfm import backend, optim, tasks
from minitfm.decoding.decode import greedy
from minitfm.speed import fused, rows
from minitfm.workers import placement
from minitfm.learn import diagnose, worker
from minitfm.learn.exercise import Exercise
from minitfm.learn.exercises import EXERCISES, by_name
from minitfm.learn.learner import load, substituted, where_in
from minitfm.models import translator

__all__ = ["train_and_compare", "train", "LearnerCode", "OUT_PARAMETERS", "copy_config",
           "plain_numpy", "COPY"]

OUT_PARAMETERS = ("out", "dq_out", "dk_out", "dv_out")
ACCUMULATES = {"embedding": ("table",), "inputs": ("table",)}
LOG_EVERY = 25
FLOAT32_APART = 1e-4    # relative: two float32 computations of a loss or a gradient apart by
                        # rounding alone stay within it
# the copy task's settings, train_toy.py's (tests/learn/test_train.py holds the two equal)
COPY = dict(max_steps=300, batch_size=64, lr_factor=0.3, warmup=100)


# ---- the learner's code in the library's place (in the child) ----------------------------------

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
    """The exercises' functions, from the files ``paths`` (exercise name -> file), put in the
    library's modules by :meth:`on` for a block: the functions to write and those kept beside
    them, and a class one of whose methods is written (Adam's exercise: the schedule), not the
    other classes (a cache)."""

    def __init__(self, paths: dict):
        self.swaps = []
        for name, path in paths.items():
            ex = by_name(name)
            module = load(Path(path), ex.name)
            library = importlib.import_module(ex.module)
            written = {n.split(".")[0] for n in ex.write if "." in n}
            functions = {}
            for fn_name in (*ex.write, *ex.keep):
                fn = getattr(module, fn_name, None)
                if callable(fn) and (not isinstance(fn, type) or fn_name in written):
                    functions[fn_name] = adapted(ex, getattr(library, fn_name), fn)
            self.swaps.append((library, functions))

    @contextlib.contextmanager
    def on(self):
        with contextlib.ExitStack() as stack:
            for library, functions in self.swaps:
                stack.enter_context(substituted(library, functions))
            yield self


def train(steps: int, seed: int, report=None) -> dict:
    """The copy task's run: the loss of every update and the held-out exact match;
    ``report(step, loss, grads, params, batch)`` before each update. The schedule is the one in
    ``minitfm.optim`` at the call (the learner's, under :meth:`LearnerCode.on`)."""
    settings = COPY
    vocab, length = 10, 10
    cfg = copy_config()
    params = translator.init_params(cfg, seed=seed, dtype="float32")
    adam = optim.Adam(params)
    schedule = optim.LRSchedule(cfg.d_model, settings["warmup"], settings["lr_factor"])
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


def _file_of(exc, paths: dict) -> Path:
    """The learner's file an exception came from (the last of theirs in its frames)."""
    files = {Path(p).resolve(): Path(p) for p in paths.values()}
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if Path(frame.filename).resolve() in files:
            return files[Path(frame.filename).resolve()]
    return Path("?")


def _run_task(payload: dict, channel) -> dict:
    """The child's run on the learner's code; every 25th update (and the first) sent."""
    paths = payload["paths_by_exercise"]
    try:
        code = LearnerCode(paths)
    except Exception as exc:
        return {"error": str(exc)}

    def report(step, loss, grads, params, batch):
        if step % LOG_EVERY == 0 or step == 1:
            channel.send({"step": step, "loss": loss, "params": params, "grads": grads,
                          "batch": list(batch)})
    with plain_numpy(), code.on():
        try:
            return train(payload["steps"], payload["seed"], report)
        except Exception as exc:
            return {"error": where_in(exc, _file_of(exc, paths))}


def _probe_task(payload: dict, channel) -> dict:
    """One update (the parameters and batch sent) with each exercise's code alone in the
    library's place: its loss and gradients, by exercise."""
    found = {}
    with plain_numpy():
        for name, path in payload["paths_by_exercise"].items():
            try:
                code = LearnerCode({name: path})
                with code.on():
                    stats, grads = translator.loss_and_grads(payload["params"], copy_config(),
                                                             *payload["batch"])
                found[name] = {"loss": float(stats["loss"]), "grads": grads}
            except Exception as exc:
                found[name] = {"error": where_in(exc, Path(path))}
    return found


# ---- the command (the checking side) -----------------------------------------------------------

@dataclass
class Update:
    """One of the learner's updates sent from its run (``sent``: its step, loss, parameters,
    batch and gradients), with the library's loss and gradients on those parameters and that
    batch, and how far apart the two are (relative: the worse of the loss and the gradients)."""
    sent: dict
    loss: float
    right: dict
    apart: float


def _on_the_library(sent: dict) -> Update:
    """The library's code on the parameters and batch the learner's run sent."""
    stats, right = translator.loss_and_grads(sent["params"], copy_config(), *sent["batch"])
    loss = float(stats["loss"])
    return Update(sent, loss, right, max(_difference(sent["loss"], loss),
                                          _gradients_apart(sent["grads"], right)))


def _gradients_apart(grads, right) -> float:
    if not isinstance(grads, dict) or set(grads) != set(right) or not all(
            isinstance(g, numpy.ndarray) and g.shape == right[k].shape for k, g in grads.items()):
        return math.inf
    return diagnose.distance(_flat(grads), _flat(right))


def train_and_compare(workshop, steps: int | None = None, seed: int = 0,
                      limit: float | None = None) -> bool:
    """The command: the library's run, then the learner's beside it, said as they go; whether
    the learner's code computes what the library's does (False too where nothing of theirs
    passes, or their run fails)."""
    steps = steps or COPY["max_steps"]
    data = workshop.progress()
    layers = [e for e in EXERCISES if e.kind.trained]
    passing = [e for e in layers if workshop.state(e, data) == "passing"]
    if not passing:
        print("none of your code passes its check yet: every exercise would run the "
              "library's code, so there is nothing of yours to train. Pass an exercise first "
              "(python -m minitfm.learn start, then check or watch), then train on it.")
        return False
    library_only = [e.name for e in layers if e not in passing]
    print(f"the copy task, {steps} updates of {COPY['batch_size']} sequences, "
          f"seed {seed}, NumPy's plain code in float32")
    print(f"your code: {', '.join(e.name for e in passing)} ({len(passing)} of {len(layers)})")
    if library_only:
        print(f"the library's code: {', '.join(library_only)} (not passing yet)")
    paths = {e.name: str(workshop.file(e).resolve()) for e in passing}
    with plain_numpy():
        started = time.perf_counter()
        library = train(steps, seed)
        spent = time.perf_counter() - started
        print(f"the library's run: {spent:.1f} s; then yours, with the library's code on your "
              f"parameters at every {LOG_EVERY}th update", flush=True)
        print(f"{'update':>6}  {'library':>10}  {'yours':>10}  {'the library on yours':>20}  "
              f"its gradients' difference", flush=True)
        updates: list[Update] = []

        def row(sent):
            if not isinstance(sent, dict) or "step" not in sent:
                return
            update = _on_the_library(sent)
            updates.append(update)
            step = int(sent["step"])
            print(f"{step:>6}  {library['losses'][step - 1]:>10.6f}  {sent['loss']:>10.6f}  "
                  f"{update.loss:>20.6f}  {_gradients_apart(sent['grads'], update.right):.1e}",
                  flush=True)
        outcome = worker.run(_run_task, {"paths_by_exercise": paths,
                                         "paths": list(paths.values()), "steps": steps,
                                         "seed": seed},
                             limit=limit or 5 * spent + 60, on_message=row)
        if not outcome.done:
            print(worker.outcome_words(outcome, "the run on your code"))
            return False
        yours = outcome.value if isinstance(outcome.value, dict) else {}
        if "error" in yours:
            print(yours["error"])
            return False
        print(f"exact match on 500 held-out sequences: the library's "
              f"{100 * library['exact_match']:.1f} %, yours {100 * yours['exact_match']:.1f} %")
        parted = [update for update in updates if update.apart > FLOAT32_APART]
        if not parted:
            _agreed(passing, library_only, updates, yours, library)
            return True
        print(f"your code parts from the library's on the same parameters (by "
              f"{parted[0].apart:.1e} at update {parted[0].sent['step']}): each of your passing "
              f"exercises alone on that update:")
        _name_the_parting(paths, parted[0], limit or worker.LIMIT * 3)
        return False


def _agreed(passing, library_only, updates, yours, library) -> None:
    """Say that the learner's code computes the library's losses and gradients, and how far
    the two runs part by float32 rounding."""
    worst = max((update.apart for update in updates), default=0.0)
    gap = max(_difference(a, b) for a, b in zip(yours["losses"], library["losses"]))
    print(f"your code ({', '.join(e.name for e in passing)}) computes the library's losses and "
          f"gradients within float32 rounding (at most {worst:.1e} apart on the same "
          f"parameters)" +
          (", and its run is the library's bit for bit" if gap == 0 else
           f"; the two runs part by up to {gap:.1e}, as float32 rounding grows over the "
           f"updates") + (f"; the library's code ran for {', '.join(library_only)}"
                          if library_only else ""))


def _name_the_parting(paths: dict, update: Update, limit: float) -> None:
    """Each passing exercise alone in the library's place on the update where the runs part:
    which part, and where."""
    loss, right = update.loss, update.right
    outcome = worker.run(_probe_task, {"paths_by_exercise": paths, "paths": list(paths.values()),
                                       "params": update.sent["params"],
                                       "batch": update.sent["batch"]},
                         limit=limit)
    if not outcome.done:
        print(worker.outcome_words(outcome, "your code"))
        return
    named = 0
    for name, found in (outcome.value or {}).items():
        if "error" in found:
            print(f"  {name}: {found['error']}")
            named += 1
            continue
        grads_apart = _gradients_apart(found["grads"], right)
        loss_apart = _difference(found["loss"], loss)
        if max(grads_apart, loss_apart) <= FLOAT32_APART:
            continue
        named += 1
        print(f"  {name} ({by_name(name).filename}) parts: the loss by {loss_apart:.1e}, the "
              f"gradients by {grads_apart:.1e}; {_where(found['grads'], right)}")
    if not named:
        print("  none parts alone: together they do (an exercise that relies on another's "
              "code, or Adam's update)")
    print("an exercise's check runs float64 on its own sizes; the model runs float32 on the "
          "toy model's: code that is right for one and not the other parts here")


def _where(grads: dict, right: dict) -> str:
    """The gradients that differ most, by name."""
    if not isinstance(grads, dict):
        return "its gradients are not a dict"
    far = sorted(((diagnose.distance(grads.get(k), v), k) for k, v in right.items()),
                 reverse=True)
    wrong = [k for d, k in far if d > FLOAT32_APART]
    if not wrong:
        return "every gradient agrees: the loss alone parts"
    if len(wrong) == len(right):
        return (f"all {len(right)} gradients differ: the difference starts where the backward "
                f"pass starts (the loss, the output layer) and flows down")
    return (f"the gradients of {', '.join(wrong[:3])}" +
            (f" and {len(wrong) - 3} more" if len(wrong) > 3 else "") +
            f" differ ({len(wrong)} of {len(right)})")


def _flat(grads: dict):
    return numpy.concatenate([numpy.ravel(backend.to_host(g)).astype(numpy.float64)
                              for _, g in sorted(grads.items())])


def _difference(a: float, b: float) -> float:
    if not (isinstance(a, float) and math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(b), 1e-12)
