"""``cupy.cuda.nccl`` of the double (cupy_backends/cuda/libs/nccl.pyx, nccl.pxd), emulated
between MPI processes: each process is one NCCL rank, and the collectives travel over mpi4py's
COMM_WORLD (the workers of an ``mpiexec`` job, which is how the library starts them).

The rules:
- ``get_unique_id()`` returns ``bytes`` (128) under CuPy 14 rules, a tuple of 128 signed char
  values under CuPy 13 rules; ``NcclCommunicator(ndev, commId, rank)`` takes only that type.
- a communicator is made by every rank together; two ranks on one device (of one host) raise
  ``NcclError`` (NCCL's init.cc: "Duplicate GPU detected", ncclInvalidUsage);
- ``allReduce`` and ``bcast`` take device pointers (ints, ``array.data.ptr``) and a datatype and
  count, and read and write the arrays behind those pointers.
"""

from __future__ import annotations

import os
import sys

import numpy

from cupy import _double
from cupy.cuda import _state

# cupy_backends/cuda/libs/nccl.pxd (the same in 13.6.0 and 14.2.0)
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
NCCL_INT8 = NCCL_CHAR = 0
NCCL_UINT8 = 1
NCCL_INT32 = NCCL_INT = 2
NCCL_UINT32 = 3
NCCL_INT64 = 4
NCCL_UINT64 = 5
NCCL_FLOAT16 = NCCL_HALF = 6
NCCL_FLOAT32 = NCCL_FLOAT = 7
NCCL_FLOAT64 = NCCL_DOUBLE = 8
NCCL_BFLOAT16 = 9
NCCL_UNIQUE_ID_BYTES = 128

_DTYPES = {0: numpy.int8, 1: numpy.uint8, 2: numpy.int32, 3: numpy.uint32, 4: numpy.int64,
           5: numpy.uint64, 6: numpy.float16, 7: numpy.float32, 8: numpy.float64}

available = True

# nccl.pyx ERROR2 and NCCL's ncclGetErrorString
ncclInvalidArgument, ncclInvalidUsage = 4, 5
_ERRORS = {
    2: ("NCCL_ERROR_SYSTEM_ERROR", "unhandled system error (run with NCCL_DEBUG=INFO for details)"),
    3: ("NCCL_ERROR_INTERNAL_ERROR", "internal error - please report this issue to the NCCL "
                                     "developers"),
    ncclInvalidArgument: ("NCCL_ERROR_INVALID_ARGUMENT",
                          "invalid argument (run with NCCL_DEBUG=WARN for details)"),
    ncclInvalidUsage: ("NCCL_ERROR_INVALID_USAGE",
                       "invalid usage (run with NCCL_DEBUG=WARN for details)"),
}


class NcclError(RuntimeError):
    """nccl.pyx NcclError(status): ``'%s: %s' % (ERROR2[status], ncclGetErrorString(status))``.
    NCCL itself says why only in its log (``NCCL WARN ...``); the double appends that line to
    the message, after the text the real error carries."""

    def __init__(self, status, warning: str = ""):
        self.status = status
        name, text = _ERRORS[status]
        message = f"{name}: {text}"
        if warning:
            message += f" [NCCL WARN {warning}]"
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.status,))


def get_version():
    return 22805


def get_build_version():
    return 22805


def get_unique_id():
    """CuPy 14: ``bytes`` of 128 ("Fetch the NCCL unique ID as a Python bytes object.");
    CuPy 13: ``tuple([<char>uniqueId.internal[i] for i in range(128)])``."""
    raw = os.urandom(NCCL_UNIQUE_ID_BYTES)
    if _double.RULES >= 14:
        return raw
    return tuple(int(v) for v in numpy.frombuffer(raw, dtype=numpy.int8))


def _comm_world():
    try:
        from mpi4py import MPI
    except ImportError as exc:   # pragma: no cover - depends on the machine
        raise NcclError(2, f"the double's NCCL travels over MPI: mpi4py is missing ({exc})") from exc
    return MPI, MPI.COMM_WORLD


def _type_error(name: str, expected: str, value) -> TypeError:
    # Cython's check of a typed argument
    return TypeError(f"Argument '{name}' has incorrect type (expected {expected}, got "
                     f"{type(value).__name__})")


