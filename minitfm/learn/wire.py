"""What crosses from the learner's process to the checking side (:mod:`minitfm.learn.worker`):
plain data only. Numbers, strings, lists, tuples, dicts with string keys, and arrays of numbers
(bool, integers, floats, complex) are written as a JSON header and the arrays' bytes, and rebuilt
from them, never unpickled, so that nothing the learner's code returns can run on the checking
side; anything else arrives as an :class:`Other` naming its type. Host-only code.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy

__all__ = ["Other", "describe", "encode", "decode", "NUMBERS"]

NUMBERS = "biufc"       # the kinds of arrays that cross: bool, integers, floats, complex


@dataclass(frozen=True)
class Other:
    """A value of the child's that is not plain data: ``what`` names it ("a function")."""
    what: str


def describe(value) -> str:
    """A value's kind in words: "a str", "a list of 3", "an array of object"."""
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    name = type(value).__name__
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def encode(tree) -> bytes:
    """``tree`` as bytes: a JSON header, then the arrays' bytes."""
    buffers: list[bytes] = []

    def enc(x):
        if isinstance(x, (numpy.ndarray, numpy.generic)):       # numpy.float64 is a float too
            a = numpy.asarray(x, order="C")            # (ascontiguousarray makes 0-d 1-d)
            if a.dtype.kind not in NUMBERS:
                return {"other": f"an array of {a.dtype}"}
            buffers.append(a.tobytes())
            return {"array": len(buffers) - 1, "dtype": a.dtype.str, "shape": list(a.shape),
                    "scalar": isinstance(x, numpy.generic)}
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return x if abs(x) < 1 << 63 else {"other": "an int of more than 64 bits"}
        if isinstance(x, float):
            return {"float": float.__repr__(x)}
        if isinstance(x, complex):
            return {"complex": [float.__repr__(x.real), float.__repr__(x.imag)]}
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            return {"tuple": [enc(v) for v in x]}
        if isinstance(x, list):
            return {"list": [enc(v) for v in x]}
        if isinstance(x, dict) and all(isinstance(k, str) for k in x):
            return {"dict": {k: enc(v) for k, v in x.items()}}
        return {"other": describe(x)}

    header = json.dumps(enc(tree)).encode()
    sizes = [len(b) for b in buffers]
    head = json.dumps({"sizes": sizes}).encode()
    return struct.pack(">II", len(head), len(header)) + head + header + b"".join(buffers)


def decode(data: bytes):
    """The tree :func:`encode` made (ValueError for bytes it did not make)."""
    n_head, n_header = struct.unpack_from(">II", data)
    start = 8 + n_head + n_header
    sizes = json.loads(data[8:8 + n_head])["sizes"]
    offsets = [start + sum(sizes[:i]) for i in range(len(sizes))]

    def dec(x):
        if x is None or isinstance(x, (bool, str, int)):
            return x
        if isinstance(x, dict) and len(x) >= 1:
            if "float" in x:
                return float(x["float"])
            if "complex" in x:
                return complex(float(x["complex"][0]), float(x["complex"][1]))
            if "array" in x:
                dtype = numpy.dtype(x["dtype"])
                if dtype.kind not in NUMBERS:
                    raise ValueError(f"an array of {dtype} cannot cross")
                shape = tuple(int(s) for s in x["shape"])
                count = int(numpy.prod(shape, dtype=numpy.int64))
                a = numpy.frombuffer(data, dtype=dtype, count=count,
                                     offset=offsets[x["array"]]).reshape(shape).copy()
                return a[()] if x.get("scalar") else a
            if "tuple" in x:
                return tuple(dec(v) for v in x["tuple"])
            if "list" in x:
                return [dec(v) for v in x["list"]]
            if "dict" in x:
                return {k: dec(v) for k, v in x["dict"].items()}
            if "other" in x:
                return Other(str(x["other"]))
        raise ValueError(f"not an encoded value: {x!r:.60}")

    return dec(json.loads(data[8 + n_head:start]))
