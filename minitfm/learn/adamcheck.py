"""Adam's exercise checked: the learner's schedule at the steps that show its shape, and three
Adam updates of two arrays, against the library's, number for number. Host-only code (NumPy,
float64)."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import numpy

from minitfm.learn import diagnose
from minitfm.learn.exercises import Exercise
from minitfm.learn.learner import edited_function
from minitfm.learn.report import ArrayResult, CaseResult

__all__ = ["check_optim", "SCHEDULE_STEPS", "schedule_values", "adam_run"]

SCHEDULE_STEPS = (1, 2, 10, 1000, 3999, 4000, 4001, 8000, 100000)
# the two arrays' gradients: of order 1, and of order 1e-8, where sqrt(v_hat) is near eps (1e-9),
# so that eps in the wrong place (inside the root, or left out) changes the update
GRADIENT_SCALES = (1.0, 1e-8)


def schedule_values(schedule_cls, call=None):
    """A schedule class's learning rates at :data:`SCHEDULE_STEPS` (``call``: its ``__call__``
    replaced)."""
    schedule = schedule_cls(d_model=512, warmup=4000)
    fn = call or type(schedule).__call__
    return numpy.array([fn(schedule, s) for s in SCHEDULE_STEPS], dtype=numpy.float64)


def check_optim(ex: Exercise, learned: dict, path: Path, seed: int = 0,
                tolerance: float = 1e-12) -> list[CaseResult]:
    """The schedule and the updates, as the module's docstring says: ``learned`` the learner's
    (:func:`minitfm.learn.child.optim`)."""
    optim = importlib.import_module(ex.module)
    results = []

    result = CaseResult("the paper's schedule, d_model 512, warmup 4000", {"d": 512})
    results.append(result)
    right = schedule_values(optim.LRSchedule)
    mine = learned.get("schedule")
    if isinstance(mine, dict):
        result.problem = str(mine.get("not_written") or mine.get("error"))
    else:
        alternatives = {m.label: schedule_values(optim.LRSchedule, edited_function(
            optim, m.function, m.old, m.new)) for m in ex.mistakes
            if m.function == "LRSchedule.__call__"}
        _compare(result, "lr", mine, right, tolerance, alternatives,
                 {"sqrt(d_model)": math.sqrt(512), "sqrt(warmup)": math.sqrt(4000)})
        if result.arrays and not result.arrays[0].ok:
            result.arrays[0].diagnosis = (result.arrays[0].diagnosis or "") + \
                f" (at steps {', '.join(map(str, SCHEDULE_STEPS))})"

    result = CaseResult("Adam, three updates of two arrays (beta1 0.9, beta2 0.98, eps 1e-9; "
                        "p1's gradients of order 1e-8, where eps counts)", {})
    results.append(result)
    right = adam_run(optim.coefficients, optim.adam_step, seed)
    mine = learned.get("adam")
    if not isinstance(mine, dict) or "not_written" in mine or "error" in mine:
        mine = mine if isinstance(mine, dict) else {}
        result.problem = str(mine.get("not_written") or mine.get("error") or
                             "your Adam gave no updates")
        return results
    alternatives = {}
    for m in ex.mistakes:
        if m.function in ("coefficients", "adam_step"):
            parts = {"coefficients": optim.coefficients, "adam_step": optim.adam_step}
            parts[m.function] = edited_function(optim, m.function, m.old, m.new)
            with numpy.errstate(all="ignore"):
                alternatives[m.label] = adam_run(parts["coefficients"], parts["adam_step"],
                                                 seed)
    for name in right:
        _compare(result, name, mine.get(name), right[name], 1e-10,
                 {k: v[name] for k, v in alternatives.items()}, {"1 - beta1": 0.1})
    return results


def _compare(result: CaseResult, name, mine, right, tolerance, alternatives, extra) -> None:
    if not isinstance(mine, numpy.ndarray) or mine.dtype.kind not in "fiu":
        item = ArrayResult(name, math.inf, False)
        result.arrays.append(item)
        item.diagnosis = ("missing" if mine is None else
                          f"not an array of real numbers: {type(mine).__name__} "
                          f"{getattr(mine, 'dtype', '')}".rstrip())
        return
    mine = mine.astype(numpy.float64)
    error = diagnose.distance(mine, right)
    item = ArrayResult(name, error, error <= tolerance)
    result.arrays.append(item)
    if not item.ok:
        item.first = diagnose.first_wrong(mine, right, tolerance) if mine is not None else None
        item.diagnosis = diagnose.diagnose(name, mine, right, mistakes=alternatives,
                                           known=diagnose.quantities({}, extra))


def adam_run(coefficients, adam_step, seed) -> dict:
    """Three Adam updates of two float64 arrays with ``coefficients`` and ``adam_step`` (their
    gradients at :data:`GRADIENT_SCALES`): the arrays and their moments after each update."""
    rng = numpy.random.default_rng(seed)
    params = [rng.standard_normal((3, 4)), rng.standard_normal(5)]
    m = [numpy.zeros_like(p) for p in params]
    v = [numpy.zeros_like(p) for p in params]
    seen = {}
    for step in (1, 2, 3):
        lr = 1e-3 * step
        b1, b2, step_size, v_scale, keep = coefficients(0.9, 0.98, step, lr, 1.0)
        for i, p in enumerate(params):
            g = rng.standard_normal(p.shape) * GRADIENT_SCALES[i]
            adam_step(p, g, m[i], v[i], b1, b2, 1e-9, step_size, v_scale)
            seen[f"update {step}: p{i}"] = p.copy()
            seen[f"update {step}: m{i}"] = m[i].copy()
            seen[f"update {step}: v{i}"] = v[i].copy()
    return seen
