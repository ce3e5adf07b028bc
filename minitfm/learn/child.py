"""What runs in the child process (:mod:`minitfm.learn.worker`): the learner's file loaded and
its functions run in the library's place, for a check or for ``train``. Host-only code.

Each task takes the checking side's request (the exercise's row, the file, the seed) and
a :class:`~minitfm.learn.worker.Channel`, and returns plain data: the arrays the learner's code
gave, never a verdict. A problem of the learner's file is part of the result, in the learner's
words: ``{"error": ...}`` (the file does not load: its line), ``{"not_written": ...}`` (a
function to write still the TODO, or not defined in the file), per case where it is the case's.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy

from minitfm import backend
from minitfm.learn import adamcheck, learner
from minitfm.learn.cases import ALL_CASES, case_sizes, constants, run_case
from minitfm.learn.modelcheck import model_batch, model_cases, model_loss

__all__ = ["layer", "model", "optim", "loaded"]


def loaded(payload: dict):
    """``(exercise, path, module, functions)`` of a request, or a result that says why not."""
    ex, path = payload["exercise"], Path(payload["path"])
    try:
        module = learner.load(path, ex.name)
        return ex, path, module, learner.functions_of(ex, module, path)
    except learner.LearnerError as exc:
        return {"error": str(exc)}
    except learner.NotWritten as exc:
        return {"not_written": str(exc)}


def _failure(exc: Exception, ex, path) -> dict:
    if learner.not_written(exc):
        return {"not_written": f"not written yet: {learner.unwritten_name(exc, ex)}"}
    return {"error": learner.where_in(exc, path)}


def _each_case(ex, path, run) -> dict:
    """``run(name)`` for each of the exercise's cases: its result, or the learner's failure."""
    cases = {}
    with backend.using("numpy"), numpy.errstate(all="ignore"):
        for name in ex.cases:
            try:
                cases[name] = run(name)
            except Exception as exc:
                cases[name] = _failure(exc, ex, path)
    return {"cases": cases}


def layer(payload: dict, channel) -> dict:
    """Each of the exercise's gradient checks run with the learner's functions: per case the
    forward's output, the backward's result as returned, and what it changed in place."""
    found = loaded(payload)
    if isinstance(found, dict):
        return found
    ex, path, module, functions = found
    library = importlib.import_module(ex.module)

    def run(name):
        case, changed = ALL_CASES[name], []
        with constants(ex, library, module):
            _, out, _, result = run_case(case, case_sizes(ex, case), payload["seed"], library,
                                         functions, changed)
        return {"out": out, "result": result, "changed": changed}
    return _each_case(ex, path, run)


def model(payload: dict, channel) -> dict:
    """Each model case's loss and gradients with the learner's backward."""
    found = loaded(payload)
    if isinstance(found, dict):
        return found
    ex, path, _, functions = found
    library = importlib.import_module(ex.module)
    write = {n: functions[n] for n in ex.write}
    cases = model_cases(ex)

    def run(name):
        params, batch = model_batch(cases[name], payload["seed"])
        with learner.substituted(library, write):
            loss, grads = model_loss(library, cases[name], params, batch)
        return {"loss": loss, "grads": grads}
    return _each_case(ex, path, run)


def optim(payload: dict, channel) -> dict:
    """The learner's schedule at the check's steps, and Adam's updates."""
    found = loaded(payload)
    if isinstance(found, dict):
        return found
    ex, path, module, _ = found
    out = {}
    with numpy.errstate(all="ignore"):
        try:
            out["schedule"] = adamcheck.schedule_values(module.LRSchedule)
        except Exception as exc:
            out["schedule"] = _failure(exc, ex, path)
        try:
            out["adam"] = adamcheck.adam_run(module.coefficients, module.adam_step,
                                             payload["seed"])
        except Exception as exc:
            out["adam"] = _failure(exc, ex, path)
    return out
