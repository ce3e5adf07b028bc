"""What is wrong with a gradient: a diagnosis computed from the learner's array and the right
one, wherever one fits. Host-only code (NumPy, float64).

For one gradient array, yours (A) against the right one (R: the library's backward on the same
inputs, itself held to finite differences by the gradient checks), in this order:

- its shape: R's transposed (a transpose), R's with more axes whose sum is R (a sum missing over
  a broadcast axis, named), or only another shape;
- values that are not finite, or all zero;
- a named mistake of the exercise: the array the library's backward gives with that mistake made
  (a term of the derivation left out or with the wrong sign, the wrong cache field), equal to A;
- a constant factor, A = c R, named where c is one of the case's quantities (2, -1, the batch
  size, the number of heads, sqrt(d_k), 1/(1 - p), ...);
- a transpose or a swap of two axes, A = R with two axes swapped;
- another gradient's place: A = the right gradient of another input (two swapped);
- else: how many elements are wrong, so that a learner sees whether it is everywhere or a few.

Two arrays are "equal" here when their relative distance (:func:`distance`) is below
:data:`SAME`, far below any real mistake and far above float64 rounding.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy

__all__ = ["SAME", "distance", "Quantity", "quantities", "diagnose", "first_wrong"]

SAME = 1e-7


def distance(a, b) -> float:
    """||a - b|| / max(||a||, ||b||) in float64; 0 when both are zero, inf for other shapes."""
    a, b = numpy.asarray(a, dtype=numpy.float64), numpy.asarray(b, dtype=numpy.float64)
    if a.shape != b.shape:
        return math.inf
    scale = max(float(numpy.linalg.norm(a)), float(numpy.linalg.norm(b)))
    if not math.isfinite(scale):
        return math.inf
    return 0.0 if scale == 0.0 else float(numpy.linalg.norm(a - b)) / scale


@dataclass(frozen=True)
class Quantity:
    """A number of the case, by name: ``value``, and what it is (``"the number of heads h"``)."""
    value: float
    name: str


SIZE_NAMES = {"b": "the batch size b", "t": "the length t", "s": "the source length s",
              "h": "the number of heads h", "dk": "d_k", "d": "d_model", "f": "d_ff",
              "n": "the number of rows n", "v": "the vocabulary size V"}



def quantities(sizes: dict, extra: dict | None = None) -> list[Quantity]:
    """The case's named quantities: its sizes, a few products and roots of them, and
    ``extra`` (name -> value: a dropout's 1 / (1 - p), a softmax's scale)."""
    found = [Quantity(2.0, "2")]
    for key, name in SIZE_NAMES.items():
        value = sizes.get(key)
        if isinstance(value, int) and value > 1:
            found.append(Quantity(float(value), name))
    if sizes.get("dk", 0) > 1:
        found.append(Quantity(math.sqrt(sizes["dk"]), "sqrt(d_k)"))
    if sizes.get("d", 0) > 1:
        found.append(Quantity(math.sqrt(sizes["d"]), "sqrt(d_model)"))
    if "h" in sizes and "dk" in sizes:
        found.append(Quantity(math.sqrt(sizes["h"] * sizes["dk"]), "sqrt(d_model)"))
    if sizes.get("b", 0) > 1 and sizes.get("t", 0) > 1:
        found.append(Quantity(float(sizes["b"] * sizes["t"]), "the rows b*t"))
    for name, value in (extra or {}).items():
        found.append(Quantity(float(value), name))
    return found


def _factor(c: float, known: list[Quantity]) -> str:
    """Words for A = c R."""
    def near(x, y):
        return abs(x - y) <= 1e-6 * max(abs(x), abs(y))

    def named(names, number):
        names = list(dict.fromkeys(names))
        lead = names[0] if names[0] == f"{number:g}" or len(names) == 1 else f"{number:.6g}"
        rest = [n for n in names if n != lead]
        return lead + (f" (= {' = '.join(rest)})" if rest else "")

    times = f"a constant factor: yours is {c:.6g} times the right gradient"
    if near(c, -1.0):
        return "the wrong sign: yours is -1 times the right gradient"
    for sign, signed in ((1.0, ""), (-1.0, ", and the wrong sign")):
        missing = [q.name for q in known if near(c, sign / q.value)]
        if missing:
            return (f"{times}: a factor {named(missing, sign / c)} missing, or divided where it "
                    f"should multiply{signed}")
        too_many = [q.name for q in known if near(c, sign * q.value)]
        if too_many:
            return f"{times}: a factor {named(too_many, sign * c)} too many{signed}"
        squared = [q.name for q in known if near(c, sign * q.value ** 2) and q.value ** 2 != 4]
        if squared:
            return f"{times}: {squared[0]} squared, applied twice{signed}"
    return times


def _axes_words(axes: tuple[int, ...], names: tuple[str, ...] | None) -> str:
    text = "axis " + str(axes[0]) if len(axes) == 1 else "axes " + ", ".join(map(str, axes))
    if names:
        text += f" ({', '.join(names[a] for a in axes if a < len(names))})"
    return text


def _shape_words(a, r, axis_names) -> str:
    """A diagnosis of an array of another shape than R's."""
    if a.ndim == r.ndim == 2 and a.shape == r.shape[::-1]:
        if distance(a.T, r) < SAME:
            return (f"a transpose: yours has shape {a.shape} where {r.shape} is expected, and "
                    f"its transpose is the right gradient")
        return (f"shape {a.shape} where {r.shape} is expected (transposed), and its values are "
                f"wrong as well")
    if sorted(a.shape) == sorted(r.shape) and a.ndim == r.ndim:
        for order in itertools.permutations(range(a.ndim)):
            if tuple(a.shape[i] for i in order) == r.shape \
                    and distance(a.transpose(order), r) < SAME:
                return (f"axes in the wrong order: yours has shape {a.shape} where {r.shape} is "
                        f"expected; transposed by {order} it is the right gradient")
    if a.ndim > r.ndim and a.shape[a.ndim - r.ndim:] == r.shape:
        axes = tuple(range(a.ndim - r.ndim))
        summed = a.sum(axis=axes)
        right = distance(summed, r) < SAME
        return (f"a sum missing over {_axes_words(axes, axis_names)}: yours has shape {a.shape} "
                f"where {r.shape} is expected (a parameter used by every row gets the sum of "
                f"the rows' gradients)" + ("; summed, it is right" if right
                                           else "; summed, it is still wrong"))
    if a.ndim == r.ndim and all(x == y or y == 1 for x, y in zip(a.shape, r.shape)):
        axes = tuple(i for i, (x, y) in enumerate(zip(a.shape, r.shape)) if x != y)
        right = distance(a.sum(axis=axes, keepdims=True), r) < SAME
        return (f"a sum missing over {_axes_words(axes, axis_names)}: yours has shape {a.shape} "
                f"where {r.shape} is expected" + ("; summed, it is right" if right
                                                  else "; summed, it is still wrong"))
    if a.size < r.size:
        return (f"shape {a.shape} where {r.shape} is expected: summed or indexed over an axis "
                f"too many?")
    return f"shape {a.shape} where {r.shape} is expected"


