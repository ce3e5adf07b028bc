"""minitfm.distributed: the world of one process without MPI, and real MPI workers.

The tests marked ``mpi`` start ``mpiexec -n 2 python -c ...`` (tiny scripts, about a second each);
they skip, saying why, where mpi4py, mpiexec or a working MPI library is missing (install with
``pip install -e ".[mpi]"``). Every one runs under a hard timeout that ends the whole launcher's
process group, so a worker waiting forever cannot hang the suite.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minitfm import distributed, flat
from minitfm.distributed import STOP_ERROR, DistributedError, World, describe_stops, shard

from .conftest import cupy_device_available

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMI_FD", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                      "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
ENV = {**{k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES},
       "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}
TIMEOUT = 60          # seconds: the hard limit of one MPI run


# ---- a world of one process --------------------------------------------------------------

def test_one_process_without_a_launcher_never_imports_mpi4py():
    code = ("import sys; from minitfm import distributed; w = distributed.world(); "
            "print(w.rank, w.size, w.local_rank, w.local_size, w.is_root, w.distributed, "
            "'mpi4py' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV,
                          timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "1", "0", "1", "True", "False", "False"]


def test_launcher_size_from_the_environment():
    assert distributed.launcher_size({}) is None
    assert distributed.launcher_size({"PMI_RANK": "1", "PMI_SIZE": "4"}) == 4          # Hydra
    assert distributed.launcher_size({"OMPI_COMM_WORLD_SIZE": "3"}) == 3              # Open MPI
    assert distributed.launcher_size({"PMIX_RANK": "0"}) == 0                         # PMIx
    # mpiexec -n 1 is one process: no MPI at all
    assert World.from_environment({"PMI_RANK": "0", "PMI_SIZE": "1"}).size == 1


def test_collectives_of_one_process_leave_their_input():
    world = World.from_environment({})
    params = flat.flatten({"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                           "b": np.ones(3, dtype=np.float32)})
    before = params.buffer.copy()
    world.broadcast_params(params)
    world.allreduce_sum(params.buffer)
    assert np.array_equal(params.buffer, before)
    assert world.allreduce_numbers([3, 2.5]) == [3.0, 2.5]
    assert world.allreduce_numbers([3, 2.5], op="max") == [3.0, 2.5]
    assert world.stop_requests(0) == {}
    assert world.stop_requests(signal.SIGTERM) == {0: signal.SIGTERM}
    assert world.describe() == "1 process"
    world.finish()


def test_bad_arguments_are_refused_even_in_a_world_of_one():
    world = World.from_environment({})
    with pytest.raises(ValueError, match="contiguous"):
        world.allreduce_sum(np.zeros((4, 4), dtype=np.float32)[:, 1])
    with pytest.raises(ValueError, match="'sum', 'max' or 'min'"):
        world.allreduce_numbers([1.0], op="mean")


def test_fail_together_in_a_world_of_one_lets_the_exit_through():
    world = World.from_environment({})
    with pytest.raises(SystemExit) as exit_:
        with world.fail_together():
            sys.exit(2)
    assert exit_.value.code == 2


def test_a_launcher_without_mpi4py_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)          # import mpi4py fails
    with pytest.raises(DistributedError, match=r"worker 1 of 2.*pip install -e '\.\[mpi\]'"):
        World.from_environment({"PMI_RANK": "1", "PMI_SIZE": "2"})


def test_describe_stops():
    assert describe_stops({3: STOP_ERROR, 1: signal.SIGTERM}) == \
        "worker 1 got SIGTERM, worker 3 failed"
    assert describe_stops({0: signal.SIGINT}) == "worker 0 got SIGINT"


# ---- shard ------------------------------------------------------------------------------

def test_shard_takes_consecutive_batches():
    update = ["b0", "b1", "b2", "b3", "b4", "b5"]        # one update, update_freq 6 on one worker
    assert shard(update, 0, 2) == ["b0", "b1", "b2"]    # 2 workers, update_freq 3
    assert shard(update, 1, 2) == ["b3", "b4", "b5"]
    assert shard(update, 2, 3) == ["b4", "b5"]          # 3 workers, update_freq 2
    assert shard(update, 0, 1) == update


@given(st.integers(1, 8), st.integers(1, 5), st.integers(0, 3))
def test_shards_of_every_update_are_the_one_worker_order(workers, update_freq, updates):
    """Worker by worker and update by update, N workers with update_freq k take exactly the
    batches one worker with update_freq N*k takes, in the same order."""
    order = list(range(workers * update_freq * (updates + 1)))   # the deterministic batch order
    per_update = workers * update_freq
    for u in range(updates + 1):
        update = order[u * per_update:(u + 1) * per_update]
        taken = [shard(update, r, workers) for r in range(workers)]
        assert all(len(t) == update_freq for t in taken)
        assert sum(taken, []) == update


def test_shard_refuses_updates_that_do_not_split_evenly():
    with pytest.raises(ValueError, match="cannot be split evenly over 2 workers"):
        shard([1, 2, 3], 0, 2)
    with pytest.raises(ValueError, match="rank 2 of 2"):
        shard([1, 2], 2, 2)


# ---- real workers under mpiexec ----------------------------------------------------------

def _mpiexec() -> str | None:
    """The mpiexec of this Python's environment (the MPI mpi4py loads), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("mpiexec")


