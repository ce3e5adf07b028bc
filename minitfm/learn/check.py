"""Checking an exercise: the learner's functions run in the library's place in a process of
their own (:mod:`minitfm.learn.worker`, :mod:`minitfm.learn.child`), and judged here, on the
checking side, where none of the learner's code ever runs. Host-only code: the checks run on
NumPy in float64, the plain code (as ``python -m minitfm.gradcheck`` runs them).

A layer exercise runs each of its cases (``minitfm.gradcheck.cases``) on the same draw twice:
here with the library's functions, giving the right gradients, and in the child with the
learner's forward and backward put in their place in the library's module, giving the
learner's. Each of the learner's gradients must be an array of real numbers of the right shape
and type, and equal to the library's (which the gradient checks hold to finite differences) to
the checks' tolerance; a wrong one gets its relative error, the first wrong element and a
diagnosis (:mod:`minitfm.learn.diagnose`). The backward may change in place only what the
library's own backward changes (the contract in layers/__init__.py: softmax's dP, the loss's
cached exponentials); anything else it changes (dy, a cache field, which a model reads again)
fails the case, named. Where every gradient is right, finite differences of the library's
forward pass along a random direction of each input confirm them. The whole model's exercise
compares every parameter's gradient with the library's and differentiates the loss along a
random direction; Adam's compares the updates and the schedule with the library's; a kernel's
runs its CUDA C on the CPU (:mod:`minitfm.learn.modelcheck`, :mod:`minitfm.learn.adamcheck`,
:mod:`minitfm.learn.kernels`): which, the exercise's kind says (:mod:`minitfm.learn.kinds`).

A run that does not end within the limit, ends itself (``sys.exit``), or crashes is reported as
such, with the learner's line where it is known, and never passes.
"""

from __future__ import annotations

import importlib
import math
import time
from pathlib import Path

import numpy

from minitfm import backend
from minitfm.gradcheck.check import STEPS, TOLERANCE, five_point, smallest_error
from minitfm.learn import diagnose, worker
from minitfm.learn.alternatives import (Alternatives, cache_of, cache_regions, edited,
                                        field_swaps, mask_regions, regroup_renamed)
from minitfm.learn.cases import (ALL_CASES, array_fault, case_problem, case_sizes, constants,
                                 gradients, reachable, run_case)
from minitfm.learn.exercise import Exercise
from minitfm.learn.learner import recorders
from minitfm.learn.report import ArrayResult, CaseResult, Report

__all__ = ["run_check", "run_in_child", "check_layer"]


# ---- what the library gives with a mistake made, for the diagnosis ---------------------------

def _alternatives(ex: Exercise, case, sizes, seed, library, arrays) -> Alternatives:
    """The case's results with each named mistake of the exercise made, and with the cache's
    fields read in one another's places; and the case's masks."""
    def run(functions=None, mistakes=()):
        with numpy.errstate(all="ignore"), constants(ex, library):     # edited under them too
            functions = functions or edited(library, mistakes)
            return gradients(case, run_case(case, sizes, seed, library, functions)[3])

    caches = _recorded_caches(ex, case, sizes, seed, library)
    swaps = {}
    for label, functions in field_swaps(library, caches).items():
        try:
            swaps[label] = run(functions)
        except Exception:               # a field this case's code cannot take in another's place
            continue
    specs = case.arrays if isinstance(case.arrays, dict) else {}
    regions = mask_regions(specs, arrays)
    for cache in caches.values():
        regions += cache_regions(reachable({"cache": cache}))
    return Alternatives(lambda mistakes: run(mistakes=mistakes), ex.mistakes, swaps,
                        regions=regions)


def _axis_names(case, name) -> tuple[str, ...] | None:
    """What each axis of input ``name`` is, from its spec in the case ("b t d")."""
    spec = case.arrays.get(name) if isinstance(case.arrays, dict) else None
    if isinstance(spec, str):
        return tuple(spec.rpartition(":")[2].split())
    return None


def _recorded_caches(ex: Exercise, case, sizes, seed, library) -> dict:
    """name -> the cache the library's function to write got in this case (first call)."""
    functions, seen = recorders(library, [n for n in ex.write if "." not in n])
    with constants(ex, library):
        run_case(case, sizes, seed, library, functions)
    caches = {name: cache_of(tuple(calls[0][1].values()))[1] for name, calls in seen.items()}
    return {name: cache for name, cache in caches.items() if cache is not None}


# ---- a layer exercise, judged ------------------------------------------------------------------

