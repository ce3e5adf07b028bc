"""Data-parallel training over MPI: N worker processes, each with a whole copy of the model.

An MPI launcher starts the workers, e.g. ``mpiexec -n 2 python train_wmt.py ...``; every worker
runs the same program. An update of N workers with ``update_freq`` k does the arithmetic of one
worker with ``update_freq`` N*k:

    the update's batches, in the one deterministic order     b_0  b_1  ...  b_{Nk-1}
    worker r takes its share (shard)                         b_{rk} ... b_{rk+k-1}
    worker r sums their gradients, each normalised by the    g_r
        update's total target-token count (the same number on every worker)
    allreduce_sum: every worker then holds                   g_0 + g_1 + ... + g_{N-1}
    every worker applies the same optimizer step

The sum equals one worker's up to the order of float additions. Parameters broadcast from rank 0
at the start (broadcast_params) stay equal on every worker, since all apply the same update.

Transport. Host (NumPy) buffers: one ``MPI_Allreduce`` in place on the whole flat buffer. Device
(CuPy) buffers: NCCL on the current CUDA stream (:class:`minitfm.workers.devices.Nccl`), its id made on
rank 0 and broadcast over MPI; device memory is never copied to the host. Which GPU, or how many
BLAS threads, each worker takes is :mod:`minitfm.workers.placement`'s decision.

One process. Started without a launcher (or as a single process), :func:`world` is a world of one
whose collectives leave their input as it is; mpi4py is not even imported.

Stopping together. Every worker must enter the same collectives in the same order, or the others
wait for it forever. So a reason to stop -- Ctrl-C, SIGTERM, an error -- is not acted on where it
arrives: at each update boundary :meth:`World.stop_requests` gathers every worker's reason in one
small collective, all workers get the same answer and stop at the same step. What still ends one
worker alone -- an uncaught exception, or an exception or non-zero exit leaving
:meth:`World.fail_together` -- is turned into ``MPI_Abort`` after the worker has printed who it is
and why: the launcher then ends every worker (MPICH prints ``Abort(2) on node 1 (rank 1 in comm
0)``) instead of leaving them waiting. A worker killed outright (``kill -9``, the out-of-memory
killer) is noticed by the launcher, which ends the others at once and names the dead process
(MPICH: ``BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES``, ``PID 4242 RUNNING AT host``;
Open MPI names its rank); :meth:`World.describe` lists each worker's rank, PID and host to print at
the start, to match the two.

No array math here: NumPy is never imported (a few numbers travel in ``array.array`` buffers),
nor CuPy (:mod:`minitfm.workers.devices` holds the device side).
"""

from __future__ import annotations

import array
import contextlib
import os
import signal
import sys
import traceback
import zlib
from collections.abc import Mapping, Sequence

from minitfm import flat
from minitfm.workers import devices

__all__ = ["DistributedError", "World", "world", "launcher_size", "shard", "describe_stops",
           "STOP_ERROR"]

STOP_ERROR = -1      # the stop reason of a worker that failed (others are signal numbers)

# What MPI launchers tell the processes they start: Hydra (MPICH, Intel MPI) and Slurm's PMI-2
# set PMI_RANK/PMI_SIZE, Open MPI sets OMPI_COMM_WORLD_RANK/SIZE, PMIx launchers PMIX_RANK.
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


class DistributedError(RuntimeError):
    """The workers cannot be set up or do not agree; the message says what to change."""


def launcher_size(environ: Mapping[str, str] = os.environ) -> int | None:
    """How many processes an MPI launcher started (0 when it does not say how many), or None
    when this process was not started by one."""
    for variable in _SIZE_VARIABLES:
        if environ.get(variable, "").strip().isdigit():
            return int(environ[variable])
    return 0 if any(variable in environ for variable in _RANK_VARIABLES) else None


