"""What is wrong with a gradient: a diagnosis computed from the learner's array and the right
one, wherever one fits. Host-only code (NumPy, float64).

For one gradient array, yours (A) against the right one (R: the library's backward on the same
inputs, itself held to finite differences by the gradient checks), in this order:

- its shape: another input's right gradient (two swapped), R's transposed (a transpose), R's
  with more axes whose sum is R (a sum missing over a broadcast axis, named), or only another
  shape;
- a named mistake of the exercise that gives all of the learner's arrays: the array the
  library's code gives with that mistake made (a mask inverted, a constant off, the wrong cache
  field, ...), equal to A;
- values that are not finite; all zero;
- a constant factor, A = c R, named where c is one of the case's quantities (2, -1, the batch
  size, the number of heads, sqrt(d_k), 1/(1 - p), ...);
- a term of the derivation off: with T_k the share of term k in R (R less the library's result
  with term k left out), A = R + x T_k names term k missing (x = -1), with the wrong sign (-2),
  counted twice (1) or scaled by another factor; two terms off at once are found the same way;
- another gradient's place: A = the right gradient of another input, or the gradient the
  backward was given, passed through;
- two named mistakes made at once (``more``: computed only where nothing above fits);
- R shifted by one or two along an axis (an index or an offset off by one);
- a transpose or a swap of two axes, A = R with two axes swapped;
- a named mistake that gives A but not the learner's other arrays (said so);
- else: how many elements are wrong and where (:mod:`minitfm.learn.locate`: which rows,
  positions, heads, under which of the case's masks, and what yours is there), never a guess
  at a cause the arrays do not show.

Two arrays are "equal" here when their relative distance (:func:`distance`) is below
:data:`EQUAL_WITHIN`, far below any real mistake and far above float64 rounding (a kernel's float32
outputs, summed in another order, are compared more loosely: ``same``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy

from minitfm.learn import locate

__all__ = ["EQUAL_WITHIN", "distance", "equal", "Quantity", "quantities", "Term", "diagnose",
           "first_wrong", "PASSED_THROUGH", "OTHER_GRADIENT"]

EQUAL_WITHIN = 1e-7     # relative distance below which two float64 arrays are the same here
PASSED_THROUGH = "dy"           # the name ``others`` gives the gradient a backward was given
OTHER_GRADIENT = "it is the right gradient of"      # how a swapped gradient's diagnosis starts


def distance(a, b) -> float:
    """||a - b|| / max(||a||, ||b||) in float64; 0 when both are zero, inf for other shapes."""
    a, b = numpy.asarray(a, dtype=numpy.float64), numpy.asarray(b, dtype=numpy.float64)
    if a.shape != b.shape:
        return math.inf
    scale = max(float(numpy.linalg.norm(a)), float(numpy.linalg.norm(b)))
    if not math.isfinite(scale):
        return math.inf
    return 0.0 if scale == 0.0 else float(numpy.linalg.norm(a - b)) / scale


def equal(a, b, same: float = EQUAL_WITHIN) -> bool:
    """Whether two arrays are equal here: the same shape, NaN and infinities in the same
    places, and the rest within ``same`` of each other (:func:`distance`)."""
    a, b = numpy.asarray(a, dtype=numpy.float64), numpy.asarray(b, dtype=numpy.float64)
    if a.shape != b.shape:
        return False
    finite = numpy.isfinite(a)
    if not (finite == numpy.isfinite(b)).all():
        return False
    if not finite.all():
        if not numpy.array_equal(a[~finite], b[~finite], equal_nan=True):
            return False
        a, b = a[finite], b[finite]
    return distance(a, b) < same


@dataclass(frozen=True)
class Quantity:
    """A number of the case, by name: ``value``, and what it is (``"the number of heads h"``)."""
    value: float
    name: str


SIZE_NAMES = {"b": "the batch size b", "t": "the length t", "s": "the source length s",
              "h": "the number of heads h", "dk": "d_k", "d": "d_model", "f": "d_ff",
              "n": "the number of rows n", "v": "the vocabulary size V",
              "batch": "the batch size", "src_len": "the source length",
              "tgt_len": "the target length"}


def quantities(sizes: dict, extra: dict | None = None) -> list[Quantity]:
    """The case's named quantities: its sizes, a few products, ratios and roots of them, and
    ``extra``: name -> value (a dropout's 1 / (1 - p), a softmax's scale), or a size's key ->
    its name where the size is not what :data:`SIZE_NAMES` says (a stack's ``n``, the number of
    layers)."""
    extra = dict(extra or {})
    names = {**SIZE_NAMES, **{k: v for k, v in extra.items() if isinstance(v, str)}}
    found = [Quantity(2.0, "2")]
    for key, name in names.items():
        value = sizes.get(key)
        if isinstance(value, int) and value > 1:
            found.append(Quantity(float(value), name))
    if sizes.get("dk", 0) > 1:
        found.append(Quantity(math.sqrt(sizes["dk"]), "sqrt(d_k)"))
    if sizes.get("d", 0) > 1:
        found.append(Quantity(math.sqrt(sizes["d"]), "sqrt(d_model)"))
        found.append(Quantity(sizes["d"] / (sizes["d"] - 1), "d/(d - 1)"))
    if sizes.get("v", 0) > 1:
        found.append(Quantity(sizes["v"] / (sizes["v"] - 1), "V/(V - 1)"))
    if "h" in sizes and "dk" in sizes:
        found.append(Quantity(math.sqrt(sizes["h"] * sizes["dk"]), "sqrt(d_model)"))
    if sizes.get("b", 0) > 1 and sizes.get("t", 0) > 1:
        found.append(Quantity(float(sizes["b"] * sizes["t"]), "the rows b*t"))
    for name, value in extra.items():
        if not isinstance(value, str):
            found.append(Quantity(float(value), name))
    return found


def _near(x: float, y: float) -> bool:
    return abs(x - y) <= 1e-6 * max(abs(x), abs(y))


def _named(names: list[str], number: float) -> str:
    """"2 (= the batch size b)", "2.64575 (= sqrt(d_k))": the number, then its names."""
    lead = f"{number:.6g}"
    rest = [n for n in dict.fromkeys(names) if n != lead]
    return lead + (f" (= {' = '.join(rest)})" if rest else "")


def _factor_words(c: float, known: list[Quantity]) -> str | None:
    """What a factor c is, of the case's quantities: "a factor 2 too many", "a factor sqrt(d_k)
    missing, ...", or None."""
    for sign, signed in ((1.0, ""), (-1.0, ", and the wrong sign")):
        missing = [q.name for q in known if _near(c, sign / q.value)]
        if missing:
            return (f"a factor {_named(missing, sign / c)} missing, or divided where it should "
                    f"multiply{signed}")
        too_many = [q.name for q in known if _near(c, sign * q.value)]
        if too_many:
            return f"a factor {_named(too_many, sign * c)} too many{signed}"
        squared = [q.name for q in known if _near(c, sign * q.value ** 2) and q.value ** 2 != 4]
        if squared:
            return f"{squared[0]} squared, applied twice{signed}"
    return None


