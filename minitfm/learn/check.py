"""Checking an exercise: the learner's functions in place of the library's, judged by the
library's own gradient checks, and each wrong gradient diagnosed. Host-only code: the checks
run on NumPy in float64, the plain code (as ``python -m minitfm.gradcheck`` runs them).

A layer exercise runs each of its cases (``minitfm.gradcheck.cases``) twice on the same draw:
once with the library's functions, giving the right gradients, and once with the learner's
forward and backward put in their place in the library's module (in memory, for the check
alone: nothing is written), giving the learner's; each of the learner's gradients is held to
five-point central differences of the library's forward pass at the checks' tolerance and
steps. A wrong one gets its relative error, the first wrong element and a diagnosis
(:mod:`minitfm.learn.diagnose`). The whole model's exercise compares every parameter's gradient
with the library's (which the model checks hold to finite differences) and differentiates the
loss numerically along a random direction; Adam's compares the updates and the schedule with
the library's; a kernel's runs its CUDA C on the CPU (:mod:`minitfm.learn.modelcheck`,
:mod:`minitfm.learn.adamcheck`, :mod:`minitfm.learn.kernels`).
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import math
import time
from pathlib import Path

import numpy

from minitfm import backend
from minitfm.gradcheck.cases import CASES, MODEL_CASES
from minitfm.gradcheck.check import STEPS, TOLERANCE, numerical_gradient, relative_error
from minitfm.learn import diagnose, kernels, source
from minitfm.learn.adamcheck import check_optim
from minitfm.learn.exercises import Exercise
from minitfm.learn.learner import (LearnerError, edited_function, functions_of, load,
                                   not_written, recorders, substituted, unwritten_name,
                                   where_in)
from minitfm.learn.modelcheck import check_model
from minitfm.learn.report import ArrayResult, CaseResult, Report

__all__ = ["run_check", "run_case", "gradients", "check_layer", "ALL_CASES"]

ALL_CASES = {case.name: case for case in [*CASES, *MODEL_CASES]}
# an error this large is a wrong gradient at any step: the other steps (which rescue a right
# gradient from rounding or a kink, minitfm.gradcheck) are not tried
FAR = 1e-3


# ---- layer exercises --------------------------------------------------------------------------

def run_case(case, sizes: dict, seed: int, library, functions: dict):
    """The case's draw, forward and backward with ``functions`` in the library module: the
    arrays, the forward's output, dL/dout and the gradients by name (or the exception)."""
    rng = backend.host_rng(seed)
    arrays = case.draw(rng, sizes)
    originals = {n: getattr(library, n) for n in functions}
    replaced = {id(f): functions[n] for n, f in originals.items()}
    run = dataclasses.replace(case, backward=replaced.get(id(case.backward), case.backward))
    with substituted(library, functions):
        out, cache = run.forward(arrays, sizes)
        g = backend.to_device(rng.standard_normal(numpy.shape(out)), dtype="float64")
        result = run.backward(g.copy() if g.ndim else g, cache)
    return arrays, out, g, result


def gradients(case, result) -> dict:
    """The case's gradients by name from a backward's result (ValueError if it has the wrong
    form)."""
    if not isinstance(result, tuple) or not result or not isinstance(result[-1], dict):
        raise ValueError(f"your backward returns {_form(result)}; the contract is the gradients "
                         f"of the inputs, then a dict of the parameters' gradients")
    *d_inputs, grads = result
    if len(d_inputs) != len(case.d_inputs):
        raise ValueError(f"your backward returns {len(d_inputs)} input gradient(s) before the "
                         f"dict, where {len(case.d_inputs)} are expected "
                         f"({', '.join(str(n) for n in case.d_inputs)})")
    named = {n: d for n, d in zip(case.d_inputs, d_inputs) if n is not None}
    return {**named, **grads}


def _form(value) -> str:
    if isinstance(value, tuple):
        return "a tuple of " + ", ".join(type(v).__name__ for v in value)
    return f"a {type(value).__name__}"


