"""Each worker on its own GPU or its share of the cores (minitfm.workers.placement), the NCCL
communicator's id on CuPy 13 and 14 (minitfm.workers.devices), and the placement line every trainer
prints first.

The GPU tests stand a small fake ``cupy`` in for the real one (:func:`fake_cupy`): only the calls
placement and NCCL make, each refusing what CuPy's Cython signatures refuse."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from minitfm.workers import devices, placement
from minitfm.workers.distributed import World
from minitfm.workers.placement import THREAD_VARIABLES, Placement, PlacementError, blas_threads

from .conftest import default_kernels
from .test_distributed import ENV, ROOT, _mpiexec, json_records, mpi   # noqa: F401 (mpi: a fixture)
from tests import forkserver

CLEAN_ENV = {k: v for k, v in default_kernels(ENV).items()      # nobody's choice
             if k not in THREAD_VARIABLES}
TIMEOUT = 120


def local(rank: int = 0, size: int = 1) -> types.SimpleNamespace:
    """What placement reads of a World: this worker's number among the ``size`` on its machine."""
    return types.SimpleNamespace(local_rank=rank, local_size=size)


@pytest.fixture
def cores(monkeypatch):
    """``cores(n)``: make this process's affinity mask n cores."""
    def set_cores(n: int) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)
    return set_cores


# ---- how many BLAS threads ------------------------------------------------------------------

def test_the_cores_are_shared_by_the_workers_on_the_machine(cores):
    cores(8)
    assert blas_threads(1, environ={}) == (8, "8 cores / 1 worker")
    assert blas_threads(2, environ={}) == (4, "8 cores / 2 workers")
    assert blas_threads(3, environ={}) == (2, "8 cores / 3 workers")
    assert blas_threads(16, environ={}) == (1, "8 cores / 16 workers")       # at least one
    cores(1)
    assert blas_threads(1, environ={}) == (1, "1 core / 1 worker")


