"""The whole model's exercise checked: every parameter's gradient against the library's (which
the model gradient checks hold to finite differences), and the loss differentiated numerically
along a random direction of all parameters. Host-only code (NumPy, float64)."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy

from minitfm import backend
from minitfm.gradcheck.cases import MODEL_CASES
from minitfm.gradcheck.check import TOLERANCE
from minitfm.learn import diagnose
from minitfm.learn.exercises import Exercise
from minitfm.learn.learner import edited_function, not_written, substituted, where_in
from minitfm.learn.report import ArrayResult, CaseResult
from minitfm.models import DROPOUTS

__all__ = ["check_model", "case_rng", "model_batch", "model_loss", "CASES"]

CASES = {case.name: case for case in MODEL_CASES}


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


def check_model(ex: Exercise, learner, path: Path, seed: int = 0,
                tolerance: float = TOLERANCE) -> list[CaseResult]:
    """Each of the exercise's model cases as the module's docstring says."""
    library = importlib.import_module(ex.module)
    functions = {n: getattr(learner, n) for n in ex.write}
    results = []
    for case_name in ex.cases:
        case = CASES[case_name]
        result = CaseResult(case_name, dict(case.sizes))
        results.append(result)
        params, batch = model_batch(case, seed)

        def loss(changed=None, learner_code=False):
            with substituted(library, functions if learner_code else {}):
                return model_loss(library, case, changed or params, batch)

        _, right = loss()
        try:
            _, mine = loss(learner_code=True)
        except Exception as exc:
            result.problem = (f"not written yet: {', '.join(ex.write)}" if not_written(exc)
                              else where_in(exc, path))
            continue
        alternatives = None
        for name in right:
            error = diagnose.distance(mine[name], right[name])
            ok = error <= tolerance
            item = ArrayResult(name, error, ok)
            result.arrays.append(item)
            if ok:
                continue
            if alternatives is None:
                alternatives = {}
                for mistake in ex.mistakes:
                    fn = edited_function(library, mistake.function, mistake.old, mistake.new)
                    with substituted(library, {mistake.function: fn}):
                        alternatives[mistake.label] = model_loss(library, case, params,
                                                                 batch)[1]
            item.first = diagnose.first_wrong(mine[name], right[name], tolerance)
            item.diagnosis = diagnose.diagnose(
                name, mine[name], right[name], others=right,
                mistakes={k: v.get(name) for k, v in alternatives.items()},
                known=diagnose.quantities(result.sizes))
        if result.ok:
            result.note = _directional(loss, params, mine, seed)
    return results


def _directional(loss, params, grads, seed) -> str:
    """The loss differentiated numerically along a random direction u of all parameters,
    against sum <grad, u>."""
    rng = numpy.random.default_rng(seed + 1)
    u = {k: rng.standard_normal(v.shape) for k, v in params.items()}
    analytic = sum(float((grads[k] * u[k]).sum()) for k in params)
    h = 1e-4

    def at(t):
        return loss({k: v + t * u[k] for k, v in params.items()})[0]
    numeric = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h)
    error = abs(analytic - numeric) / max(abs(analytic), abs(numeric), 1e-300)
    return (f"finite differences of the loss along a random direction of all parameters: "
            f"relative error {error:.1e}")
