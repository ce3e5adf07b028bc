"""Where a wrong gradient is wrong, in words: which of its elements (rows, positions, heads,
sequences of the batch, steps), under which of the case's masks (:class:`Region`: the keys the
padding mask hides, the elements dropout dropped, the units the ReLU turned off, the padding
rows of a loss), or the whole array shifted along an axis. What is said is what the arrays show,
never a guess at a cause the arrays do not show. Host-only code (NumPy)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy

__all__ = ["Region", "where", "shift", "indices_words"]

# what an axis of an array is, by the letter of its spec ("b t d"): the noun of one index
AXIS_NOUNS = {"b": "sequence", "t": "position", "s": "source position", "kv": "key",
              "h": "head", "n": "row", "v": "class", "d": "feature", "dk": "feature",
              "hd": "feature", "f": "unit"}


@dataclass(frozen=True)
class Region:
    """Elements of a case picked out by one of its masks: ``words`` say which ("where the
    padding mask hides keys"); ``mask`` is True there; ``axes`` name its axes by the letters of
    the arrays' specs (("b", "kv")), so that it lines up with any array that has those axes, or
    None: it has the shape of the arrays it is meant for, or of their leading axes (a mask of
    rows)."""
    words: str
    mask: object
    axes: tuple[str, ...] | None = None


def _plural(noun: str, count: int) -> str:
    if count == 1:
        return noun
    irregular = {"index": "indices", "class": "classes"}
    return irregular.get(noun, noun + "s")


def _joined(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def indices_words(found: list[int], values=None) -> str:
    """Indices in words, runs of consecutive ones as ranges ("0 and 3 to 6"); ``values``: what
    each index is called (the steps of a schedule), listed as they are."""
    if values is not None:
        shown = [f"{values[i]:g}" if isinstance(values[i], float) else str(values[i])
                 for i in found]
        return _joined(shown if len(shown) <= 8 else shown[:7] + [f"{len(shown) - 7} more"])
    runs: list[list[int]] = []
    for i in found:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    items = [f"{r[0]} to {r[-1]}" if len(r) > 2 else str(i) for r in runs
             for i in (r[:1] if len(r) > 2 else r)]
    if len(items) > 8:
        return f"{len(found)} of them, from {found[0]} to {found[-1]}"
    return _joined(items)


IN = {"b", "h", "n", "row"}          # "only in rows 1 and 3", but "only at positions 3 and 4"


def _axis_words(axis: int, ndim: int, found: list[int], axis_names, labels) -> str:
    """"in the first sequence of the batch (b = 0)", "at positions 3 and 4", "at steps 4001
    and 8000"."""
    return ("only in " if _name_of(axis, axis_names, labels) in IN else "only at ") + \
        _indices_named(axis, ndim, found, axis_names, labels)


def _name_of(axis: int, axis_names, labels) -> str | None:
    """The letter of an axis ("b"), "row" for an unnamed first axis, else None."""
    if labels and axis in labels:
        return None
    if axis_names and axis < len(axis_names):
        return axis_names[axis]
    return "row" if axis == 0 else None


def _indices_named(axis: int, ndim: int, found: list[int], axis_names, labels) -> str:
    """Indices of an axis with the axis's noun: "positions 3 and 4 (t)", "rows 0 and 2"."""
    if labels and axis in labels:
        noun, values = labels[axis]
        return f"{_plural(noun, len(found))} {indices_words(found, values)}"
    name = axis_names[axis] if axis_names and axis < len(axis_names) else None
    if name == "b" and found == [0]:
        return "the first sequence of the batch (b = 0)"
    if name in AXIS_NOUNS:
        noun = AXIS_NOUNS[name]
        suffix = " of the batch" if name == "b" else ""
        return f"{_plural(noun, len(found))} {indices_words(found)}{suffix} ({name})"
    if axis == 0:
        return f"{_plural('row', len(found))} {indices_words(found)}"
    if axis == 1 and ndim == 2:
        return f"{_plural('column', len(found))} {indices_words(found)}"
    return f"{_plural('index', len(found))} {indices_words(found)} of axis {axis}"


def _aligned(region: Region, shape: tuple, axis_names) -> numpy.ndarray | None:
    """The region's mask broadcast over an array of ``shape`` whose axes are ``axis_names``, or
    None where it does not line up."""
    mask = numpy.asarray(region.mask, dtype=bool)
    if region.axes is None:             # the array's shape, or its leading axes (rows)
        if mask.shape != shape[:mask.ndim]:
            return None
        return numpy.broadcast_to(mask.reshape(mask.shape + (1,) * (len(shape) - mask.ndim)),
                                  shape)
    if not axis_names or len(axis_names) != len(shape) \
            or any(axis_names.count(a) != 1 for a in region.axes):
        return None
    order = sorted(range(len(region.axes)), key=lambda i: axis_names.index(region.axes[i]))
    mask = mask.transpose(order)
    kept = [region.axes[i] for i in order]
    expanded = [shape[k] if axis_names[k] in kept else 1 for k in range(len(shape))]
    if [s for s, a in zip(expanded, axis_names) if a in kept] != list(mask.shape):
        return None
    return numpy.broadcast_to(mask.reshape(expanded), shape)


def _region(wrong, regions, axis_names) -> tuple | None:
    """The smallest region the wrong elements all lie in (but not the whole array): its words
    and its mask over the array."""
    best = None
    for region in regions or []:
        mask = _aligned(region, wrong.shape, axis_names)
        if mask is None or mask.all() or not mask.any() or (wrong & ~mask).any():
            continue
        if best is None or mask.sum() < best[1].sum():
            best = region, mask
    if best is None:
        return None
    return best[0].words, best[1]


def where(a, r, axis_names=None, regions=None, labels=None, equal=None, factor=None
          ) -> str | None:
    """How many elements of ``a`` are wrong against ``r``, and where: None where all are.
    ``equal(x, y)``: whether two arrays are equal; ``factor(c)``: what a factor is, or None
    (for the words on yours where it is wrong: zero, or a constant times the right values)."""
    scale = max(float(numpy.abs(r).max(initial=0.0)), 1e-300)
    wrong = ~numpy.isclose(a, r, rtol=1e-6, atol=1e-9 * scale)
    count = int(wrong.sum())
    if count == a.size or count == 0:
        return None
    region = _region(wrong, regions, axis_names)
    said, box = [], numpy.ones(wrong.shape, dtype=bool)    # the rows, columns, ... of the wrong
    for axis in range(wrong.ndim):
        others = tuple(i for i in range(wrong.ndim) if i != axis)
        hit = wrong.any(axis=others)
        box &= hit.reshape([-1 if i == axis else 1 for i in range(wrong.ndim)])
        found = [int(i) for i in numpy.flatnonzero(hit)]
        if 1 < wrong.shape[axis] and len(found) < wrong.shape[axis]:
            said.append(_axis_words(axis, wrong.ndim, found, axis_names, labels))
    if region is not None:
        words, mask = region
        if (wrong == mask).all():
            said = [f"wrong exactly {words}"]
        elif (box & ~mask).any():           # not said already by the rows, columns, ...
            said.insert(0, f"wrong only {words}")
    said = said[:2] + [w for w in [_there(a[wrong], r[wrong], equal, factor)] if w]
    text = f"{count} of {a.size} elements {'is' if count == 1 else 'are'} wrong, the others right"
    return text + (": " + "; ".join(said) if said else "")


def _there(a, r, equal, factor) -> str | None:
    """Words for the wrong elements ``a`` (the right ones ``r``) where they are zero, or a
    constant times the right ones."""
    rr = float((r * r).sum())
    if equal is None or rr == 0.0:
        return None
    c = float((a * r).sum()) / rr
    if not equal(a, c * r):
        return None
    if abs(c) < 1e-12:
        return "yours is 0 there"
    if abs(c + 1.0) < 1e-6 and a.size > 1:
        return "yours has the wrong sign there"
    named = factor(c) if factor else None
    if not named and a.size < 3:        # one or two numbers are some factor of any others
        return None
    return f"yours is {c:.6g} times the right value there" + (f" ({named})" if named else "")


def _shifted(r, k: int, axis: int, wrap: bool):
    if wrap:
        return numpy.roll(r, k, axis=axis)
    out = numpy.zeros_like(r)
    src = [slice(None)] * r.ndim
    dst = [slice(None)] * r.ndim
    src[axis], dst[axis] = (slice(None, -k), slice(k, None)) if k > 0 else \
        (slice(-k, None), slice(None, k))
    out[tuple(dst)] = r[tuple(src)]
    return out


def shift(a, r, axis_names, labels, equal) -> str | None:
    """Words for ``a`` equal to ``r`` shifted by one or two along an axis (with its end rolled
    round or zero), or None; ``equal(x, y)``: whether two arrays are equal."""
    for axis in range(a.ndim):
        if a.shape[axis] < 3 or (labels and axis in labels):
            continue
        for k in (1, -1, 2, -2):
            for wrap in (True, False):
                moved = _shifted(r, k, axis, wrap)
                if not equal(moved, r) and equal(a, moved):
                    name = axis_names[axis] if axis_names and axis < len(axis_names) else None
                    noun = AXIS_NOUNS.get(name, "row" if axis == 0 else f"index of axis {axis}")
                    return (f"shifted by {abs(k)} along axis {axis}" +
                            (f" ({name})" if name else "") + f": yours at {noun} i is the right "
                            f"gradient at {noun} i {'-' if k > 0 else '+'} {abs(k)} (an index "
                            f"or an offset off by {abs(k)})")
    return None
