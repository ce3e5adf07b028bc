"""Adam's exercise checked: the learner's schedule at the steps that show its shape, and three
Adam updates of two arrays, against the library's, number for number. Host-only code (NumPy,
float64)."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import numpy

from minitfm.learn import diagnose
from minitfm.learn.alternatives import Alternatives, edited
from minitfm.learn.exercise import Exercise
from minitfm.learn.locate import Region
from minitfm.learn.report import ArrayResult, CaseResult

__all__ = ["check_optim", "SCHEDULE_STEPS", "schedule_values", "adam_run"]

WARMUP = 4000
SCHEDULE_STEPS = (1, 2, 10, 1000, 3999, 4000, 4001, 8000, 100000)
# the schedule's two branches, for the diagnosis: where the rate is wrong
BRANCHES = [Region(f"during the warm-up (steps below {WARMUP})",
                   numpy.array(SCHEDULE_STEPS) < WARMUP),
            Region(f"after the warm-up (steps above {WARMUP})",
                   numpy.array(SCHEDULE_STEPS) > WARMUP)]
# the two arrays' gradients: of order 1, and of order 1e-8, where sqrt(v_hat) is near eps (1e-9),
# so that eps in the wrong place (inside the root, or left out) changes the update
GRADIENT_SCALES = (1.0, 1e-8)


def schedule_values(schedule_cls, call=None):
    """A schedule class's learning rates at :data:`SCHEDULE_STEPS` (``call``: its ``__call__``
    replaced)."""
    schedule = schedule_cls(d_model=512, warmup=WARMUP)
    fn = call or type(schedule).__call__
    return numpy.array([fn(schedule, s) for s in SCHEDULE_STEPS], dtype=numpy.float64)


def check_optim(ex: Exercise, learned: dict, path: Path, seed: int = 0,
                tolerance: float = 1e-12) -> list[CaseResult]:
    """The schedule and the updates, as the module's docstring says: ``learned`` the learner's
    (:func:`minitfm.learn.child.optim`)."""
    optim = importlib.import_module(ex.module)
    results = []

    result = CaseResult(f"the paper's schedule, d_model 512, warmup {WARMUP}, at steps "
                        f"{', '.join(map(str, SCHEDULE_STEPS))}", {})
    results.append(result)
    right = schedule_values(optim.LRSchedule)
    mine = learned.get("schedule")
    if isinstance(mine, dict):
        result.problem = str(mine.get("not_written") or mine.get("error"))
    else:
        def schedule(mistakes):
            return {"lr": schedule_values(optim.LRSchedule,
                                          edited(optim, mistakes)["LRSchedule.__call__"])}
        alternatives = Alternatives(schedule, [m for m in ex.mistakes
                                               if m.function == "LRSchedule.__call__"],
                                    regions=BRANCHES)
        _compare(result, "lr", mine, right, tolerance, alternatives,
                 {"sqrt(d_model)": math.sqrt(512), "sqrt(warmup)": math.sqrt(WARMUP)},
                 {"lr": mine}, labels={0: ("step", SCHEDULE_STEPS)})

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
    def adam(mistakes):
        parts = {"coefficients": optim.coefficients, "adam_step": optim.adam_step,
                 **edited(optim, mistakes)}
        return adam_run(parts["coefficients"], parts["adam_step"], seed)
    alternatives = Alternatives(adam, [m for m in ex.mistakes
                                       if m.function in ("coefficients", "adam_step")])
    for name in right:
        _compare(result, name, mine.get(name), right[name], 1e-10, alternatives,
                 {"1 - beta1": 0.1}, mine)
    return results


def _compare(result: CaseResult, name, mine, right, tolerance, alternatives: Alternatives,
             extra, yours: dict, labels=None) -> None:
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
        item.diagnosis = diagnose.diagnose(name, mine, right,
                                           known=diagnose.quantities({}, extra), labels=labels,
                                           noun="value",
                                           **alternatives.about(name, right, yours))


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
