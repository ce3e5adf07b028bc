"""A gradient check's case as the workshop runs it, on either side of the learner's process:
its sizes in an exercise, the module constants it sets, its draw, forward and backward with the
learner's functions (or the library's) in the library's module, the arrays the backward changes
in place, and its gradients by name. Host-only code (NumPy, float64)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect

import numpy

from minitfm import backend
from minitfm.gradcheck.cases import CASES, MODEL_CASES
from minitfm.learn import wire
from minitfm.learn.exercise import Exercise
from minitfm.learn.learner import substituted

__all__ = ["ALL_CASES", "case_sizes", "constants", "in_place", "reachable", "run_case", "gradients",
           "kind", "array_fault", "case_problem"]

ALL_CASES = {case.name: case for case in [*CASES, *MODEL_CASES]}


def case_sizes(ex: Exercise, case) -> dict:
    """A layer case's sizes in the exercise's check: the case's, with the exercise's over those
    it has (``ex.sizes``)."""
    return {**case.sizes, **{k: v for k, v in ex.sizes.items() if k in case.sizes}}


# ---- a case, run ------------------------------------------------------------------------------

@contextlib.contextmanager
def constants(ex: Exercise, *modules):
    """The exercise's module constants (``ex.constants``: the output layer's chunk) set in each
    of ``modules`` that has them, for the block."""
    old = [(m, name, getattr(m, name)) for m in modules for name in ex.constants
           if hasattr(m, name)]
    try:
        for module, name, _ in old:
            setattr(module, name, ex.constants[name])
        yield
    finally:
        for module, name, value in old:
            setattr(module, name, value)


def reachable(named: dict) -> dict:
    """path -> array for every array reachable from ``named`` (name -> object) through named
    tuples, dicts, lists and tuples; an array reached twice keeps its first path."""
    found, seen = {}, set()

    def walk(obj, path, depth):
        if depth > 8:
            return
        if isinstance(obj, numpy.ndarray):
            if id(obj) not in seen:
                seen.add(id(obj))
                found[path] = obj
        elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
            for field in obj._fields:
                walk(getattr(obj, field), f"{path}.{field}", depth + 1)
        elif isinstance(obj, dict):
            for key, value in obj.items():
                walk(value, f'{path}["{key}"]', depth + 1)
        elif isinstance(obj, (list, tuple)):
            for i, value in enumerate(obj):
                walk(value, f"{path}[{i}]", depth + 1)
    for name, obj in named.items():
        walk(obj, name, 0)
    return found


@contextlib.contextmanager
def in_place(named: dict, changed: list):
    """Appends to ``changed`` the paths of the arrays reachable from ``named`` whose bytes the
    block changed."""
    arrays = reachable(named)
    before = {path: a.tobytes() for path, a in arrays.items()}
    yield
    changed += [path for path, a in arrays.items() if a.tobytes() != before[path]]


def _argument_names(fn) -> tuple[str, str]:
    """What a backward calls its gradient and its cache (``dy``, ``cache``)."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = []
    return (names + ["dy", "cache"])[0], (names[1:] + ["cache"])[0]


def run_case(case, sizes: dict, seed: int, library, functions: dict, changed=None):
    """The case's draw, forward and backward with ``functions`` in the library module: the
    arrays, the forward's output, dL/dout and the backward's result. ``changed``: a list, to
    which the arrays the backward changed in place are added by name."""
    rng = backend.host_rng(seed)
    arrays = case.draw(rng, sizes)
    # the library's functions by their plain code (a route of minitfm.speed wraps it), so that a
    # case holding either is given the learner's
    originals = {n: inspect.unwrap(getattr(library, n)) for n in functions}
    replaced = {id(f): functions[n] for n, f in originals.items()}
    run = dataclasses.replace(case, backward=replaced.get(id(inspect.unwrap(case.backward)),
                                                          case.backward))
    with substituted(library, functions):
        out, cache = run.forward(arrays, sizes)
        g = backend.to_device(rng.standard_normal(numpy.shape(out)), dtype="float64")
        dy = g.copy() if g.ndim else g
        if changed is None:
            result = run.backward(dy, cache)
        else:
            dy_name, cache_name = _argument_names(case.backward)
            with in_place({dy_name: dy, cache_name: cache, "the inputs": arrays}, changed):
                result = run.backward(dy, cache)
    return arrays, out, g, result


def gradients(case, result) -> dict:
    """The case's gradients by name from a backward's result (ValueError, saying what is
    wrong, if it has the wrong form)."""
    if not isinstance(result, tuple) or not result or not isinstance(result[-1], dict):
        raise ValueError(f"your backward returns {_form(result)}; the contract is a tuple: the "
                         f"gradients of the inputs, then a dict of the parameters' gradients "
                         f"(`return dx, {{...}}`; a layer without parameters returns "
                         f"`dx, {{}}`)")
    *d_inputs, grads = result
    if len(d_inputs) != len(case.d_inputs):
        raise ValueError(f"your backward returns {len(d_inputs)} input gradient(s) before the "
                         f"dict, where {len(case.d_inputs)} are expected "
                         f"({', '.join(str(n) for n in case.d_inputs)})")
    named = {n: d for n, d in zip(case.d_inputs, d_inputs) if n is not None}
    return {**named, **grads}


def _form(value) -> str:
    if isinstance(value, tuple):
        return "a tuple of " + (", ".join(kind(v) for v in value) or "nothing")
    return kind(value)


def kind(value) -> str:
    if isinstance(value, wire.Other):
        return value.what
    if isinstance(value, numpy.ndarray):
        return f"an array {tuple(value.shape)}"
    return wire.describe(value)


def array_fault(a, r) -> str | None:
    """What is wrong with a gradient's kind (not its values), ``r`` the right one: None for an
    array of real numbers of the right type."""
    if a is None:
        return "missing: your backward gives None for it"
    if not isinstance(a, numpy.ndarray):
        return f"not an array: your backward gives {kind(a)} for it"
    if a.dtype.kind == "c":
        return (f"complex numbers ({a.dtype}): the gradient of a real loss is real (a complex "
                f"value crept in: a square root of a negative number, or a complex constant?)")
    if a.dtype.kind != "f":
        return f"an array of {a.dtype}: a gradient is an array of {r.dtype}"
    if a.dtype != r.dtype:
        return (f"an array of {a.dtype}, where the check's arrays are {r.dtype}: a gradient "
                f"has its input's type (an array made with another dtype?)")
    return None


def case_problem(yours) -> str | None:
    """What the learner's process says went wrong in one case (its words: not written, or an
    exception at their line), or None where it sent the case's results."""
    if not isinstance(yours, dict) or not yours:
        return "no result came back for this case"
    if "not_written" in yours or "error" in yours:
        return str(yours.get("not_written") or yours.get("error"))
    return None
