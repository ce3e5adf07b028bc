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
the library's; a kernel's runs its CUDA C on the CPU (:mod:`minitfm.learn.kernels`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import itertools
import math
import sys
import textwrap
import time
import traceback
from pathlib import Path

import numpy

from minitfm import backend
from minitfm.gradcheck.cases import CASES, MODEL_CASES
from minitfm.gradcheck.check import STEPS, TOLERANCE, numerical_gradient, relative_error
from minitfm.learn import diagnose, kernels, source
from minitfm.learn.exercises import Exercise
from minitfm.learn.report import ArrayResult, CaseResult, Report

__all__ = ["LearnerError", "load", "run_check", "run_case", "substituted", "edited_function",
           "where_in", "case_rng", "gradients", "ALL_CASES"]

ALL_CASES = {case.name: case for case in [*CASES, *MODEL_CASES]}
# an error this large is a wrong gradient at any step: the other steps (which rescue a right
# gradient from rounding or a kink, minitfm.gradcheck) are not tried
FAR = 1e-3


class LearnerError(Exception):
    """The learner's file could not be run: the message says where (its line) and what."""


# ---- the learner's file ---------------------------------------------------------------------

def where_in(exc: BaseException, path: Path) -> str:
    """An exception as the learner should see it: the line of their file it came from (the
    last frame there), then the error; no frames of the library."""
    path = Path(path).resolve()
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if Path(f.filename).resolve() == path]
    what = f"{type(exc).__name__}: {exc}"
    if not frames:
        return what
    f = frames[-1]
    return f"{path.name}, line {f.lineno}, in {f.name}:\n    {(f.line or '').strip()}\n{what}"


def load(path: Path, name: str):
    """The learner's file as a fresh module (``LearnerError`` with its line if it does not
    compile or its top level fails)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        code = compile(text, str(path.resolve()), "exec")
    except SyntaxError as exc:
        line = (exc.text or "").rstrip("\n")
        raise LearnerError(f"{path.name}, line {exc.lineno}: {exc.msg}\n    {line.strip()}") \
            from None
    module_name = f"minitfm_workshop_{name}"
    spec = importlib.util.spec_from_loader(module_name, loader=None, origin=str(path))
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path.resolve())
    sys.modules[module_name] = module          # NamedTuple and dataclasses look it up
    try:
        exec(code, module.__dict__)
    except Exception as exc:
        raise LearnerError(where_in(exc, path)) from None
    return module


def edited_function(module, name: str, old: str, new: str):
    """The library's plain function ``name`` of ``module`` with ``old`` replaced by ``new``
    (found exactly once), compiled in a copy of the module's namespace."""
    text = source.plain_source(module.__name__, name)
    if text.count(old) != 1:
        raise LookupError(f"{module.__name__}.{name} has {text.count(old)} copies of {old!r}")
    namespace = dict(vars(module))
    exec(compile(text.replace(old, new), f"<{module.__name__}.{name}, edited>", "exec"),
         namespace)
    return namespace[name.split(".")[-1]]


@contextlib.contextmanager
def substituted(module, functions: dict):
    """``module``'s attributes ``functions`` (name -> function) set for the block, then put
    back: in memory only."""
    old = {name: getattr(module, name) for name in functions}
    try:
        for name, fn in functions.items():
            setattr(module, name, fn)
        yield
    finally:
        for name, fn in old.items():
            setattr(module, name, fn)


def _learner_functions(ex: Exercise, learner) -> dict:
    """The learner's functions that stand in for the library's: those to write and the kept
    functions (the forward passes)."""
    names = [n for n in (*ex.write, *ex.keep) if "." not in n]
    return {n: getattr(learner, n) for n in names
            if callable(getattr(learner, n, None)) and not isinstance(getattr(learner, n), type)}


def _not_written_guard(exc: BaseException) -> bool:
    return isinstance(exc, NotImplementedError) and source.TODO in str(exc)


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


def _field_swaps(fn):
    """Variants of the library's ``fn`` that read one cache field in place of another of the
    same shape: (label, function) for each pair, made on the first call's cache."""
    def variant(use, instead):
        def run(*args, **kwargs):
            i, cache = _cache_of(args)
            if cache is not None and hasattr(cache, use) and hasattr(cache, instead):
                args = list(args)
                args[i] = cache._replace(**{instead: getattr(cache, use)})
            return fn(*args, **kwargs)
        return run
    return variant


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
                fn = _field_swaps(getattr(library, name))(use, instead)
                _, _, _, result = run_case(case, sizes, seed, library, {name: fn})
                found[label] = gradients(case, result)
            except Exception:
                continue
    return found