@functools.lru_cache(maxsize=1)
def _why_mpi_cannot_run() -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return 'mpi4py is not installed (pip install -e ".[mpi]")'
    if _mpiexec() is None:
        return 'no mpiexec beside this Python or on PATH (pip install -e ".[mpi]")'
    probe = "from mpi4py import MPI; print(MPI.COMM_WORLD.Get_size())"
    try:
        done = subprocess.run([_mpiexec(), "-n", "2", sys.executable, "-c", probe],
                              capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"mpiexec -n 2 did not finish a trivial program in {TIMEOUT} s"
    if done.returncode != 0 or done.stdout.split() != ["2", "2"]:
        return (f"mpiexec -n 2 cannot run mpi4py here (exit {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[-300:]})")
    return None


@pytest.fixture
def mpi():
    reason = _why_mpi_cannot_run()
    if reason:
        pytest.skip(reason)


class Run:
    def __init__(self, returncode: int, stdout: str, stderr: str, seconds: float) -> None:
        self.returncode, self.stdout, self.stderr, self.seconds = returncode, stdout, stderr, seconds

    def records(self) -> dict[int, dict]:
        """The JSON records the ranks printed, by rank (the launcher may join two ranks' lines)."""
        return {row["rank"]: row for row in json_records(self.stdout)}


def json_records(text: str) -> list[dict]:
    decoder, rows, at = json.JSONDecoder(), [], text.find('{"rank"')
    while at >= 0:
        row, end = decoder.raw_decode(text, at)
        rows.append(row)
        at = text.find('{"rank"', end)
    return rows


def start(script: str, workers: int = 2, env: dict | None = None) -> subprocess.Popen:
    """``mpiexec -n workers python -c script`` in a process group of its own."""
    return subprocess.Popen([_mpiexec(), "-n", str(workers), sys.executable, "-c",
                             textwrap.dedent(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env or ENV,
                            start_new_session=True)


def finish(process: subprocess.Popen, started: float, timeout: float = TIMEOUT) -> Run:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)          # the launcher and every worker
        out, err = process.communicate()
        pytest.fail(f"the MPI run did not end within {timeout} s\nstdout:\n{out}\nstderr:\n{err}")
    return Run(process.returncode, out, err, time.monotonic() - started)


def mpirun(script: str, workers: int = 2, timeout: float = TIMEOUT) -> Run:
    started = time.monotonic()
    return finish(start(script, workers), started, timeout)


PRELUDE = """
import json, os, signal, sys, time
import numpy as np
from minitfm import distributed, flat
world = distributed.world()
def say(**record):                          # one write: one whole line
    sys.stdout.flush()
    os.write(1, (json.dumps({"rank": world.rank, **record}) + chr(10)).encode())
"""


@pytest.mark.mpi
def test_world_of_two_workers(mpi):
    run = mpirun(PRELUDE + """
say(size=world.size, local=[world.local_rank, world.local_size], root=world.is_root,
    workers=world.describe(), pid=os.getpid())
""")
    assert run.returncode == 0, run.stderr
    records = run.records()
    assert sorted(records) == [0, 1]
    for rank, record in records.items():
        assert record["size"] == 2 and record["local"] == [rank, 2]
        assert record["root"] == (rank == 0)
        assert f"rank {rank} pid {record['pid']} on " in record["workers"]
    assert records[0]["workers"] == records[1]["workers"]


@pytest.mark.mpi
def test_broadcast_makes_every_worker_hold_rank_0s_parameters(mpi):
    run = mpirun(PRELUDE + """
rng = np.random.default_rng(world.rank)                  # different values on every worker
arrays = {"w": rng.standard_normal((3, 4)).astype(np.float32),
          "b": rng.standard_normal(4).astype(np.float32)}
params = flat.flatten(arrays)                            # one buffer: one Bcast
plain = {k: v.copy() for k, v in arrays.items()}         # a plain dict: one Bcast per array
world.broadcast_params(params)
world.broadcast_params(plain)
say(flat=params.buffer.tolist(), w=plain["w"].ravel().tolist(), b=plain["b"].tolist(),
    first=np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32).ravel().tolist())
""")
    assert run.returncode == 0, run.stderr
    zero, one = run.records()[0], run.records()[1]
    assert one["flat"] == zero["flat"] and one["w"] == zero["w"] and one["b"] == zero["b"]
    assert zero["w"] == zero["first"]                   # rank 0's own values, not rank 1's
    assert zero["flat"][:12] == zero["first"]


@pytest.mark.mpi
def test_broadcast_refuses_parameters_that_differ_in_layout(mpi):
    run = mpirun(PRELUDE + """
params = {"w": np.zeros((3, 4) if world.rank == 0 else (4, 3), dtype=np.float32)}
try:
    world.broadcast_params(params)
    say(error=None)
except distributed.DistributedError as exc:
    say(error=str(exc))
""")
    assert run.returncode == 0, run.stderr
    for record in run.records().values():
        assert "differ in names, shapes or dtypes" in record["error"]


@pytest.mark.mpi
def test_allreduce_sums_in_place(mpi):
    run = mpirun(PRELUDE + """
grads32 = (np.arange(7, dtype=np.float32) + 0.5) * (world.rank + 1)   # rank 0: x, rank 1: 2x
grads64 = np.full(5, 0.1 * (world.rank + 1))
address = grads32.__array_interface__["data"][0]
world.allreduce_sum(grads32)
world.allreduce_sum(grads64)
say(g32=grads32.tolist(), g64=grads64.tolist(),
    same_memory=grads32.__array_interface__["data"][0] == address,
    tokens=world.allreduce_numbers([100 + world.rank, 0.25], op="sum"),
    most=world.allreduce_numbers([world.rank, -world.rank], op="max"))
""")
    assert run.returncode == 0, run.stderr
    expected32 = ((np.arange(7, dtype=np.float32) + 0.5) * 3).tolist()   # exact: 1x + 2x = 3x
    for record in run.records().values():
        assert record["g32"] == expected32
        assert record["g64"] == [0.1 + 0.2] * 5
        assert record["same_memory"]
        assert record["tokens"] == [201.0, 0.5]
        assert record["most"] == [1.0, 0.0]


@pytest.mark.mpi
def test_each_worker_takes_its_shard_of_the_one_worker_order(mpi):
    run = mpirun(PRELUDE + """
order = [f"batch{i}" for i in range(12)]        # 2 updates of one worker with update_freq 6
say(updates=[world.shard(order[u * 6:(u + 1) * 6]) for u in range(2)])
""")
    assert run.returncode == 0, run.stderr
    records = run.records()
    assert records[0]["updates"] == [["batch0", "batch1", "batch2"], ["batch6", "batch7", "batch8"]]
    assert records[1]["updates"] == [["batch3", "batch4", "batch5"],
                                     ["batch9", "batch10", "batch11"]]


LOOP = PRELUDE + """
reason = 0
def stop(signum, frame):
    global reason
    reason = signum
signal.signal(signal.SIGTERM, stop)
say(pid=os.getpid())
buffer = np.ones(1000, dtype=np.float32)
with world.fail_together():
    for step in range(1, 2001):                  # at most ~20 s, never forever
        requests = world.stop_requests(reason)   # the update boundary
        if requests:
            say(stopped=step, why=distributed.describe_stops(requests))
            break
        FAIL
        world.allreduce_sum(buffer)              # the update's gradients
        time.sleep(0.01)
    world.finish()
"""


def started_pids(process: subprocess.Popen, workers: int = 2) -> dict[int, int]:
    """Read the first line of each worker: its pid."""
    pids = {}
    while len(pids) < workers:
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"the workers ended before saying their pids: "
                                 f"{process.stderr.read()}")
        for record in json_records(line):
            pids[record["rank"]] = record["pid"]
    return pids


@pytest.mark.mpi
def test_sigterm_to_one_worker_stops_all_at_the_same_update(mpi):
    started = time.monotonic()
    process = start(LOOP.replace("FAIL", "pass"))
    try:
        pids = started_pids(process)
        time.sleep(0.3)
        os.kill(pids[1], signal.SIGTERM)
    finally:
        run = finish(process, started)
    assert run.returncode == 0, run.stderr
    records = run.records()
    assert records[0]["stopped"] == records[1]["stopped"] > 1
    assert records[0]["why"] == records[1]["why"] == "worker 1 got SIGTERM"


@pytest.mark.mpi
def test_a_killed_worker_ends_the_others_with_an_error_naming_it(mpi):
    started = time.monotonic()
    process = start(LOOP.replace("FAIL", "pass"))
    try:
        pids = started_pids(process)
        time.sleep(0.3)
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
    finally:
        run = finish(process, started)
    assert run.returncode != 0
    assert time.monotonic() - killed < 10, "the surviving worker should end at once"
    assert "stopped" not in run.stdout                  # rank 0 did not carry on or stop cleanly
    assert f"PID {pids[1]}" in run.stdout + run.stderr         # MPICH and Open MPI both say so


@pytest.mark.mpi
@pytest.mark.parametrize("failure, status, message", [
    ("raise ValueError('bad input')", 1, "failed: ValueError: bad input"),
    ("sys.exit(2)", 2, "exited with status 2"),
    ("raise KeyboardInterrupt", 130, "was interrupted"),
])
def test_a_failing_worker_ends_the_others_instead_of_leaving_them_waiting(mpi, failure, status,
                                                                         message):
    run = mpirun(LOOP.replace("FAIL", f"if world.rank == 1 and step == 3: {failure}"))
    assert run.returncode == status, run.stderr
    assert f"worker 1 of 2 (pid " in run.stderr and f"{message}; ending all 2 workers" in run.stderr
    assert "stopped" not in run.stdout
    assert run.seconds < 30


@pytest.mark.mpi
def test_an_uncaught_exception_ends_every_worker(mpi):
    run = mpirun(PRELUDE + """
buffer = np.ones(4)
world.allreduce_sum(buffer)
if world.rank == 1:
    raise RuntimeError("lost")
for _ in range(2000):          # rank 0 waits in collectives that rank 1 never joins
    world.allreduce_sum(buffer)
""")
    assert run.returncode == 1
    assert "RuntimeError: lost" in run.stderr
    assert "worker 1 of 2" in run.stderr and "stopped on an uncaught RuntimeError" in run.stderr


@pytest.mark.mpi
def test_after_finish_a_worker_may_exit_alone(mpi):
    run = mpirun(PRELUDE + """
with world.fail_together():
    world.finish()
    if world.rank == 1:
        sys.exit(3)
    time.sleep(0.5)               # rank 0's last work (the final evaluation) is not cut short
    say(done=True)
""")
    assert run.returncode == 3
    assert run.records()[0]["done"] is True
    assert "ending all" not in run.stderr


@pytest.mark.mpi
def test_mpiexec_of_another_mpi_is_named(mpi):
    """Open MPI's launcher variables with the MPICH library: each process is a world of one."""
    env = {**ENV, "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}
    done = subprocess.run([sys.executable, "-c", "from minitfm import distributed; distributed.world()"],
                          capture_output=True, text=True, env=env, timeout=TIMEOUT)
    if "Open MPI" in done.stderr and "MPICH" not in done.stderr:
        pytest.skip("mpi4py loads Open MPI here, which reads these variables itself")
    assert done.returncode != 0
    assert "started 2 processes but MPI sees a world of 1" in done.stderr
    assert "use the mpiexec of that MPI" in done.stderr


# ---- NCCL (one process per GPU) ----------------------------------------------------------

def _gpu_count() -> int:
    if not cupy_device_available():
        return 0
    import cupy
    return cupy.cuda.runtime.getDeviceCount()


@pytest.mark.gpu
@pytest.mark.mpi
def test_nccl_broadcast_and_allreduce_on_device_buffers(mpi):
    if _gpu_count() < 2:
        pytest.skip("needs 2 CUDA devices (one worker per GPU)")
    run = mpirun(PRELUDE.replace("import numpy as np", "import numpy as np, cupy") + """
world.use_local_gpu()
from minitfm import backend
backend.use("cupy")
params = flat.flatten({"w": np.full((3, 4), world.rank + 1.0, dtype=np.float32),
                       "b": np.full(4, world.rank + 1.0, dtype=np.float32)})
world.broadcast_params(params)                       # NCCL, device to device
grads = cupy.arange(6, dtype=cupy.float32) * (world.rank + 1)
world.allreduce_sum(grads)                           # NCCL on the current stream
say(device=cupy.cuda.Device().id, params=cupy.asnumpy(params.buffer).tolist(),
    grads=cupy.asnumpy(grads).tolist())
""")
    assert run.returncode == 0, run.stderr
    records = run.records()
    assert [records[r]["device"] for r in (0, 1)] == [0, 1]
    for record in records.values():
        assert record["params"] == [1.0] * 16
        assert record["grads"] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]