def _factor(c: float, known: list[Quantity], noun: str) -> str:
    """Words for A = c R (``noun``: what R is, "gradient")."""
    if _near(c, -1.0):
        return f"the wrong sign: yours is -1 times the right {noun}"
    times = f"a constant factor: yours is {c:.6g} times the right {noun}"
    words = _factor_words(c, known)
    return f"{times}: {words}" if words else times


# ---- the terms of a derivation --------------------------------------------------------------

@dataclass(frozen=True)
class Term:
    """A term of the derivation: ``name`` ("term 2 of dx"), ``about`` (what it is: "-mean(g),
    the path through the mean mu") and ``share``, its part of the right gradient."""
    name: str
    about: str
    share: object


def _coefficient_words(c: float, term: Term, known: list[Quantity]) -> str:
    if _near(c + 1.0, 1.0) or abs(c) < 1e-9:
        return f"{term.name} is missing"
    if _near(c, -1.0):
        return f"{term.name} has the wrong sign"
    if _near(c, 2.0):
        return f"{term.name} is counted twice"
    words = _factor_words(c, known)
    return f"{term.name} is {c:.6g} times the right one" + (f" ({words})" if words else "")


def _terms(a, r, terms: list[Term], known: list[Quantity], same: float) -> str | None:
    """A = R + sum_k x_k T_k over one term, then over two: the terms off, in words."""
    d = a - r
    usable = [t for t in terms if getattr(t.share, "shape", None) == a.shape
              and numpy.any(t.share)]
    for term in usable:
        tt = float((term.share * term.share).sum())
        x = float((d * term.share).sum()) / tt
        if distance(a, r + x * term.share) < same:
            return f"{_coefficient_words(1.0 + x, term, known)}: {term.about}"
    for one, two in itertools.combinations(usable, 2):
        basis = numpy.stack([one.share.ravel(), two.share.ravel()], axis=1)
        gram = basis.T @ basis
        if abs(numpy.linalg.det(gram)) <= 1e-6 * gram[0, 0] * gram[1, 1]:
            continue                                    # (nearly) the same direction
        x = numpy.linalg.solve(gram, basis.T @ d.ravel())
        if distance(a, r + x[0] * one.share + x[1] * two.share) < same:
            return (f"two terms are off: {_coefficient_words(1.0 + x[0], one, known)}, and "
                    f"{_coefficient_words(1.0 + x[1], two, known)} ({one.about}; {two.about})")
    return None


