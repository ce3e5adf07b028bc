"""Named arrays that are views into one contiguous buffer.

A model is a dict of named arrays; so are its gradients and Adam's two moments. Updating ~200
separate arrays costs ~200 small array operations per step for every elementwise pass (on a GPU,
~200 kernel launches). With every array of the dict a view into one 1-D ``buffer``

    buffer  [ emb ........ | enc.0.attn.w_qkv ...... | enc.0.attn.b_qkv | ... ]
    views   params["emb"] = buffer[0 : V*d].reshape(V, d), and so on, in the dict's order

the whole-model passes -- Adam, gradient clipping, accumulating gradients over micro-batches,
the finite check, averaging checkpoints -- are a handful of operations on ``buffer``, while the
layers, checkpoints and gradient checks still see a plain ``dict[str, array]``.

:class:`FlatDict` is that dict: ``flat["emb"]`` is a view, ``flat.buffer`` the 1-D array behind
all of them. Assigning to an existing name copies into its view (``flat[name] = value`` means
``flat[name][...] = value``), so the views and the buffer never drift apart; new names are refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from minitfm import backend

__all__ = ["FlatDict", "zeros", "flatten", "zeros_like", "buffer_of", "add_into", "to_host"]


class FlatDict(dict):
    """A ``dict[str, array]`` whose arrays are consecutive views into ``self.buffer`` (1-D)."""

    def __init__(self, buffer, shapes: Iterable[tuple[str, tuple[int, ...]]]):
        super().__init__()
        offset = 0
        for name, shape in shapes:
            size = math.prod(shape)
            dict.__setitem__(self, name, buffer[offset:offset + size].reshape(shape))
            offset += size
        if offset != buffer.shape[0]:
            raise ValueError(f"the shapes hold {offset} numbers but the buffer has {buffer.shape[0]}")
        self.buffer = buffer

    def __setitem__(self, name, value):
        if name not in self:
            raise KeyError(f"{name!r} is not one of the arrays of this flat buffer: its layout is "
                           f"fixed when it is made (build a new one with minitfm.flat.flatten)")
        self[name][...] = value

    def __delitem__(self, name):
        raise TypeError("the arrays of a flat buffer cannot be removed")

    def shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(name, tuple(array.shape)) for name, array in self.items()]


def zeros(shapes: Mapping[str, tuple[int, ...]], dtype=None) -> FlatDict:
    """A zero-filled :class:`FlatDict` with these names and shapes, in this order."""
    dtype = dtype or backend.float_dtype()
    total = sum(math.prod(shape) for shape in shapes.values())
    return FlatDict(backend.xp.zeros(total, dtype=dtype), shapes.items())


def zeros_like(flat: Mapping) -> FlatDict:
    """Zeros with the names, shapes and dtype of ``flat`` (any dict of arrays)."""
    dtype = next(iter(flat.values())).dtype if flat else None
    return zeros({name: tuple(a.shape) for name, a in flat.items()}, dtype)


def flatten(arrays: Mapping, dtype=None) -> FlatDict:
    """Copy a dict of arrays (host or device) into a new :class:`FlatDict` on the active backend."""
    if not arrays:
        raise ValueError("nothing to flatten: the dict of arrays is empty")
    dtype = dtype or next(iter(arrays.values())).dtype
    flat = zeros({name: tuple(a.shape) for name, a in arrays.items()}, dtype)
    for name, array in arrays.items():
        flat[name] = backend.to_device(array, dtype=flat[name].dtype)
    return flat


def buffer_of(*dicts):
    """The buffers of ``dicts`` if every one is a :class:`FlatDict` and all share one layout (the
    same names, shapes and dtype in the same order), else None: the caller then works per array."""
    if not all(isinstance(d, FlatDict) for d in dicts):
        return None
    first = dicts[0]
    layout = first.shapes()
    for d in dicts[1:]:
        if d.buffer.dtype != first.buffer.dtype or d.shapes() != layout:
            return None
    return tuple(d.buffer for d in dicts)


def add_into(total: Mapping, part: Mapping) -> None:
    """total += part, for two dicts of arrays of one layout: one operation on flat buffers,
    else one per array (the sum of an update's gradients, batch after batch)."""
    buffers = buffer_of(total, part)
    if buffers is not None:
        total_buffer, part_buffer = buffers
        total_buffer += part_buffer
        return
    for name, g in total.items():
        g += part[name]


def to_host(arrays: Mapping) -> dict:
    """The arrays of ``arrays`` as host (NumPy) arrays, with the same names. A :class:`FlatDict`
    travels as one copy of its buffer (its arrays are then views of the host copy): on a GPU one
    device-to-host transfer for the whole model, not one per array."""
    if isinstance(arrays, FlatDict):
        return dict(FlatDict(backend.to_host(arrays.buffer), arrays.shapes()))
    return {name: backend.to_host(a) for name, a in arrays.items()}