def _axis_names(case, name, arrays) -> tuple[str, ...] | None:
    spec = case.arrays.get(name) if isinstance(case.arrays, dict) else None
    if isinstance(spec, str):
        return tuple(spec.rpartition(":")[2].split())
    return None


def _recorded_caches(ex: Exercise, case, sizes, seed, library) -> dict:
    """name -> the cache the library's function to write got in this case (first call)."""
    seen = {}

    def recorder(name, fn):
        def run(*args, **kwargs):
            _, cache = _cache_of(args)
            if cache is not None and name not in seen:
                seen[name] = cache
            return fn(*args, **kwargs)
        return run
    functions = {n: recorder(n, getattr(library, n)) for n in ex.write if "." not in n}
    run_case(case, sizes, seed, library, functions)
    return seen


def check_layer(ex: Exercise, learner, path: Path, seed: int = 0,
                tolerance: float = TOLERANCE) -> list[CaseResult]:
    library = importlib.import_module(ex.module)
    functions = _learner_functions(ex, learner)
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
            if _not_written_guard(exc):
                result.problem = f"not written yet: {_unwritten_name(exc, ex)}"
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
                axis_names=_axis_names(case, name, None))
    return results


def _unwritten_name(exc, ex: Exercise) -> str:
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.name in {w.split(".")[-1] for w in ex.write}:
            return frame.name
    return ", ".join(ex.write)


# ---- the whole model ---------------------------------------------------------------------------