# ---- shapes -----------------------------------------------------------------------------------

def _axes_words(axes: tuple[int, ...], names: tuple[str, ...] | None) -> str:
    text = "axis " + str(axes[0]) if len(axes) == 1 else "axes " + ", ".join(map(str, axes))
    if names:
        text += f" ({', '.join(names[a] for a in axes if a < len(names))})"
    return text


def _shape_words(a, r, axis_names) -> str:
    """A diagnosis of an array of another shape than R's."""
    if a.ndim == r.ndim == 2 and a.shape == r.shape[::-1]:
        if distance(a.T, r) < EQUAL_WITHIN:
            return (f"a transpose: yours has shape {a.shape} where {r.shape} is expected, and "
                    f"its transpose is the right gradient")
        return (f"shape {a.shape} where {r.shape} is expected (transposed), and its values are "
                f"wrong as well")
    if sorted(a.shape) == sorted(r.shape) and a.ndim == r.ndim:
        for order in itertools.permutations(range(a.ndim)):
            if tuple(a.shape[i] for i in order) == r.shape \
                    and distance(a.transpose(order), r) < EQUAL_WITHIN:
                return (f"axes in the wrong order: yours has shape {a.shape} where {r.shape} is "
                        f"expected; transposed by {order} it is the right gradient")
    if a.ndim > r.ndim and a.shape[a.ndim - r.ndim:] == r.shape:
        axes = tuple(range(a.ndim - r.ndim))
        right = distance(a.sum(axis=axes), r) < EQUAL_WITHIN
        return (f"a sum missing over {_axes_words(axes, axis_names)}: yours has shape {a.shape} "
                f"where {r.shape} is expected (a parameter used by every row gets the sum of "
                f"the rows' gradients)" + ("; summed, it is right" if right
                                           else "; summed, it is still wrong"))
    if a.ndim == r.ndim and all(x == y or y == 1 for x, y in zip(a.shape, r.shape)):
        axes = tuple(i for i, (x, y) in enumerate(zip(a.shape, r.shape)) if x != y)
        right = distance(a.sum(axis=axes, keepdims=True), r) < EQUAL_WITHIN
        return (f"a sum missing over {_axes_words(axes, axis_names)}: yours has shape {a.shape} "
                f"where {r.shape} is expected" + ("; summed, it is right" if right
                                                  else "; summed, it is still wrong"))
    if a.size < r.size:
        return (f"shape {a.shape} where {r.shape} is expected: summed or indexed over an axis "
                f"too many?")
    return f"shape {a.shape} where {r.shape} is expected"


# ---- the diagnosis ----------------------------------------------------------------------------

def _named_mistake(a, mistakes: dict | None, same: float) -> str | None:
    for label, wrong in (mistakes or {}).items():
        if wrong is not None and getattr(wrong, "shape", None) == a.shape \
                and equal(a, wrong, same):
            return label
    return None