def shard(batches: Sequence, rank: int, size: int) -> list:
    """Worker ``rank``'s share of one update's batches, of ``size`` workers in all.

    ``batches`` are all N*k batches of the update, in the order one worker with ``update_freq``
    N*k would take them; worker r gets the k consecutive ones ``batches[r*k : (r+1)*k]``, so its
    partial sum adds the same batches, in the same order, as that worker does."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} of {size} workers: need 0 <= rank < size")
    if len(batches) % size:
        raise ValueError(f"an update of {len(batches)} batches cannot be split evenly over {size} "
                         f"workers: take update_freq batches per worker, {size} * update_freq "
                         f"per update")
    k = len(batches) // size
    return list(batches[rank * k:(rank + 1) * k])


def describe_stops(requests: Mapping[int, int]) -> str:
    """``{rank: reason}`` from :meth:`World.stop_requests` in words:
    ``worker 1 got SIGTERM, worker 3 failed``."""
    def reason(code: int) -> str:
        if code == STOP_ERROR:
            return "failed"
        try:
            return f"got {signal.Signals(code).name}"
        except ValueError:
            return f"stopped (reason {code})"
    return ", ".join(f"worker {rank} {reason(code)}" for rank, code in sorted(requests.items()))


class World:
    """The worker processes of this job and the collectives between them.

    ``rank`` (0 .. size-1), ``size``, ``local_rank`` and ``local_size`` (the workers on this
    machine), ``is_root`` (rank 0: the one that writes checkpoints and logs). Collectives --
    broadcast_params, broadcast_numbers, broadcast_text, broadcast_bytes, allreduce_sum,
    allreduce_numbers, barrier, root_first, stop_requests, finish -- must be called by every
    worker, in the same order; the other methods are local."""

    def __init__(self, comm=None) -> None:
        """``comm``: an mpi4py communicator (COMM_WORLD), or None for a world of one process."""
        self._comm = comm
        self._nccl = None           # NCCL communicator, made by the first device collective
        self._finished = False
        if comm is None:
            self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1
            self.workers = [(os.getpid(), _hostname())]
            return
        from mpi4py import MPI
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()
        self.workers = comm.allgather((os.getpid(), MPI.Get_processor_name()))  # [(pid, host)]

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> World:
        """The world this process was started in: MPI's COMM_WORLD under an MPI launcher with
        more than one process, else a world of one (without importing mpi4py)."""
        expected = launcher_size(environ)
        if expected is None or expected == 1:
            return cls()
        rank = next((environ[v] for v in _RANK_VARIABLES if v in environ), "?")
        try:
            from mpi4py import MPI
        except Exception as exc:       # ImportError, or a RuntimeError when libmpi is missing
            raise DistributedError(
                f"this is worker {rank} of {expected or 'several'} started by an MPI launcher, "
                f"but mpi4py cannot be used ({exc}): install it with pip install -e '.[mpi]' "
                f"(or pip install mpi4py for the cluster's own MPI), or run one process without "
                f"mpiexec") from exc
        comm = MPI.COMM_WORLD
        if expected and comm.Get_size() != expected:
            library = " ".join(MPI.Get_library_version().splitlines()[0].split())
            raise DistributedError(
                f"the launcher started {expected} processes but MPI sees a world of "
                f"{comm.Get_size()}: mpiexec belongs to another MPI than the library mpi4py "
                f"loaded ({library}); use the mpiexec of that MPI, e.g. "
                f"{os.path.join(os.path.dirname(sys.executable), 'mpiexec')}")
        created = cls(comm)
        if created.distributed:
            created._abort_on_uncaught_exceptions()
        return created

    # ---- who is who ------------------------------------------------------------------------

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def describe(self) -> str:
        """``2 workers: rank 0 pid 4242 on host-a, rank 1 pid 4243 on host-a`` (or ``1 process``)."""
        if not self.distributed:
            return "1 process"
        ranks = ", ".join(f"rank {r} pid {pid} on {host}"
                          for r, (pid, host) in enumerate(self.workers))
        return f"{self.size} workers: {ranks}"

    def shard(self, batches: Sequence) -> list:
        """This worker's share of one update's batches: ``shard(batches, rank, size)``."""
        return shard(batches, self.rank, self.size)

    # ---- collectives -----------------------------------------------------------------------

    def broadcast_params(self, params: Mapping) -> None:
        """Overwrite ``params`` (a FlatDict or any dict of contiguous arrays, host or device) in
        place with rank 0's values. The workers must hold the same names, shapes and dtypes,
        else every one of them raises :class:`DistributedError`."""
        if not self.distributed:
            return
        layout = repr([(name, tuple(a.shape), str(a.dtype)) for name, a in params.items()])
        mine = (zlib.crc32(layout.encode()), sum(a.size for a in params.values()))
        if any(tuple(row) != mine for row in self._gather(mine)):
            raise DistributedError("the workers' parameters differ in names, shapes or dtypes: "
                                   "every worker must build the model from the same config")
        buffers = flat.buffer_of(params)
        for array_ in buffers or params.values():
            _check_contiguous(array_, "broadcast_params")
            if devices.on_device(array_):
                self._device_collectives().broadcast(array_, root=0)
            else:
                self._comm.Bcast(array_, root=0)

    def allreduce_sum(self, buffer) -> None:
        """Sum ``buffer`` (one contiguous array: the flat gradient buffer) over all workers, in
        place. Host arrays: ``MPI_Allreduce(IN_PLACE, SUM)``. Device arrays: NCCL's all-reduce on
        the current stream; no copy to the host and no wait for the device."""
        _check_contiguous(buffer, "allreduce_sum")
        if not self.distributed:
            return
        if devices.on_device(buffer):
            self._device_collectives().allreduce_sum(buffer)
        else:
            from mpi4py import MPI
            self._comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)

    def allreduce_numbers(self, values: Sequence[float], op: str = "sum") -> list[float]:
        """``op`` ("sum", "max" or "min") of a few Python numbers over the workers, element by
        element: token counts, losses, flags. Floats (exact for integers below 2**53); every
        worker gets the same result, added in rank order."""
        reduce = {"sum": _sum_in_order, "max": max, "min": min}.get(op)
        if reduce is None:
            raise ValueError(f"op must be 'sum', 'max' or 'min', got {op!r}")
        rows = self._gather(values)
        return [float(reduce(column)) for column in zip(*rows)]

    def broadcast_numbers(self, values: Sequence[float]) -> list[float]:
        """Rank 0's ``values`` (a few Python numbers, the same count on every worker) on every
        worker, as floats (exact for integers below 2**53)."""
        return [float(v) for v in self._gather(values)[0]]

    def broadcast_text(self, text: str) -> str:
        """Rank 0's ``text`` on every worker (a run directory chosen from the clock, say); the
        others pass any string."""
        return self.broadcast_bytes(text.encode()).decode()

    def broadcast_bytes(self, data: bytes) -> bytes:
        """Rank 0's ``data`` on every worker (a tokenizer read from a checkpoint, say); the
        others pass any bytes."""
        if not self.distributed:
            return data
        size = int(self.broadcast_numbers([len(data) if self.is_root else 0])[0])
        return self._broadcast_bytes(data if self.is_root else bytes(size))

    def barrier(self) -> None:
        """Wait until every worker has come here."""
        if self.distributed:
            self._comm.Barrier()

    @contextlib.contextmanager
    def root_first(self):
        """Rank 0 runs the block first, the others after it is done: rank 0 writes a cache (a
        vocabulary, encoded corpora), the others then find and read it. The others wait at a
        barrier, so an error of rank 0 in the block must end every worker (:meth:`fail_together`).
        The cache must be on a file system every worker sees."""
        if not self.is_root:
            self.barrier()
        yield
        if self.is_root:
            self.barrier()

    def stop_requests(self, reason: int = 0) -> dict[int, int]:
        """Every worker's reason to stop, gathered at an update boundary: ``reason`` is 0 (carry
        on), the number of a signal received, or STOP_ERROR. Returns ``{rank: reason}`` of the
        workers that asked to stop, the same on every worker; empty: all carry on."""
        rows = self._gather([reason])
        return {rank: int(row[0]) for rank, row in enumerate(rows) if row[0]}

    def finish(self) -> None:
        """Collective: every worker has come to the end of its work together (after rank 0's last
        save). From then on a worker may exit with any status without ending the others."""
        if self.distributed:
            self._comm.Barrier()
        self._finished = True

    # ---- failures --------------------------------------------------------------------------

    @contextlib.contextmanager
    def fail_together(self):
        """Run a worker's main program inside this: an exception or a non-zero exit leaving the
        block before :meth:`finish` ends every worker of the job (MPI_Abort with the same exit
        status: 130 for Ctrl-C, 1 for other exceptions), after this worker has said who it is and
        why, so that no other waits for it forever. In a world of one it does nothing."""
        try:
            yield
        except SystemExit as exc:
            if exc.code not in (None, 0):
                status = exc.code if isinstance(exc.code, int) else 1
                self._abort_alone(f"exited with status {status}", status)
            raise
        except KeyboardInterrupt:
            self._abort_alone("was interrupted", 130)
            raise
        except BaseException as exc:
            traceback.print_exc()
            self._abort_alone(f"failed: {type(exc).__name__}: {exc}", 1)
            raise

    def _abort_alone(self, what: str, status: int) -> None:
        """End every worker (MPI_Abort) unless this is a world of one or all have finished."""
        if not self.distributed or self._finished:
            return
        pid, host = self.workers[self.rank]
        sys.stdout.flush()
        print(f"worker {self.rank} of {self.size} (pid {pid} on {host}) {what}; ending all "
              f"{self.size} workers", file=sys.stderr, flush=True)
        _wait_until_read(1, 2)
        self._comm.Abort(status)

    def _abort_on_uncaught_exceptions(self) -> None:
        previous = sys.excepthook

        def hook(kind, value, tb):
            previous(kind, value, tb)
            status = 130 if issubclass(kind, KeyboardInterrupt) else 1
            self._abort_alone(f"stopped on an uncaught {kind.__name__}", status)
        sys.excepthook = hook

    # ---- transport -------------------------------------------------------------------------

    def _gather(self, values: Sequence[float]) -> list[list[float]]:
        """Every worker's ``values`` (the same count on each), in rank order, as float64."""
        mine = array.array("d", [float(v) for v in values])
        if not self.distributed:
            return [list(mine)]
        everyone = array.array("d", bytes(8 * len(mine) * self.size))
        self._comm.Allgather(mine, everyone)
        n = len(mine)
        return [list(everyone[r * n:(r + 1) * n]) for r in range(self.size)]

    def _broadcast_bytes(self, data: bytes) -> bytes:
        """Rank 0's ``data`` on every worker; the others pass as many bytes, of any value."""
        buffer = bytearray(data)
        self._comm.Bcast(buffer, root=0)
        return bytes(buffer)

    def _device_collectives(self) -> devices.Nccl:
        """The NCCL communicator of the workers' GPUs, made by the first device collective."""
        if self._nccl is None:
            self._nccl = devices.Nccl(self.rank, self.size, self._broadcast_bytes)
        return self._nccl


