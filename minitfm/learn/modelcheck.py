"""The whole model's exercise checked: every parameter's gradient against the library's (which
the model gradient checks hold to finite differences), and the loss differentiated numerically
along a random direction of all parameters. Host-only code (NumPy, float64)."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy

from minitfm import backend
from minitfm.gradcheck.cases import MODEL_CASES, model_case, translation_batch
from minitfm.gradcheck.check import STEPS, TOLERANCE, smallest_error
from minitfm.learn import diagnose
from minitfm.learn.alternatives import Alternatives, edited, regroup_renamed
from minitfm.learn.cases import array_fault, case_problem
from minitfm.learn.exercise import Exercise
from minitfm.learn.learner import substituted
from minitfm.learn.report import ArrayResult, CaseResult
from minitfm.models import DROPOUTS

__all__ = ["check_model", "case_rng", "model_batch", "model_loss", "CASES", "model_cases"]

CASES = {case.name: case for case in MODEL_CASES}


def model_cases(ex: Exercise) -> dict:
    """The exercise's model cases at its sizes and config (``ex.sizes``, ``ex.config``)."""
    model = importlib.import_module(ex.module)
    found = {}
    for name in ex.cases:
        base = CASES[name]
        cfg = base.cfg.replace(**{**ex.config.get("*", {}), **ex.config.get(name, {})})
        sizes = {**base.sizes, **{k: v for k, v in ex.sizes.items() if k in base.sizes}}
        found[name] = model_case(name, model, cfg, translation_batch, **sizes)
    return found


def case_rng(case):
    """A model case's dropout generator: the same masks on every call (fixed-mask cases)."""
    return backend.rng(2) if any(getattr(case.cfg, n, 0) for n in DROPOUTS) else None


def model_batch(case, seed: int) -> tuple[dict, tuple]:
    """A model case's draw: its parameters, and its batch ``(a, b)``."""
    arrays = case.draw(backend.host_rng(seed), dict(case.sizes))
    return {k: v for k, v in arrays.items() if k not in ("a", "b")}, (arrays["a"], arrays["b"])


def model_loss(library, case, params: dict, batch: tuple) -> tuple[float, dict]:
    """The model's loss and gradients on a case's batch, with its fixed dropout masks."""
    stats, grads = library.loss_and_grads(params, case.cfg, *batch, case_rng(case))
    return float(stats["loss"]), grads


def check_model(ex: Exercise, learned: dict, path: Path, seed: int = 0,
                tolerance: float = TOLERANCE) -> list[CaseResult]:
    """Each of the exercise's model cases as the module's docstring says: ``learned`` the
    learner's gradients by case (:func:`minitfm.learn.child.model`)."""
    library = importlib.import_module(ex.module)
    results = []
    cases = model_cases(ex)
    for case_name in ex.cases:
        case = cases[case_name]
        result = CaseResult(case_name, dict(case.sizes))
        results.append(result)
        params, batch = model_batch(case, seed)

        def loss(changed=None):
            return model_loss(library, case, changed or params, batch)

        _, right = loss()
        yours = learned.get(case_name)
        result.problem = case_problem(yours)
        if result.problem:
            continue
        mine = yours.get("grads")
        if not isinstance(mine, dict):
            result.problem = "your backward left the gradients unreadable"
            continue
        alternatives = None
        for name in right:
            a = mine.get(name)
            fault = array_fault(a, right[name])
            error = diagnose.distance(a, right[name]) if fault is None else float("inf")
            ok = error <= tolerance
            item = ArrayResult(name, error, ok)
            result.arrays.append(item)
            if ok:
                continue
            if fault is not None:
                item.diagnosis = fault
                continue
            if alternatives is None:
                alternatives = Alternatives(_mistaken(library, case, params, batch),
                                            ex.mistakes)
            item.first = diagnose.first_wrong(a, right[name], tolerance)
            item.diagnosis = diagnose.diagnose(
                name, a, right[name], others=right, known=diagnose.quantities(result.sizes),
                **alternatives.about(name, right[name], mine))
        regroup_renamed(result.arrays, mine, right)
        if result.ok:
            result.confirmed = _directional(loss, params, mine, seed)
    return results


def _mistaken(library, case, params: dict, batch: tuple):
    """The model's gradients on the case with named mistakes made (for the diagnosis)."""
    def run(mistakes):
        with substituted(library, edited(library, mistakes)):
            return model_loss(library, case, params, batch)[1]
    return run


def _directional(loss, params, grads, seed) -> str:
    """The loss differentiated numerically along a random direction u of all parameters,
    against sum <grad, u>, at the gradient checks' steps until one agrees (a step that moves a
    ReLU's input across 0 measures the kink, not the gradient)."""
    rng = numpy.random.default_rng(seed + 1)
    u = {k: rng.standard_normal(v.shape) for k, v in params.items()}
    analytic = sum(float((grads[k] * u[k]).sum()) for k in params)

    def at(t):
        return loss({k: v + t * u[k] for k, v in params.items()})[0]

    def error(h):
        numeric = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h)
        return abs(analytic - numeric) / max(abs(analytic), abs(numeric), 1e-300)
    worst = smallest_error(error, STEPS, TOLERANCE)
    verdict = "agree" if worst <= TOLERANCE else "do not agree"
    return (f"finite differences of the loss along a random direction of all parameters "
            f"{verdict} (relative error {worst:.1e})")
