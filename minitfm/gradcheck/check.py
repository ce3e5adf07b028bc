"""The finite-difference checker: five-point central differences in float64, the relative error
against a backward pass, and a case (:class:`Case`: sizes, inputs, forward, backward) run as one
check. The method and its step sizes: the package's docstring (minitfm/gradcheck/__init__.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from minitfm import backend
from minitfm.layers import attention

TOLERANCE = 1e-6
STEP = 2e-5
STEPS = (STEP, 1e-4, 4e-6, 5e-4)    # measured in this order until one agrees (package docstring)


# ---- the checker ----------------------------------------------------------------------------

def relative_error(analytic, numeric) -> float:
    """||a - n|| / max(||a||, ||n||); 0 when both are exactly zero."""
    xp = backend.xp
    a = analytic.astype(xp.float64).ravel()
    n = numeric.astype(xp.float64).ravel()
    scale = max(float(xp.linalg.norm(a)), float(xp.linalg.norm(n)))
    return 0.0 if scale == 0.0 else float(xp.linalg.norm(a - n)) / scale


def five_point(objective: Callable[[], float], move: Callable[[int], None], step: float) -> float:
    """Five-point central differences (module docstring): ``objective()`` after ``move(k)`` has
    put its input k steps from the point, k = 2, 1, -1, -2, in that order."""
    f = {}
    for k in (2, 1, -1, -2):
        move(k)
        f[k] = objective()
    return (8.0 * (f[1] - f[-1]) - (f[2] - f[-2])) / (12.0 * step)


def numerical_gradient(objective: Callable[[], float], x, step: float = STEP):
    """Five-point central differences of ``objective()`` with respect to every element of ``x``,
    perturbed in place."""
    xp = backend.xp
    if not x.flags.c_contiguous:
        raise ValueError("numerical_gradient needs a contiguous array")
    flat = x.reshape(-1)                     # a view of x
    grad = xp.zeros(x.size, dtype=xp.float64)
    for i in range(x.size):
        old = float(flat[i])

        def move(k):                         # called at once, at this i
            flat[i] = old + k * step
        grad[i] = five_point(objective, move, step)
        flat[i] = old
    return grad.reshape(x.shape)


def directional_derivative(objective: Callable[[], float], x, direction, step: float = STEP):
    """Five-point central differences of ``objective()`` along ``direction`` (an array of
    ``x``'s shape): all of ``x`` moved at once, in place, and put back."""
    start = x.copy()

    def move(k):
        x[...] = start + k * step * direction
    derivative = five_point(objective, move, step)
    x[...] = start
    return derivative


def smallest_error(error: Callable[[float], float], steps, tolerance: float) -> float:
    """``error(step)`` at each of ``steps`` (a number: that one) until one is within
    ``tolerance`` (see the module docstring); the smallest counts."""
    smallest = None
    for step in (steps,) if isinstance(steps, float) else tuple(steps):
        measured = error(step)
        smallest = measured if smallest is None else min(smallest, measured)
        if smallest <= tolerance:
            break
    return smallest


def check_gradients(objective, analytic: dict, arrays: dict, steps=STEPS,
                    tolerance: float = TOLERANCE) -> dict:
    """Relative error of each of ``analytic`` against finite differences of ``objective()``,
    which reads ``arrays`` (perturbed in place), at each of ``steps`` until one is within
    ``tolerance`` (see the module docstring); the smallest counts."""
    errors = {}
    for name, grad in analytic.items():
        def error(step):                     # called at once, for this array
            return relative_error(grad, numerical_gradient(objective, arrays[name], step))
        errors[name] = smallest_error(error, steps, tolerance)
    return errors


def check_directions(objective, analytic: dict, arrays: dict, directions: int, seed: int = 0,
                     steps=STEPS, tolerance: float = TOLERANCE) -> dict:
    """:func:`check_gradients` at a fraction of its cost: each array's gradient projected on
    ``directions`` random directions u (N(0, 1) in every element), <grad, u> against the
    difference quotient along u, four evaluations of ``objective`` a direction instead of four
    an element. The error of a direction is |<grad, u> - numeric| over the largest of the two
    and ||grad|| (the projection's typical size: a direction nearly orthogonal to the gradient
    is not mistaken for a wrong one), the worst direction counts, each at ``steps`` as there.
    A gradient wrong in a single element by d is off by ~d |u_i| along each direction, as
    visible as d is to the element-wise check; the whole-model checks take it on every run and
    the element-wise one under the slow marker."""
    xp = backend.xp
    rng = backend.host_rng(seed)
    errors = {}
    for name, grad in analytic.items():
        x, grad = arrays[name], grad.astype(xp.float64)
        units = [backend.to_device(rng.standard_normal(x.shape), dtype="float64")
                 for _ in range(directions)]
        projections = [float((grad * u).sum()) for u in units]
        size = float(xp.linalg.norm(grad))

        def error(step):                     # the worst direction; called at once
            worst = 0.0
            for u, a in zip(units, projections):
                n = directional_derivative(objective, x, u, step)
                scale = max(abs(a), abs(n), size)
                worst = max(worst, 0.0 if scale == 0.0 else abs(a - n) / scale)
            return worst
        errors[name] = smallest_error(error, steps, tolerance)
    return errors


@dataclass
class Case:
    """A row of the table. ``arrays``: the inputs by name, each drawn from a spec ("b t d":
    N(0, 1) of that shape, "hd" = h * dk, "kv" the keys; "ids v: b t": ids below v; "mask: b s":
    key padding) or by ``arrays(rng, sizes)``; ``params(sizes)``: parameter shapes, matrices times
    ``scale`` (a number, a function of the sizes, or "stack": ``random_params``); ``backward(dout,
    cache[, out])``, ``out`` as in the gradient rule of layers/__init__.py; ``d_inputs``: whose
    gradients backward returns first (None: token ids, which have none)."""

    name: str
    sizes: dict
    arrays: dict | Callable
    params: Callable | None
    forward: Callable
    backward: Callable
    d_inputs: tuple = ("x",)
    scale: float | str | Callable = 1.0
    tolerance: float = TOLERANCE
    cfg: object = None                  # a whole model's config (its rows' arrays: "a", "b")

    def draw(self, rng, sizes: dict) -> dict:      # in a fixed order: inputs, then parameters
        arrays = (self.arrays(rng, sizes) if callable(self.arrays)
                  else {name: draw(rng, sizes, spec) for name, spec in self.arrays.items()})
        shapes = self.params(sizes) if self.params is not None else {}
        if self.scale == "stack":
            return {**arrays, **random_params(rng, shapes, sizes["h"] * sizes["dk"])}
        scale = self.scale(sizes) if callable(self.scale) else self.scale
        return {**arrays, **{name: normal(rng, *shape) * (scale if len(shape) == 2 else 1.0)
                             for name, shape in shapes.items()}}

    def gradients(self, result) -> dict:          # backward's result, keyed like the arrays
        *d_inputs, grads = result
        assert len(d_inputs) == len(self.d_inputs), "one name per gradient of an input"
        return {**{n: d for n, d in zip(self.d_inputs, d_inputs) if n is not None}, **grads}


def check_case(case: Case, seed: int = 0, sizes: dict | None = None,
               names: list[str] | None = None, directions: int | None = None) -> dict:
    """Run one case in float64; return the relative error of every checked input (of the
    ``names`` among them only, where given: the same draw, at a fraction of the cost), element
    by element, or along ``directions`` random directions each (:func:`check_directions`)."""
    rng = backend.host_rng(seed)
    sizes = {**case.sizes, **(sizes or {})}
    arrays = case.draw(rng, sizes)
    out, cache = case.forward(arrays, sizes)
    g = backend.to_device(rng.standard_normal(out.shape), dtype="float64")   # dL/dout = G

    def objective():
        y, _ = case.forward(arrays, sizes)
        return float((y * g).sum())

    grads = case.gradients(case.backward(g, cache))
    if names is not None:
        grads = {name: grads[name] for name in names}
    if directions:
        return check_directions(objective, grads, arrays, directions, seed + 1,
                                tolerance=case.tolerance)
    return check_gradients(objective, grads, arrays, tolerance=case.tolerance)


# ---- drawing inputs ---------------------------------------------------------------------------

def normal(rng, *shape):
    """N(0, 1) values of ``shape``, float64 on the device."""
    return backend.to_device(rng.standard_normal(shape), dtype="float64")


def draw(rng, s: dict, spec: str):
    """An input drawn from its spec (see :class:`Case`) with the sizes ``s``."""
    kind, _, dims = spec.rpartition(":")
    alias = {"hd": ("h", "dk"), "kv": ("t" if s.get("causal") else "s",)}   # width; keys
    shape = [math.prod(s[n] for n in alias.get(k, (k,))) for k in dims.split()]
    if kind == "mask":                  # additive key padding, at least one visible key per row
        xp = backend.xp
        lengths = backend.to_device(rng.integers(1, shape[1] + 1, size=shape[0]))
        pad = xp.arange(shape[1])[None, :] >= lengths[:, None]                   # (B, L)
        return xp.where(pad, attention.MASKED, 0.0)[:, None, None, :]
    if kind:                            # "ids v"
        return backend.to_device(rng.integers(0, s[kind.split()[1]], size=shape), dtype="int64")
    return normal(rng, *shape)


def random_params(rng, shapes: dict, d_model: int) -> dict:
    """Random values, gains near 1, shifts and biases near 0, unit-scale activations."""
    return {name: (normal(rng, *shape) * 0.3 + name.endswith("gamma") if len(shape) == 1
                   else normal(rng, *shape) * d_model ** -0.5) for name, shape in shapes.items()}


