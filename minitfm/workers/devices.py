"""The workers' CUDA devices, through CuPy: how many there are, which one this process uses, and
NCCL between them (the device side of :class:`minitfm.workers.distributed.World`'s collectives).

Everything here that touches CuPy imports it inside the function, so that a CPU run never loads
it; :mod:`minitfm.workers.placement` decides which device a worker takes, :mod:`minitfm.workers.distributed`
carries the NCCL communicator's id over MPI.

The NCCL unique id is 128 bytes (``NCCL_UNIQUE_ID_BYTES``), but CuPy's Python type for it changed
(``cupy_backends/cuda/libs/nccl.pyx``): CuPy 13 (v13.6.0) returns a tuple of 128 ints from
``get_unique_id()`` (each a C ``char``: -128..127 where ``char`` is signed, 0..255 where it is
unsigned) and ``NcclCommunicator(ndev, tuple commId, rank)`` takes that; CuPy 14 (v14.2.0, "Change
in get_unique_id Return Type" in its upgrade guide) returns and takes ``bytes``. Rank 0 makes the
id; it travels as 129 bytes (:func:`encode_unique_id`: a tag for the type, then the id), and every
rank hands the communicator the very value rank 0's CuPy returned (:func:`decode_unique_id`).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["NCCL_ID_BYTES", "device_count", "use_device", "device_name", "on_device",
           "encode_unique_id", "decode_unique_id", "Nccl"]

NCCL_ID_BYTES = 128
_BYTES, _SIGNED_CHARS, _UNSIGNED_CHARS = 0, 1, 2      # what get_unique_id() returned


def device_count() -> int:
    import cupy
    return cupy.cuda.runtime.getDeviceCount()


def use_device(index: int) -> None:
    """Make CUDA device ``index`` this process's current device (before any array is made)."""
    import cupy
    cupy.cuda.Device(index).use()


def device_name(index: int) -> str:
    import cupy
    name = cupy.cuda.runtime.getDeviceProperties(index)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def on_device(array_) -> bool:
    return hasattr(array_, "__cuda_array_interface__")


def encode_unique_id(unique_id) -> bytes:
    """``get_unique_id()``'s value (CuPy 14: bytes; 13: a tuple of 128 chars) as 129 bytes."""
    if isinstance(unique_id, bytes):
        tag, payload = _BYTES, unique_id
    elif isinstance(unique_id, tuple) and all(-128 <= v <= 255 for v in unique_id):
        tag = _SIGNED_CHARS if any(v < 0 for v in unique_id) else _UNSIGNED_CHARS
        payload = bytes(v & 0xFF for v in unique_id)
    else:
        raise TypeError(f"an NCCL unique id is bytes (CuPy 14) or a tuple of chars (CuPy 13), "
                        f"got {type(unique_id).__name__}")
    if len(payload) != NCCL_ID_BYTES:
        raise ValueError(f"an NCCL unique id has {NCCL_ID_BYTES} bytes, got {len(payload)}")
    return bytes([tag]) + payload


def decode_unique_id(wire: bytes):
    """The id of :func:`encode_unique_id`, of the type rank 0's CuPy returned."""
    tag, payload = wire[0], bytes(wire[1:])
    if tag == _BYTES:
        return payload
    if tag == _SIGNED_CHARS:
        return tuple(b - 256 if b > 127 else b for b in payload)
    return tuple(payload)


class Nccl:
    """One NCCL communicator of ``size`` ranks: broadcast and sum of contiguous device arrays,
    in place, on the current CUDA stream (ordered with the kernels around them; the host does
    not wait). Every rank must make it, and call each collective, in the same order.

    ``broadcast_bytes(data)`` returns rank 0's ``data`` on every rank (an MPI broadcast): the
    communicator's id, made on rank 0 alone, reaches the others that way."""

    def __init__(self, rank: int, size: int, broadcast_bytes: Callable[[bytes], bytes]) -> None:
        from cupy.cuda import nccl
        self._nccl = nccl
        mine = encode_unique_id(nccl.get_unique_id()) if rank == 0 else bytes(NCCL_ID_BYTES + 1)
        self._comm = nccl.NcclCommunicator(size, decode_unique_id(broadcast_bytes(mine)), rank)

    def broadcast(self, array_, root: int = 0) -> None:
        self._comm.bcast(array_.data.ptr, array_.size, self._type(array_), root, _stream())

    def allreduce_sum(self, array_) -> None:
        self._comm.allReduce(array_.data.ptr, array_.data.ptr, array_.size, self._type(array_),
                             self._nccl.NCCL_SUM, _stream())

    def _type(self, array_) -> int:
        nccl = self._nccl
        types = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32,
                 "float64": nccl.NCCL_FLOAT64, "int32": nccl.NCCL_INT32,
                 "int64": nccl.NCCL_INT64}
        if str(array_.dtype) not in types:
            raise ValueError(f"NCCL cannot sum {array_.dtype} arrays: use one of "
                             f"{', '.join(types)}")
        return types[str(array_.dtype)]


def _stream() -> int:
    import cupy
    return cupy.cuda.get_current_stream().ptr