def _sum_in_order(column) -> float:
    total = 0.0
    for value in column:
        total += value
    return total


def _hostname() -> str:
    return os.uname().nodename if hasattr(os, "uname") else "localhost"


def _check_contiguous(array_, what: str) -> None:
    if not array_.flags.c_contiguous:
        raise ValueError(f"{what} needs a contiguous array (a flat buffer or a dict of whole "
                         f"arrays), got a strided view of shape {tuple(array_.shape)}")


_world: World | None = None


def world() -> World:
    """This process's :class:`World`, made from the environment on first use (MPI is initialised
    then, and only under an MPI launcher)."""
    global _world
    if _world is None:
        _world = World.from_environment()
    return _world


def _wait_until_read(*fds: int, timeout: float = 10.0) -> None:
    """Wait, at most ``timeout`` seconds, until what this process wrote to the pipes ``fds`` has
    been read at their other end. Under a launcher a worker's output goes through pipes to its
    proxy, and an abort that reaches the proxy before the last lines do ends the job without
    them (seen on a loaded machine: the message saying which worker failed, and why, lost).
    Host-only; a descriptor that is not a pipe is not waited for."""
    import fcntl
    import stat
    import termios
    import time
    pipes = []
    for fd in fds:
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                pipes.append(fd)
        except OSError:
            pass
    deadline = time.monotonic() + timeout
    unread = array.array("i", [0])
    for fd in pipes:
        while time.monotonic() < deadline:
            fcntl.ioctl(fd, termios.FIONREAD, unread)      # bytes still in the pipe
            if unread[0] == 0:
                break
            time.sleep(0.005)