def _buffer(ptr: int, count: int, datatype: int, device_id: int) -> numpy.ndarray:
    if datatype not in _DTYPES:
        raise NcclError(ncclInvalidArgument, f"the double has no datatype {datatype}")
    try:
        allocation, offset = _state.lookup(int(ptr))
        view = allocation.view(offset, count, _DTYPES[datatype])
    except ValueError as exc:
        raise NcclError(ncclInvalidArgument, f"{exc}") from exc
    if allocation.device_id != device_id:
        raise NcclError(ncclInvalidArgument, f"buffer on device {allocation.device_id}, "
                                             f"communicator on device {device_id}")
    return view


class NcclCommunicator:
    """One rank of a communicator of ``ndev`` ranks (nccl.pyx NcclCommunicator), on the current
    device. Every rank must construct it together (a collective over MPI)."""

    if _double.RULES >= 14:
        def __init__(self, ndev, commId, rank, config=None):
            if not isinstance(commId, bytes):
                raise _type_error("commId", "bytes", commId)
            if len(commId) != NCCL_UNIQUE_ID_BYTES:
                raise ValueError(f"commId length {len(commId)} != {NCCL_UNIQUE_ID_BYTES}.")
            self._init(int(ndev), bytes(commId), int(rank))
    else:
        def __init__(self, ndev, commId, rank):
            if not isinstance(commId, tuple):
                raise _type_error("commId", "tuple", commId)
            assert len(commId) == NCCL_UNIQUE_ID_BYTES
            self._init(int(ndev), numpy.array(commId, dtype=numpy.int8).tobytes(), int(rank))

    def _init(self, ndev: int, unique_id: bytes, rank: int) -> None:
        MPI, comm = _comm_world()
        self._mpi, self._comm = MPI, comm
        self._device = _state.current_device()
        self._rank, self._size = rank, ndev
        host = MPI.Get_processor_name()
        everyone = comm.allgather((unique_id, rank, self._device, host))
        if comm.Get_size() != ndev or sorted(r for _, r, _, _ in everyone) != list(range(ndev)):
            raise NcclError(ncclInvalidArgument,
                            f"{ndev} ranks asked for, MPI has {comm.Get_size()} processes with "
                            f"ranks {[r for _, r, _, _ in everyone]}")
        if any(uid != unique_id for uid, _, _, _ in everyone):
            raise NcclError(ncclInvalidUsage, "the ranks were given different unique ids")
        for other_id, other_rank, other_device, other_host in everyone:
            if (other_rank != rank and other_device == self._device and other_host == host):
                first, second = max(rank, other_rank), min(rank, other_rank)
                warning = (f"Duplicate GPU detected : rank {first} and rank {second} both on "
                           f"CUDA device {self._device}")
                print(f"{host}:{os.getpid()} NCCL WARN {warning}", file=sys.stderr, flush=True)
                raise NcclError(ncclInvalidUsage, warning)
        # the communicator's own MPI group, ordered by NCCL rank
        self._nccl_comm = comm.Split(0, rank)

    def device_id(self):
        return self._device

    def rank_id(self):
        return self._rank

    def size(self):
        return self._size

    def destroy(self):
        pass

    def abort(self):
        pass

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        MPI = self._mpi
        send = _buffer(sendbuf, count, datatype, self._device)
        recv = _buffer(recvbuf, count, datatype, self._device)
        ops = {NCCL_SUM: MPI.SUM, NCCL_PROD: MPI.PROD, NCCL_MAX: MPI.MAX, NCCL_MIN: MPI.MIN,
               NCCL_AVG: MPI.SUM}
        if op not in ops:
            raise NcclError(ncclInvalidArgument, f"unknown reduction {op}")
        mine = send.copy()
        self._nccl_comm.Allreduce(mine, recv, op=ops[op])
        if op == NCCL_AVG:
            recv /= self._size
        _double.launch()

    def bcast(self, buff, count, datatype, root, stream):
        self._nccl_comm.Bcast(_buffer(buff, count, datatype, self._device), root=int(root))
        _double.launch()

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        recv = _buffer(recvbuff, count, datatype, self._device)
        if self._rank == root:
            recv[...] = _buffer(sendbuff, count, datatype, self._device)
        self._nccl_comm.Bcast(recv, root=int(root))
        _double.launch()