def test_without_an_affinity_mask_every_core_counts(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert placement.available_cores() == 6
    assert blas_threads(2, environ={}) == (3, "6 cores / 2 workers")


def test_the_commands_default_caps_the_share(cores):
    cores(8)
    assert blas_threads(1, cap=1, environ={}) == (1, "8 cores / 1 worker, at most 1 by default")
    assert blas_threads(2, cap=3, environ={}) == (3, "8 cores / 2 workers, at most 3 by default")
    assert blas_threads(2, cap=4, environ={}) == (4, "8 cores / 2 workers")   # the cap not reached
    assert blas_threads(4, cap=4, environ={}) == (2, "8 cores / 4 workers")


def test_a_thread_variable_in_the_environment_wins_over_the_default_and_its_cap(cores):
    cores(8)
    assert blas_threads(2, cap=1, environ={"OPENBLAS_NUM_THREADS": "3"}) == \
        (3, "OPENBLAS_NUM_THREADS=3")
    assert blas_threads(2, cap=1, environ={"OMP_NUM_THREADS": "2,1"}) == (2, "OMP_NUM_THREADS=2,1")
    assert blas_threads(1, environ={"MKL_NUM_THREADS": "5", "OMP_NUM_THREADS": "7"}) == \
        (5, "MKL_NUM_THREADS=5")
    assert blas_threads(1, environ={"OMP_NUM_THREADS": "7", "OPENBLAS_NUM_THREADS": "6"}) == \
        (6, "OPENBLAS_NUM_THREADS=6")
    assert blas_threads(2, environ={"OPENBLAS_NUM_THREADS": " "}) == (4, "8 cores / 2 workers")
    cores(2)
    assert blas_threads(2, environ={"OPENBLAS_NUM_THREADS": "2"}) == \
        (2, "OPENBLAS_NUM_THREADS=2; 4 threads on 2 cores")


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_bad_thread_variable_is_a_clear_error(value):
    with pytest.raises(PlacementError, match=f"OMP_NUM_THREADS='{value}' is not a number of "
                                             f"threads: set it to 1 or more, or unset it"):
        blas_threads(1, environ={"OMP_NUM_THREADS": value})


def test_the_threads_option_wins_over_both(cores):
    cores(8)
    assert blas_threads(2, requested=3, cap=1, environ={"OPENBLAS_NUM_THREADS": "1"}) == \
        (3, "--threads")
    assert blas_threads(2, requested=8, environ={}) == (8, "--threads; 16 threads on 8 cores")
    with pytest.raises(PlacementError, match="--threads 0"):
        blas_threads(1, requested=0, environ={})


# ---- applied with threadpoolctl -------------------------------------------------------------

@pytest.fixture
def blas_limits():
    """The BLAS thread counts in effect, read back by threadpoolctl; restored afterwards."""
    from threadpoolctl import threadpool_info, threadpool_limits
    if not any(info["user_api"] == "blas" for info in threadpool_info()):
        pytest.skip("threadpoolctl finds no BLAS library in this NumPy")
    before = threadpool_limits(limits=None, user_api="blas")   # remembers the original counts
    yield lambda: {info["num_threads"] for info in threadpool_info()
                   if info["user_api"] == "blas"}
    before.restore_original_limits()


def test_placement_sets_the_blas_threads_in_effect(blas_limits, cores):
    cores(4)
    decided = placement.place(local(0, 2), "numpy", environ={})
    assert decided.threads == 2 and blas_limits() == {2}
    decided = placement.place(local(1, 2), "numpy", threads=1, environ={})
    assert decided.threads == 1 and blas_limits() == {1}
    decided = placement.place(local(0, 1), "numpy", environ={"OPENBLAS_NUM_THREADS": "3"})
    assert decided.threads == 3 and blas_limits() == {3}


# ---- what the trainers print ----------------------------------------------------------------

@pytest.mark.parametrize("record, text", [
    (Placement(0, 2, "2 cores / 2 workers", threads=1),
     "placement: 2 workers on this machine, 1 BLAS thread each (2 cores / 2 workers)"),
    (Placement(0, 1, "2 cores / 1 worker, at most 1 by default", threads=1),
     "placement: 1 BLAS thread (2 cores / 1 worker, at most 1 by default)"),
    (Placement(0, 1, "OPENBLAS_NUM_THREADS=4", threads=4),
     "placement: 4 BLAS threads (OPENBLAS_NUM_THREADS=4)"),
    (Placement(0, 1, "--threads", threads=8), "placement: 8 BLAS threads (--threads)"),
    (Placement(1, 2, "one GPU per worker, 2 on this machine", gpu=1, gpu_name="NVIDIA H100"),
     "placement: 2 workers on this machine, GPU 1 (NVIDIA H100) for local rank 1 (one GPU per "
     "worker, 2 on this machine)"),
])
def test_the_placement_in_words(record, text):
    assert record.describe() == text


def expected_line(workers: int, cap: int | None) -> str:
    """What a trainer prints first with no thread variable set, on this machine's cores: where
    ``placement.place`` put it, and the precision of its products."""
    threads, why = blas_threads(workers, cap=cap, environ={})
    return (f"{Placement(0, workers, why, threads=threads).describe()}; "
            f"precision fp32 (NumPy: float32 only); row passes on {threads} "
            f"thread{'s' if threads > 1 else ''} with compiled loops (--kernels fused)")


def run_command(argv: list[str], env: dict, workers: int = 1) -> subprocess.CompletedProcess:
    launcher = [_mpiexec(), "-n", str(workers)] if workers > 1 else []
    return forkserver.run(launcher + [sys.executable] + argv, capture_output=True, text=True,
                          env=env, timeout=TIMEOUT)


TOY = [str(ROOT / "train_toy.py"), "--preset", "tiny", "--max-steps", "2", "--eval-size", "10",
       "--examples", "0", "--quiet"]


def test_train_toy_prints_its_placement_first(tmp_path):
    done = run_command(TOY + ["--out", str(tmp_path / "a")], CLEAN_ENV)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == expected_line(1, cap=1)
    # the threads alone are checked here: the plain kernels, no compiled loops to load
    done = run_command(TOY + ["--out", str(tmp_path / "b"), "--threads", "2"],
                       {**CLEAN_ENV, "OPENBLAS_NUM_THREADS": "1", "MINITFM_KERNELS": "plain"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("placement: 2 BLAS threads (--threads")
    done = run_command(TOY + ["--out", str(tmp_path / "c")],
                       {**CLEAN_ENV, "OPENBLAS_NUM_THREADS": "lots"})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: OPENBLAS_NUM_THREADS='lots' is not a number")


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "story.txt"
    path.write_text("anna sees the cat. bob has a hat. the dog likes the sun.\n" * 40)
    return path


LM = ["--max-steps", "3", "--warmup", "1", "--layers", "1", "--d-model", "16", "--heads", "2",
      "--d-ff", "32", "--block-size", "16", "--batch-size", "4", "--samples", "0", "--quiet"]


def test_train_lm_prints_its_placement_first(tmp_path, text_file):
    done = run_command([str(ROOT / "train_lm.py"), "--data", str(text_file), *LM, "--out",
                        str(tmp_path / "run")], CLEAN_ENV)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == expected_line(1, cap=None)


# ---- two workers on one machine -------------------------------------------------------------

PLACED = """
import json, os, sys
from threadpoolctl import threadpool_info
from minitfm.workers import distributed, placement
world = distributed.world()
decided = placement.place(world, "numpy")
blas = sorted({info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"})
line = json.dumps({"rank": world.rank, "local": [world.local_rank, world.local_size],
                   "threads": decided.threads, "blas": blas, "text": decided.describe()})
os.write(1, (line + chr(10)).encode())
"""


def two_workers(script: str, env: dict) -> dict[int, dict]:
    done = forkserver.run([_mpiexec(), "-n", "2", sys.executable, "-c", script],
                          capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    return {row["rank"]: row for row in json_records(done.stdout)}


@pytest.mark.mpi
def test_two_workers_on_one_machine_share_its_cores(mpi):
    threads, why = blas_threads(2, environ={})          # this machine's cores / 2, at least 1
    records = two_workers(PLACED, CLEAN_ENV)
    assert sorted(records) == [0, 1]
    for rank, record in records.items():
        assert record["local"] == [rank, 2]
        assert record["threads"] == threads and record["blas"] == [threads]
        assert record["text"] == (f"placement: 2 workers on this machine, {threads} BLAS "
                                  f"thread{'s' if threads > 1 else ''} each ({why})")
    records = two_workers(PLACED, {**CLEAN_ENV, "OMP_NUM_THREADS": "3"})   # the user's choice
    assert [(r["threads"], r["blas"]) for r in records.values()] == [(3, [3]), (3, [3])]


@pytest.mark.mpi
def test_train_toy_with_two_workers_prints_their_placement_first(mpi, tmp_path):
    done = run_command(TOY + ["--out", str(tmp_path / "run")], CLEAN_ENV, workers=2)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == expected_line(2, cap=1)
    assert lines[0].startswith("placement: 2 workers on this machine, 1 BLAS thread each (")
    assert sum(line.startswith("placement:") for line in lines) == 1        # rank 0 alone


@pytest.mark.mpi
def test_train_lm_with_two_workers_prints_their_placement(mpi, tmp_path, text_file):
    done = run_command([str(ROOT / "train_lm.py"), "--data", str(text_file), *LM, "--out",
                        str(tmp_path / "run")], CLEAN_ENV, workers=2)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    placed = [i for i, line in enumerate(lines) if line.startswith("placement:")]
    assert [lines[i] for i in placed] == [expected_line(2, cap=1)]          # rank 0 alone
    # before any result: the workers meet in training's collectives after placing themselves
    assert placed[0] < min(i for i, line in enumerate(lines) if line.startswith("validation"))


# ---- GPUs, under a fake CuPy ----------------------------------------------------------------

class FakeNccl(types.ModuleType):
    """``cupy.cuda.nccl``: ``get_unique_id()`` and ``NcclCommunicator(ndev, commId, rank)`` as
    ``cupy_backends/cuda/libs/nccl.pyx`` types them: CuPy 14 (v14.2.0) bytes; CuPy 13 (v13.6.0)
    a tuple of 128 C chars (signed on x86-64, unsigned on aarch64)."""
    NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64, NCCL_INT32, NCCL_INT64, NCCL_SUM = 6, 7, 8, 2, 4, 0

    def __init__(self, release: int, signed_char: bool = True) -> None:
        super().__init__("cupy.cuda.nccl")
        self.release, self.signed_char = release, signed_char
        raw = bytes((7 * i + 200) % 256 for i in range(128))      # both halves of the byte range
        self.made = (raw if release >= 14 else
                     tuple(b - 256 if signed_char and b > 127 else b for b in raw))
        self.ids_made, self.communicators, self.calls = 0, [], []
        fake = self

        class NcclCommunicator:
            def __init__(self, ndev, commId, rank):
                if release >= 14 and not isinstance(commId, bytes):     # (..., bytes commId, ...)
                    raise TypeError(f"Argument 'commId' has incorrect type (expected bytes, got "
                                    f"{type(commId).__name__})")
                if release < 14:                               # tuple commId; char internal[]
                    if not isinstance(commId, tuple):
                        raise TypeError("Argument 'commId' has incorrect type (expected tuple)")
                    low, high = (-128, 127) if signed_char else (0, 255)
                    if any(not low <= v <= high for v in commId):
                        raise OverflowError("value too large to convert to char")
                if len(commId) != 128:
                    raise ValueError(f"commId length {len(commId)} != 128.")
                fake.communicators.append((ndev, commId, rank))

            def bcast(self, buff, count, datatype, root, stream):
                fake.calls.append(("bcast", buff, count, datatype, root, stream))

            def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
                fake.calls.append(("allReduce", sendbuf, recvbuf, count, datatype, op, stream))

        self.NcclCommunicator = NcclCommunicator

    def get_unique_id(self):
        self.ids_made += 1
        return self.made


@pytest.fixture
def fake_cupy(monkeypatch):
    """``fake_cupy(devices, release=14, signed_char=True)``: a ``cupy`` module with ``devices``
    CUDA devices, as far as placement and NCCL use it; returns its state."""
    def install(count: int, release: int = 14, signed_char: bool = True):
        state = types.SimpleNamespace(current=0, nccl=FakeNccl(release, signed_char))

        class Device:
            def __init__(self, index=None):
                self.id = state.current if index is None else index
                if not 0 <= self.id < count:
                    raise RuntimeError(f"cudaErrorInvalidDevice: device {self.id} of {count}")

            def use(self):
                state.current = self.id

        runtime = types.SimpleNamespace(
            getDeviceCount=lambda: count,
            getDeviceProperties=lambda i: {"name": f"Fake GPU {Device(i).id}".encode()})
        cuda = types.ModuleType("cupy.cuda")
        cuda.Device, cuda.runtime, cuda.nccl = Device, runtime, state.nccl
        cuda.get_current_stream = lambda: types.SimpleNamespace(ptr=4242)
        cupy = types.ModuleType("cupy")
        cupy.cuda = cuda
        for name, module in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.nccl", state.nccl)):
            monkeypatch.setitem(sys.modules, name, module)
        return state
    return install


def test_each_worker_takes_the_gpu_of_its_local_rank(fake_cupy):
    state = fake_cupy(2)
    decided = placement.place(local(1, 2), "cupy")
    assert (decided.gpu, state.current, decided.threads) == (1, 1, None)
    assert decided.describe() == ("placement: 2 workers on this machine, GPU 1 (Fake GPU 1) for "
                                  "local rank 1 (one GPU per worker, 2 on this machine)")
    decided = placement.place(local(0, 1), "cupy")
    assert (decided.gpu, state.current) == (0, 0)
    assert decided.describe() == ("placement: GPU 0 (Fake GPU 0) for local rank 0 (one GPU per "
                                  "worker, 2 on this machine)")


def test_more_workers_than_gpus_on_a_machine_is_refused(fake_cupy):
    state = fake_cupy(2)
    state.current = 0
    with pytest.raises(PlacementError, match=r"3 workers on this machine but 2 GPUs: start one "
                                             r"worker per GPU \(mpiexec -n 2 on each machine\)"):
        placement.place(local(2, 3), "cupy")
    assert state.current == 0
    fake_cupy(1)
    with pytest.raises(PlacementError, match="2 workers on this machine but 1 GPU: "):
        placement.place(local(0, 2), "cupy")


@pytest.mark.parametrize("unique_id", [
    bytes(range(128)), bytes(range(128, 256)),                         # CuPy 14
    tuple(range(-64, 64)), tuple(range(128)), tuple(range(128, 256)),  # CuPy 13: signed, unsigned
])
def test_the_nccl_id_travels_as_bytes_and_comes_back_as_it_was(unique_id):
    wire = devices.encode_unique_id(unique_id)
    assert isinstance(wire, bytes) and len(wire) == devices.NCCL_ID_BYTES + 1
    decoded = devices.decode_unique_id(bytearray(wire))     # as it comes out of an MPI buffer
    assert type(decoded) is type(unique_id) and decoded == unique_id


@pytest.mark.parametrize("bad, error", [
    (bytes(127), ValueError), (tuple(range(129)), ValueError), ([0] * 128, TypeError),
    (tuple([300] * 128), TypeError), ("x" * 128, TypeError),
])
def test_a_malformed_nccl_id_is_refused(bad, error):
    with pytest.raises(error):
        devices.encode_unique_id(bad)


class FakeComm:
    """MPI for the workers of one test, called one after the other: Bcast hands every rank what
    rank 0 broadcast."""
    def __init__(self, rank: int, shared: dict) -> None:
        self.rank, self.shared = rank, shared

    def Bcast(self, buffer, root=0):
        if self.rank == root:
            self.shared["bcast"] = bytes(buffer)
        else:
            buffer[:] = self.shared["bcast"]


class DeviceArray:
    """A contiguous float32 device array, as the collectives see one."""
    __cuda_array_interface__ = {}
    flags = types.SimpleNamespace(c_contiguous=True)
    dtype, size = "float32", 12

    def __init__(self, ptr: int) -> None:
        self.data = types.SimpleNamespace(ptr=ptr)


def two_ranks() -> list[World]:
    shared, worlds = {}, []
    for rank in (0, 1):
        world = World()
        world.rank, world.size, world._comm = rank, 2, FakeComm(rank, shared)
        worlds.append(world)
    return worlds


@pytest.mark.parametrize("release, signed_char", [(14, True), (13, True), (13, False)])
def test_every_rank_hands_nccl_the_id_rank_0s_cupy_made(fake_cupy, release, signed_char):
    """CuPy 14 takes the id as bytes, 13 as a tuple of chars: each rank's communicator gets
    exactly what get_unique_id() returned on rank 0, made there alone."""
    nccl = fake_cupy(2, release, signed_char).nccl
    for world in two_ranks():
        world.allreduce_sum(DeviceArray(ptr=1000 + world.rank))
        world.allreduce_sum(DeviceArray(ptr=2000 + world.rank))   # the same communicator
    assert nccl.ids_made == 1
    assert [(ndev, rank) for ndev, _, rank in nccl.communicators] == [(2, 0), (2, 1)]
    for _, commId, _ in nccl.communicators:
        assert type(commId) is type(nccl.made) and commId == nccl.made
    assert nccl.calls == [("allReduce", ptr, ptr, 12, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 4242)
                          for ptr in (1000, 2000, 1001, 2001)]


def test_nccl_broadcasts_from_rank_0_on_the_current_stream(fake_cupy):
    nccl = fake_cupy(2).nccl
    communicator = devices.Nccl(0, 1, lambda data: data)
    communicator.broadcast(DeviceArray(ptr=77))
    assert nccl.calls == [("bcast", 77, 12, nccl.NCCL_FLOAT32, 0, 4242)]
    odd = DeviceArray(ptr=78)
    odd.dtype = "bool"
    with pytest.raises(ValueError, match="NCCL cannot sum bool arrays: use one of float16"):
        communicator.allreduce_sum(odd)