def check_model(ex: Exercise, learner, path: Path, seed: int = 0,
                tolerance: float = TOLERANCE) -> list[CaseResult]:
    """Each parameter's gradient against the library's, and the loss differentiated along a
    random direction of all parameters (five-point central differences)."""
    library = importlib.import_module(ex.module)
    functions = {n: getattr(learner, n) for n in ex.write}
    results = []
    for case_name in ex.cases:
        case = ALL_CASES[case_name]
        cfg, sizes = case.cfg, dict(case.sizes)
        result = CaseResult(case_name, sizes)
        results.append(result)
        arrays = case.draw(backend.host_rng(seed), sizes)
        params = {k: v for k, v in arrays.items() if k not in ("a", "b")}

        def loss(changed=None, learner_code=False):
            use = functions if learner_code else {}
            with substituted(library, use):
                stats, grads = library.loss_and_grads(changed or params, cfg, arrays["a"],
                                                      arrays["b"], case_rng(case))
            return float(stats["loss"]), grads

        _, right = loss()
        try:
            _, mine = loss(learner_code=True)
        except Exception as exc:
            result.problem = (f"not written yet: {', '.join(ex.write)}" if _not_written_guard(exc)
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
                        alternatives[mistake.label] = library.loss_and_grads(
                            params, cfg, arrays["a"], arrays["b"], case_rng(case))[1]
            item.first = diagnose.first_wrong(mine[name], right[name], tolerance)
            item.diagnosis = diagnose.diagnose(
                name, mine[name], right[name], others=right,
                mistakes={k: v.get(name) for k, v in alternatives.items()},
                known=diagnose.quantities(sizes))
        if result.ok:
            result.note = _directional(loss, params, mine, seed, tolerance)
    return results


def case_rng(case):
    """A model case's dropout generator: the same masks on every call (fixed-mask cases)."""
    from minitfm.models import DROPOUTS
    return backend.rng(2) if any(getattr(case.cfg, n, 0) for n in DROPOUTS) else None


def _directional(loss, params, grads, seed, tolerance) -> str:
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


# ---- Adam and the schedule ----------------------------------------------------------------------

def check_optim(ex: Exercise, learner, path: Path, seed: int = 0,
                tolerance: float = 1e-12) -> list[CaseResult]:
    """The learner's schedule at the steps that show its shape, and three Adam updates of two
    arrays, against the library's, number for number."""
    optim = importlib.import_module(ex.module)
    results = []

    def schedule_values(schedule_cls, call=None):
        schedule = schedule_cls(d_model=512, warmup=4000)
        fn = call or type(schedule).__call__
        return numpy.array([fn(schedule, s) for s in SCHEDULE_STEPS], dtype=numpy.float64)

    result = CaseResult("the paper's schedule, d_model 512, warmup 4000", {"d": 512})
    results.append(result)
    right = schedule_values(optim.LRSchedule)
    try:
        mine = schedule_values(learner.LRSchedule)
    except Exception as exc:
        result.problem = ("not written yet: LRSchedule.__call__" if _not_written_guard(exc)
                          else where_in(exc, path))
        mine = None
    if mine is not None:
        alternatives = {m.label: schedule_values(optim.LRSchedule, edited_function(
            optim, m.function, m.old, m.new)) for m in ex.mistakes
            if m.function == "LRSchedule.__call__"}
        _compare(result, "lr", mine, right, tolerance, alternatives,
                 {"sqrt(d_model)": math.sqrt(512), "sqrt(warmup)": math.sqrt(4000)})
        if result.arrays and not result.arrays[0].ok:
            result.arrays[0].diagnosis = (result.arrays[0].diagnosis or "") + \
                f" (at steps {', '.join(map(str, SCHEDULE_STEPS))})"

    result = CaseResult("Adam, three updates of two arrays (beta1 0.9, beta2 0.98, eps 1e-9)",
                        {})
    results.append(result)
    right = _adam_run(optim.coefficients, optim.adam_step, seed)
    try:
        mine = _adam_run(learner.coefficients, learner.adam_step, seed)
    except Exception as exc:
        result.problem = (f"not written yet: {_unwritten_name(exc, ex)}"
                          if _not_written_guard(exc) else where_in(exc, path))
        return results
    alternatives = {}
    for m in ex.mistakes:
        if m.function in ("coefficients", "adam_step"):
            parts = {"coefficients": optim.coefficients, "adam_step": optim.adam_step}
            parts[m.function] = edited_function(optim, m.function, m.old, m.new)
            with numpy.errstate(all="ignore"):
                alternatives[m.label] = _adam_run(parts["coefficients"], parts["adam_step"],
                                                  seed)
    for name in right:
        _compare(result, name, mine[name], right[name], 1e-10,
                 {k: v[name] for k, v in alternatives.items()}, {"1 - beta1": 0.1})
    return results


SCHEDULE_STEPS = (1, 2, 10, 1000, 3999, 4000, 4001, 8000, 100000)


def _compare(result: CaseResult, name, mine, right, tolerance, alternatives, extra) -> None:
    mine = numpy.asarray(mine, dtype=numpy.float64) if mine is not None else None
    error = diagnose.distance(mine, right) if mine is not None else math.inf
    item = ArrayResult(name, error, error <= tolerance)
    result.arrays.append(item)
    if not item.ok:
        item.first = diagnose.first_wrong(mine, right, tolerance) if mine is not None else None
        item.diagnosis = diagnose.diagnose(name, mine, right, mistakes=alternatives,
                                           known=diagnose.quantities({}, extra))


def _adam_run(coefficients, adam_step, seed) -> dict:
    """Three Adam updates of two float64 arrays with ``coefficients`` and ``adam_step``: the
    arrays and moments after each update, and each update's step size."""
    rng = numpy.random.default_rng(seed)
    params = [rng.standard_normal((3, 4)), rng.standard_normal(5)]
    m = [numpy.zeros_like(p) for p in params]
    v = [numpy.zeros_like(p) for p in params]
    seen = {}
    for step in (1, 2, 3):
        lr = 1e-3 * step
        b1, b2, step_size, v_scale, keep = coefficients(0.9, 0.98, step, lr, 1.0)
        for i, p in enumerate(params):
            g = rng.standard_normal(p.shape)
            adam_step(p, g, m[i], v[i], b1, b2, 1e-9, step_size, v_scale)
            seen[f"update {step}: p{i}"] = p.copy()
            seen[f"update {step}: m{i}"] = m[i].copy()
            seen[f"update {step}: v{i}"] = v[i].copy()
    return seen


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
    previous = backend.name
    backend.use("numpy")
    try:
        with numpy.errstate(all="ignore"):       # a NaN is diagnosed, not warned of
            cases = check(ex, learner, path, seed)
    finally:
        if previous != backend.name:
            backend.use(previous)
    status = "pass" if all(c.ok for c in cases) else \
        "not written" if all((c.problem or "").startswith("not written") for c in cases) \
        else "fail"
    return Report(ex, path, status, cases, seconds=time.perf_counter() - started)