def diagnose(name: str, a, r, *, others: dict | None = None, mistakes: dict | None = None,
             known: list[Quantity] | None = None, axis_names: tuple[str, ...] | None = None
             ) -> str | None:
    """Words for what is wrong with gradient ``name``, yours ``a`` against the right ``r``
    (None where it is right); ``others``: the right gradients of the other inputs, by name;
    ``mistakes``: label -> the array a named mistake gives; ``known``: the case's quantities;
    ``axis_names``: what each axis of the array is ("b", "t", "d")."""
    if a is None:
        return "missing: your backward gives None for it"
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        return f"not an array: your backward gives a {type(a).__name__} for it"
    a, r = numpy.asarray(a), numpy.asarray(r)
    if a.dtype.kind not in "fc":
        return f"an array of {a.dtype}: a gradient is an array of floats"
    if a.shape != r.shape:
        return _shape_words(a.astype(numpy.float64), r.astype(numpy.float64), axis_names)
    a, r = a.astype(numpy.float64), r.astype(numpy.float64)
    if not numpy.isfinite(a).all():
        bad = numpy.argwhere(~numpy.isfinite(a))[0]
        return (f"not finite: {int((~numpy.isfinite(a)).sum())} of {a.size} elements are NaN or "
                f"infinite, the first at {tuple(int(i) for i in bad)} (a division by zero, or "
                f"the log or sqrt of a negative number?)")
    if distance(a, r) < SAME:
        return None
    if not a.any():
        return "all zero: nothing was written into it (or everything was masked)"
    for label, wrong in (mistakes or {}).items():
        if wrong is not None and getattr(wrong, "shape", None) == a.shape \
                and distance(a, wrong) < SAME:
            return label
    rr = float((r * r).sum())
    if rr > 0:
        c = float((a * r).sum()) / rr
        if c != 0 and distance(a, c * r) < SAME:
            return _factor(c, known or [])
    if a.ndim >= 2:
        for i, j in itertools.combinations(range(a.ndim), 2):
            if a.shape[i] == a.shape[j] and distance(a, r.swapaxes(i, j)) < SAME:
                what = "a transpose" if a.ndim == 2 else f"axes {i} and {j} swapped"
                return f"{what}: swapped back, yours is the right gradient"
    for other, right in (others or {}).items():
        if other != name and getattr(right, "shape", None) == a.shape \
                and distance(a, right) < SAME:
            return (f"it is the right gradient of {other}: two gradients swapped, or returned "
                    f"in the wrong order")
    wrong = ~numpy.isclose(a, r, rtol=1e-6, atol=1e-9 * max(float(numpy.abs(r).max()), 1e-300))
    count = int(wrong.sum())
    if count < a.size:
        return (f"{count} of {a.size} elements are wrong, the others right (a mask, an index or "
                f"a row that is handled differently?)")
    return None


def first_wrong(a, numeric, tolerance: float):
    """The first element (in C order) where ``a`` and the finite differences ``numeric`` part:
    ``(index, yours, numerical)``, or None."""
    a, n = numpy.asarray(a, dtype=numpy.float64), numpy.asarray(numeric, dtype=numpy.float64)
    if a.shape != n.shape:
        return None
    scale = max(float(numpy.abs(n).max(initial=0.0)), float(numpy.abs(a).max(initial=0.0)))
    off = ~(numpy.abs(a - n) <= max(tolerance * scale, 1e-12))
    if not off.any():
        return None
    index = tuple(int(i) for i in numpy.argwhere(off)[0])
    return index, float(a[index]), float(n[index])