def diagnose(name: str, a, r, *, others: dict | None = None, mistakes: dict | None = None,
             terms: list[Term] | None = None, known: list[Quantity] | None = None,
             axis_names: tuple[str, ...] | None = None, regions: list | None = None,
             labels: dict | None = None, more=None, partly: dict | None = None,
             same: float = EQUAL_WITHIN, noun: str = "gradient") -> str | None:
    """Words for what is wrong with gradient ``name``, yours ``a`` against the right ``r``
    (None where it is right); ``others``: the right gradients of the other inputs, by name (and
    :data:`PASSED_THROUGH`: the gradient the backward was given); ``mistakes``: label -> the
    array a named mistake gives; ``terms``: the derivation's terms (:class:`Term`); ``known``:
    the case's quantities; ``axis_names``: what each axis of the array is ("b", "t", "d");
    ``regions`` and ``labels``: where the case's masks hide elements, and what an axis's
    indices are called (:func:`minitfm.learn.locate.where`); ``more``: a function giving more
    named mistakes (label -> array: two made at once), asked only where nothing above fits;
    ``partly``: named mistakes that give this array but not the learner's others, named only
    where nothing else fits; ``same``: how near two arrays are equal (:func:`equal`); ``noun``:
    what the array is, in the words ("gradient", "output")."""
    if a is None:
        return "missing: your backward gives None for it"
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        return f"not an array: your backward gives a {type(a).__name__} for it"
    a, r = numpy.asarray(a), numpy.asarray(r)
    if a.dtype.kind not in "fc":
        return f"an array of {a.dtype}: a gradient is an array of floats"
    if a.shape != r.shape:
        return _other(name, a, others, same) or _shape_words(
            a.astype(numpy.float64), r.astype(numpy.float64), axis_names)
    a, r = a.astype(numpy.float64), r.astype(numpy.float64)
    named = _named_mistake(a, mistakes, same)
    if named:
        return named
    if not numpy.isfinite(a).all():
        bad = numpy.argwhere(~numpy.isfinite(a))[0]
        return (f"not finite: {int((~numpy.isfinite(a)).sum())} of {a.size} elements are NaN or "
                f"infinite, the first at {tuple(int(i) for i in bad)} (a division by zero, or "
                f"the log or sqrt of a negative number?)")
    if distance(a, r) < same:
        return None
    if not a.any():
        return "all zero: nothing was written into it"
    rr = float((r * r).sum())
    if rr > 0:
        c = float((a * r).sum()) / rr
        if c != 0 and distance(a, c * r) < same:
            return _factor(c, known or [], noun)
    def close(x, y):
        return distance(x, y) < same
    found = _terms(a, r, terms or [], known or [], same) or _other(name, a, others, same)
    found = found or (more and _named_mistake(a, more(), same))
    found = found or locate.shift(a, r, axis_names, labels, close)
    if found:
        return found
    if a.ndim >= 2:
        for i, j in itertools.combinations(range(a.ndim), 2):
            if a.shape[i] == a.shape[j] and close(a, r.swapaxes(i, j)):
                what = "a transpose" if a.ndim == 2 else f"axes {i} and {j} swapped"
                return f"{what}: swapped back, yours is the right {noun}"
    named = _named_mistake(a, partly, same)
    if named:
        return f"{named} (so this array says; your others are not as that mistake makes them)"
    return locate.where(a, r, axis_names, regions, labels, close,
                        lambda c: _factor_words(c, known or []))


def _other(name: str, a, others: dict | None, same: float) -> str | None:
    """Words for ``a`` equal to the right gradient of another input, or to the gradient the
    backward was given."""
    for other, right in (others or {}).items():
        if other != name and getattr(right, "shape", None) == a.shape \
                and distance(a, right) < same:
            if other == PASSED_THROUGH:
                return (f"it is {PASSED_THROUGH}, the gradient your backward was given, passed "
                        f"through unchanged")
            return (f"{OTHER_GRADIENT} {other}: two gradients swapped, or returned in the "
                    f"wrong order")
    return None


def first_wrong(a, numeric, tolerance: float):
    """The first element (in C order) where ``a`` and the finite differences ``numeric`` part:
    ``(index, yours, numerical)``, or None."""
    a, n = numpy.asarray(a, dtype=numpy.float64), numpy.asarray(numeric, dtype=numpy.float64)
    if a.shape != n.shape:
        return None
    scale = max(float(numpy.abs(n).max(initial=0.0)), float(numpy.abs(a).max(initial=0.0)))
    with numpy.errstate(invalid="ignore"):
        off = ~(numpy.abs(a - n) <= max(tolerance * scale, 1e-12))
    if not off.any():
        return None
    index = tuple(int(i) for i in numpy.argwhere(off)[0])
    return index, float(a[index]), float(n[index])