def _numeric(case, sizes, seed, name, analytic, tolerance):
    """Finite differences of the library's forward for input ``name``: ``(error, numeric)``
    at the checks' steps, the smallest error (and its numeric array) counting."""
    rng = backend.host_rng(seed)
    arrays = case.draw(rng, sizes)
    out, _ = case.forward(arrays, sizes)
    g = backend.to_device(rng.standard_normal(numpy.shape(out)), dtype="float64")

    def objective():
        y, _ = case.forward(arrays, sizes)
        return float((y * g).sum())

    best = (math.inf, None)
    for step in STEPS:
        numeric = numerical_gradient(objective, arrays[name], step)
        error = relative_error(analytic, numeric) if analytic is not None and \
            numpy.shape(analytic) == numeric.shape else math.inf
        if error < best[0] or best[1] is None:
            best = (error, numeric)
        if error <= tolerance or error > FAR:
            break
    return best


def _cache_of(args) -> tuple:
    """The first named-tuple argument of a call (its cache), and where it is."""
    for i, a in enumerate(args):
        if isinstance(a, tuple) and hasattr(a, "_fields"):
            return i, a
    return None, None


def _field_swap(fn, use: str, instead: str):
    """The library's ``fn`` reading its cache's field ``use`` in place of ``instead``."""
    def run(*args, **kwargs):
        i, cache = _cache_of(args)
        if cache is not None and hasattr(cache, use) and hasattr(cache, instead):
            args = list(args)
            args[i] = cache._replace(**{instead: getattr(cache, use)})
        return fn(*args, **kwargs)
    return run


def _array_fields(cache) -> list[str]:
    return [f for f in cache._fields if hasattr(getattr(cache, f), "shape")
            and getattr(getattr(cache, f), "ndim", 0) > 0]


def _mistakes(ex: Exercise, case, sizes, seed, library, cache_sample) -> dict:
    """label -> the gradients the library gives with that mistake made, for this case."""
    with numpy.errstate(all="ignore"):
        return _mistakes_made(ex, case, sizes, seed, library, cache_sample)


def _mistakes_made(ex: Exercise, case, sizes, seed, library, cache_sample) -> dict:
    found = {}
    for mistake in ex.mistakes:
        try:
            fn = edited_function(library, mistake.function, mistake.old, mistake.new)
            _, _, _, result = run_case(case, sizes, seed, library, {mistake.function: fn})
            found[mistake.label] = gradients(case, result)
        except Exception:           # a mistake that does not apply to this case (pre-LN only)
            continue
    for name, cache in cache_sample.items():
        fields = _array_fields(cache)
        for use, instead in itertools.permutations(fields, 2):
            a, b = getattr(cache, use), getattr(cache, instead)
            if a.shape != b.shape or a is b or numpy.array_equal(a, b):
                continue
            label = (f"it reads cache.{use} where cache.{instead} belongs (the wrong cache "
                     f"field)")
            try:
                fn = _field_swap(getattr(library, name), use, instead)
                _, _, _, result = run_case(case, sizes, seed, library, {name: fn})
                found[label] = gradients(case, result)
            except Exception:
                continue
    return found


def _axis_names(case, name) -> tuple[str, ...] | None:
    """What each axis of input ``name`` is, from its spec in the case ("b t d")."""
    spec = case.arrays.get(name) if isinstance(case.arrays, dict) else None
    if isinstance(spec, str):
        return tuple(spec.rpartition(":")[2].split())
    return None


def _recorded_caches(ex: Exercise, case, sizes, seed, library) -> dict:
    """name -> the cache the library's function to write got in this case (first call)."""
    functions, seen = recorders(library, [n for n in ex.write if "." not in n])
    run_case(case, sizes, seed, library, functions)
    caches = {name: _cache_of(tuple(arguments.values()))[1]
              for name, (arguments, _) in seen.items()}
    return {name: cache for name, cache in caches.items() if cache is not None}