def check_layer(ex: Exercise, learned: dict, path: Path, seed: int = 0,
                tolerance: float = TOLERANCE) -> list[CaseResult]:
    """Each of the exercise's gradient checks, the learner's results (``learned``: the child's,
    :func:`minitfm.learn.child.layer`) against the library's (the module's docstring)."""
    library = importlib.import_module(ex.module)
    results = []
    for case_name in ex.cases:
        case = ALL_CASES[case_name]
        sizes = case_sizes(ex, case)
        result = CaseResult(case_name, sizes)
        results.append(result)
        yours = learned.get(case_name)
        result.problem = case_problem(yours)
        if result.problem:
            continue
        allowed: list = []
        with constants(ex, library):
            arrays, out_r, g, right = run_case(case, sizes, seed, library, {}, allowed)
        right = gradients(case, right)
        mine = _yours(case, yours, out_r, right, result)
        if mine is None:
            continue
        result.changed = [c for c in yours.get("changed", []) if c not in allowed]
        alternatives = None
        for name in right:
            a, r = mine.get(name), right[name]
            fault = array_fault(a, r)
            error = diagnose.distance(a, r) if fault is None else float("inf")
            item = ArrayResult(name, error, error <= tolerance)
            if isinstance(a, numpy.ndarray) and a.shape != r.shape:
                item.shape = tuple(a.shape)
            result.arrays.append(item)
            if item.ok:
                continue
            if fault is not None and not isinstance(a, numpy.ndarray):
                item.diagnosis = fault
                continue
            if alternatives is None:
                alternatives = _alternatives(ex, case, sizes, seed, library, arrays)
            a = a.real if a.dtype.kind == "c" else a
            item.first = diagnose.first_wrong(a, r, tolerance)
            item.diagnosis = diagnose.diagnose(
                name, a, r, others={**right, diagnose.PASSED_THROUGH: g},
                known=diagnose.quantities(sizes, ex.quantities),
                axis_names=_axis_names(case, name), **alternatives.about(name, r, mine))
            if fault is not None:
                item.diagnosis = fault + ("; and " + item.diagnosis if item.diagnosis else "")
        regroup_renamed(result.arrays, mine, right)
        if result.ok:
            result.confirmed = _confirmed(case, sizes, seed, arrays, g, right, ex, library)
    return results


def _yours(case, yours: dict, out_r, right: dict, result: CaseResult) -> dict | None:
    """The learner's gradients by name, a note in ``result`` where their forward pass gives
    other outputs; None, with ``result.problem`` said, where their result has the wrong form."""
    out = yours.get("out")
    if not isinstance(out, (numpy.ndarray, float)) or diagnose.distance(out, out_r) > 1e-12:
        result.note = ("your forward pass gives other outputs than the library's: the check "
                       "holds your backward to the library's forward")
    try:
        mine = gradients(case, yours.get("result"))
    except ValueError as exc:
        result.problem = str(exc)
        return None
    extra = [n for n in mine if n not in right]
    if extra:
        result.problem = (f"your backward returns gradients named {', '.join(extra)}, which the "
                          f"layer does not have (it has {', '.join(right)})")
        return None
    return mine


def _confirmed(case, sizes, seed, arrays, g, grads, ex, library) -> str:
    """Finite differences of the library's forward along one random direction of all the
    inputs at once, against the gradients (the library's, which the learner's equal): a dozen
    forward passes, at the gradient checks' steps until one agrees."""
    rng = backend.host_rng(seed + 1)
    units = {name: rng.standard_normal(numpy.shape(arrays[name])) for name in grads}
    starts = {name: arrays[name].copy() for name in grads}
    analytic = sum(float((grads[name] * units[name]).sum()) for name in grads)
    size = math.sqrt(sum(float((grads[name] ** 2).sum()) for name in grads))

    def objective():
        with constants(ex, library):
            y, _ = case.forward(arrays, sizes)
        return float((y * g).sum())

    def error(step):
        def move(k):
            for name in grads:
                arrays[name][...] = starts[name] + k * step * units[name]
        numeric = five_point(objective, move, step)
        for name in grads:
            arrays[name][...] = starts[name]
        scale = max(abs(analytic), abs(numeric), size)
        return 0.0 if scale == 0.0 else abs(analytic - numeric) / scale
    worst = smallest_error(error, STEPS, case.tolerance)
    verdict = "agree" if worst <= case.tolerance else "do not agree"
    return (f"finite differences along a random direction of the inputs {verdict} (relative "
            f"error {worst:.1e})")


# ---- one check ------------------------------------------------------------------------------

def run_check(ex: Exercise, path: Path, seed: int = 0, limit: float = worker.LIMIT,
              cancel=None) -> Report:
    """Check the exercise in ``path`` as its kind does: a :class:`Report` (status "cancelled"
    when ``cancel()`` said so before it ended)."""
    path = Path(path)
    if not path.exists():
        return Report(ex, path, "not written", message=f"{path} is not there: start the "
                      f"exercise first (python -m minitfm.learn start {ex.name})")
    return ex.kind.not_written(ex, path) or ex.kind.check(ex, path, seed, limit, cancel)


def run_in_child(ex: Exercise, path: Path, task, judge, seed: int = 0,
                 limit: float = worker.LIMIT, cancel=None) -> Report:
    """The learner's functions run by ``task`` (:mod:`minitfm.learn.child`) in a process of
    their own, and what comes back judged here by ``judge`` (:func:`check_layer`, ...)."""
    started = time.perf_counter()
    outcome = worker.run(task, {"exercise": ex, "path": str(path), "seed": seed},
                         limit=limit, cancel=cancel)
    if outcome.status == "cancelled":
        return Report(ex, path, "cancelled")
    if not outcome.done:
        return Report(ex, path, "fail", message=worker.outcome_words(outcome),
                      seconds=time.perf_counter() - started)
    learned = outcome.value if isinstance(outcome.value, dict) else {}
    if "error" in learned:
        return Report(ex, path, "error", message=str(learned["error"]),
                      seconds=time.perf_counter() - started)
    if "not_written" in learned:
        return Report(ex, path, "not written", message=str(learned["not_written"]),
                      seconds=time.perf_counter() - started)
    with backend.using("numpy"), numpy.errstate(all="ignore"):   # a NaN is diagnosed
        cases = judge(ex, learned.get("cases", learned), path, seed)
    status = "pass" if all(c.ok for c in cases) else \
        "not written" if all((c.problem or "").startswith("not written") for c in cases) \
        else "fail"
    return Report(ex, path, status, cases, seconds=time.perf_counter() - started)