def check_layer(ex: Exercise, learner, path: Path, seed: int = 0,
                tolerance: float = TOLERANCE) -> list[CaseResult]:
    """Each of the exercise's gradient checks with the learner's functions (the module's
    docstring)."""
    library = importlib.import_module(ex.module)
    functions = functions_of(ex, learner)
    results = []
    for case_name in ex.cases:
        case = ALL_CASES[case_name]
        sizes = dict(case.sizes)
        result = CaseResult(case_name, sizes)
        results.append(result)
        _, out_r, _, right = run_case(case, sizes, seed, library, {})
        right = gradients(case, right)
        try:
            _, out_l, _, mine = run_case(case, sizes, seed, library, functions)
        except Exception as exc:
            if not_written(exc):
                result.problem = f"not written yet: {unwritten_name(exc, ex)}"
            else:
                result.problem = where_in(exc, path)
            continue
        if diagnose.distance(out_l, out_r) > 1e-12:
            result.note = ("your forward pass gives other outputs than the library's: the check "
                           "holds your backward to the library's forward")
        try:
            mine = gradients(case, mine)
        except ValueError as exc:
            result.problem = str(exc)
            continue
        missing = [n for n in right if n not in mine]
        extra = [n for n in mine if n not in right]
        if extra:
            result.problem = (f"your backward returns gradients named {', '.join(extra)}, "
                              f"which the layer does not have (it has {', '.join(right)})")
            continue
        alternatives = None
        for name in right:
            a = mine.get(name)
            error, numeric = _numeric(case, sizes, seed, name, a, tolerance)
            ok = name not in missing and error <= tolerance
            item = ArrayResult(name, error, ok)
            if hasattr(a, "shape") and numpy.shape(a) != numpy.shape(right[name]):
                item.shape = tuple(numpy.shape(a))
            result.arrays.append(item)
            if ok:
                continue
            if alternatives is None:
                caches = _recorded_caches(ex, case, sizes, seed, library)
                alternatives = _mistakes(ex, case, sizes, seed, library, caches)
            item.first = diagnose.first_wrong(a, numeric, tolerance) if a is not None else None
            item.diagnosis = diagnose.diagnose(
                name, a, right[name], others=right,
                mistakes={label: grads.get(name) for label, grads in alternatives.items()},
                known=diagnose.quantities(sizes, ex.quantities),
                axis_names=_axis_names(case, name))
    return results


# ---- one check ------------------------------------------------------------------------------

def run_check(ex: Exercise, path: Path, seed: int = 0) -> Report:
    """Check the exercise in ``path``: a :class:`Report`."""
    started = time.perf_counter()
    path = Path(path)
    if not path.exists():
        return Report(ex, path, "not written", message=f"{path} is not there: start the "
                      f"exercise first (python -m minitfm.learn start {ex.name})")
    if ex.kind == "kernel":
        report = kernels.check(ex, path, seed)
        report.seconds = time.perf_counter() - started
        return report
    try:
        left = source.unwritten(path, ex.write)
    except SyntaxError:
        left = []
    if len(left) == len(ex.write):
        return Report(ex, path, "not written", message=f"not written yet: {path.name} still "
                      f"holds the TODO of {', '.join(left)}")
    try:
        learner = load(path, ex.name)
    except LearnerError as exc:
        return Report(ex, path, "error", message=str(exc))
    check = {"layer": check_layer, "model": check_model, "optim": check_optim}[ex.kind]
    with backend.using("numpy"), numpy.errstate(all="ignore"):   # a NaN is diagnosed
        cases = check(ex, learner, path, seed)
    status = "pass" if all(c.ok for c in cases) else \
        "not written" if all((c.problem or "").startswith("not written") for c in cases) \
        else "fail"
    return Report(ex, path, status, cases, seconds=time.perf_counter() - started)
