"""minitfm.workers.distributed: the world of one process without MPI, and real MPI workers; training
with two workers (minitfm.training, train_toy.py and train_wmt.py under mpiexec) against one.

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
import re
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

from minitfm import flat
from minitfm.workers import distributed
from minitfm.workers.distributed import STOP_ERROR, DistributedError, World, describe_stops, shard
from minitfm.cli.exits import UsageError
from minitfm.cli.launch import find_mpiexec

from .conftest import cupy_device_available

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMI_FD", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                      "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
ENV = {**{k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES},
       "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}
TIMEOUT = 60          # seconds: the hard limit of one MPI run


# ---- a world of one process --------------------------------------------------------------

def test_one_process_without_a_launcher_never_imports_mpi4py():
    code = ("import sys; from minitfm.workers import distributed; w = distributed.world(); "
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
    assert world.broadcast_numbers([7, 0.5]) == [7.0, 0.5]
    assert world.broadcast_text("runs/a") == "runs/a"
    world.barrier()
    with world.root_first():
        pass
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
    """The mpiexec of this Python's environment (the MPI mpi4py loads), else the one on PATH;
    None where there is none."""
    try:
        return find_mpiexec()
    except UsageError:
        return None


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
    if done.returncode != 0 or "".join(done.stdout.split()) != "22":   # lines may interleave
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


def mpirun(script: str, workers: int = 2, timeout: float = TIMEOUT, env: dict | None = None) -> Run:
    started = time.monotonic()
    return finish(start(script, workers, env), started, timeout)


PRELUDE = """
import json, os, signal, sys, time
import numpy as np
from minitfm import flat
from minitfm.workers import distributed
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


@pytest.mark.mpi
def test_root_first_and_broadcasts_from_rank_0(mpi, tmp_path):
    cache = tmp_path / "cache"
    run = mpirun(PRELUDE + f"""
with world.root_first():                 # rank 0 makes the cache, slowly; rank 1 then finds it
    found = os.path.exists({str(cache)!r})
    if world.is_root:
        time.sleep(0.3)
        open({str(cache)!r}, "w").write("made by rank 0")
say(found=found, text=world.broadcast_text(f"runs/tr\u00e4in-{{world.rank}}"),
    numbers=world.broadcast_numbers([world.rank + 1, 2.5 * world.rank, 2**52 + 1]))
""")
    assert run.returncode == 0, run.stderr
    records = run.records()
    assert records[0]["found"] is False and records[1]["found"] is True
    for record in records.values():
        assert record["text"] == "runs/tr\u00e4in-0"
        assert record["numbers"] == [1.0, 0.0, 2**52 + 1]


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
@pytest.mark.parametrize("killed", [0, 1])
def test_a_killed_worker_ends_the_others_with_an_error_naming_it(mpi, killed):
    started = time.monotonic()
    process = start(LOOP.replace("FAIL", "pass"))
    try:
        pids = started_pids(process)
        time.sleep(0.3)
        os.kill(pids[killed], signal.SIGKILL)
    finally:
        run = finish(process, started)      # a survivor left waiting would fail at the deadline
    assert run.returncode != 0
    assert "stopped" not in run.stdout                  # no survivor carried on or stopped cleanly
    report = run.stdout + run.stderr
    assert "signal 9" in report                         # MPICH and Open MPI both say so
    # MPICH names the first worker, in rank order, that a signal ended; its clean-up may end a
    # survivor with SIGKILL before it exits, so a killed rank 0 is named on every run, and a
    # killed rank 1 is named, or the rank 0 that the clean-up killed.
    named = [rank for rank, pid in pids.items() if f"PID {pid}" in report]
    assert named in ([[0]] if killed == 0 else [[1], [0]]), report


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
    assert "stopped" not in run.stdout      # (one left waiting would fail at mpirun's deadline)


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
    done = subprocess.run([sys.executable, "-c", "from minitfm.workers import distributed; distributed.world()"],
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


def _on_devices(cupy_env: dict, devices: int) -> dict:
    """ENV for workers on the CuPy path: the double with ``devices`` emulated devices, or (with
    -m gpu) the real ones, of which there must be as many."""
    if "CUPY_DOUBLE_RULES" not in cupy_env and _gpu_count() < devices:
        pytest.skip(f"needs {devices} CUDA devices (one worker per GPU)")
    extra = {k: cupy_env[k] for k in ("PYTHONPATH", "CUPY_DOUBLE_RULES") if k in cupy_env}
    return {**ENV, **extra, "CUPY_DOUBLE_DEVICES": str(devices)}


@pytest.mark.gpu
@pytest.mark.mpi
def test_nccl_broadcast_and_allreduce_on_device_buffers(mpi, cupy_env):
    env = _on_devices(cupy_env, 2)
    run = mpirun(PRELUDE.replace("import numpy as np", "import numpy as np, cupy") + """
from minitfm import backend
from minitfm.workers import placement
backend.use("cupy")
placement.place(world, backend.name)                 # GPU local_rank
params = flat.flatten({"w": np.full((3, 4), world.rank + 1.0, dtype=np.float32),
                       "b": np.full(4, world.rank + 1.0, dtype=np.float32)})
world.broadcast_params(params)                       # NCCL, device to device
grads = cupy.arange(6, dtype=cupy.float32) * (world.rank + 1)
world.allreduce_sum(grads)                           # NCCL on the current stream
say(device=cupy.cuda.Device().id, params=cupy.asnumpy(params.buffer).tolist(),
    grads=cupy.asnumpy(grads).tolist())
""", env=env)
    assert run.returncode == 0, run.stderr
    records = run.records()
    assert [records[r]["device"] for r in (0, 1)] == [0, 1]
    for record in records.values():
        assert record["params"] == [1.0] * 16
        assert record["grads"] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]


# ---- training with two workers -----------------------------------------------------------

TRAIN = """
import json, os, sys
import numpy as np
from minitfm import backend, tasks
from minitfm.backend import products
from minitfm.workers import distributed
from minitfm.models.translator import Config
from minitfm.training import loop
from minitfm.training.run import Run
from minitfm.training.state import TrainOptions
world = distributed.world()
runs, results, watched = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
written = []                       # what this worker opened for writing or renamed in `watched`
def audit(event, args):
    if event == "open":
        path, mode, flags = args
        writing = (any(c in mode for c in "wax+") if mode
                   else flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND))
    elif event in ("os.rename", "os.remove", "os.mkdir", "os.truncate", "os.rmdir"):
        path, writing = args[0], True
    else:
        return
    if writing and isinstance(path, (str, os.PathLike)) and str(path).startswith(watched):
        written.append(f"{event} {path}")
sys.addaudithook(audit)
VOCAB = 7
def batches(epoch):                # 5 batches of different sizes an epoch, the order fixed by it
    rng = backend.host_rng(0, epoch)
    for i in range(5):
        yield tasks.to_batch(*tasks.sample("copy", rng, 2 + i % 3, vocab=VOCAB, length=3 + i % 4))
with world.fail_together():
    for run in runs:
        backend.set_float_dtype(run["dtype"])
        products.set_precision(run["precision"])
        cfg = Config.preset("tiny", src_vocab=tasks.model_vocab(VOCAB),
                            tgt_vocab=tasks.model_vocab(VOCAB), dropout=0.1)
        options = TrainOptions(
            max_steps=run["steps"], out_dir=os.path.join(watched, run["dir"]), lr_factor=2.0,
            warmup=3, update_freq=run["update_freq"], resume=run["resume"], log_every=1,
            progress=False, command={"workers": world.size})
        with Run(options, "transformer") as training:
            training.start(cfg)
            state = loop.train(training, batches)
        np.save(os.path.join(results, f"{run['name']}.rank{world.rank}.npy"), state.params.buffer)
    print(json.dumps({"rank": world.rank, "written": written}), flush=True)
    world.finish()
"""


def train_runs(workers: int, runs: list[dict], results: Path, watched: Path) -> dict[int, dict]:
    """Run TRAIN's ``runs`` (one after the other) with ``workers`` processes, plain Python for
    one; return what each rank printed."""
    argv = [sys.executable, "-c", TRAIN, json.dumps(runs), str(results), str(watched)]
    if workers > 1:
        argv = [_mpiexec(), "-n", str(workers)] + argv
    started = time.monotonic()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=ENV, start_new_session=True)
    run = finish(process, started)
    assert run.returncode == 0, run.stderr
    return run.records()


def run_spec(name, update_freq, steps, *, directory=None, dtype="float32", resume=False,
             precision="fp32"):
    return {"name": name, "dir": directory or name, "update_freq": update_freq, "steps": steps,
            "dtype": dtype, "resume": resume, "precision": precision}


@pytest.fixture(scope="module")
def worker_runs(tmp_path_factory):
    """Training runs of the tiny model (dropout 0.1) with one worker and with two, in three
    launches (about 3 s in all): one worker, two workers, one worker again (to resume)."""
    reason = _why_mpi_cannot_run()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("workers")
    results, runs = root / "results", root / "runs"
    results.mkdir()
    runs.mkdir()
    one = train_runs(1, [run_spec("one", 2, 4), run_spec("one-then-two", 2, 2),
                         run_spec("one64", 4, 3, dtype="float64"),
                         run_spec("one16", 2, 4, precision="fp16")], results, runs)
    two = train_runs(2, [run_spec("two", 1, 4), run_spec("two-then-one", 1, 2),
                         run_spec("one-then-two", 1, 4, resume=True),
                         run_spec("two64", 2, 3, dtype="float64"),
                         run_spec("two16", 1, 4, precision="fp16")], results, runs)
    train_runs(1, [run_spec("two-then-one", 2, 4, resume=True)], results, runs)
    return {"results": results, "runs": runs, "one": one, "two": two}


def result(worker_runs, name: str, rank: int = 0) -> np.ndarray:
    return np.load(worker_runs["results"] / f"{name}.rank{rank}.npy")


def final_checkpoint(worker_runs, directory: str):
    from minitfm import checkpoint
    return checkpoint.load(checkpoint.latest(worker_runs["runs"] / directory))


def logged_steps(worker_runs, directory: str) -> list[dict]:
    with open(worker_runs["runs"] / directory / "log.jsonl") as f:
        return [json.loads(line) for line in f]


@pytest.mark.mpi
def test_two_workers_in_fp16_make_the_updates_of_one_worker(worker_runs):
    """Mixed precision over two workers: the summed scaled gradients, the loss scale and the
    masked update are every worker's, and the one worker's with twice the update_freq."""
    one, two = result(worker_runs, "one16"), result(worker_runs, "two16")
    np.testing.assert_array_equal(two, one)
    np.testing.assert_array_equal(result(worker_runs, "two16", rank=1), two)
    assert not np.array_equal(one, result(worker_runs, "one"))       # fp16 ran, not float32
    scalers = [final_checkpoint(worker_runs, d).extra["loss_scaler"] for d in ("one16", "two16")]
    assert scalers[0] == scalers[1] and scalers[0]["scale"] > 0


@pytest.mark.mpi
def test_two_workers_make_the_updates_of_one_worker_with_twice_the_update_freq(worker_runs):
    """Two workers with update_freq 1 against one with update_freq 2, float32, dropout 0.1:
    bit-identical. One worker adds the two batches' gradients g0 + g1; the all-reduce adds the
    same two numbers (IEEE addition is commutative), and the masks are drawn per batch of the
    update, so not even float32 rounding can tell them apart."""
    one = result(worker_runs, "one")
    assert np.array_equal(result(worker_runs, "two", 0), one)
    assert np.array_equal(result(worker_runs, "two", 1), one)
    saved, reference = final_checkpoint(worker_runs, "two"), final_checkpoint(worker_runs, "one")
    assert (saved.step, saved.extra["epoch"], saved.extra["batches_done"]) == (4, 1, 3)
    assert saved.extra["batches_done"] == reference.extra["batches_done"]
    assert saved.extra["tokens"] == reference.extra["tokens"]
    for moment in ("m", "v"):
        for name, value in reference.optimizer_state[moment].items():
            assert np.array_equal(saved.optimizer_state[moment][name], value), (moment, name)
    for two, one in zip(logged_steps(worker_runs, "two"), logged_steps(worker_runs, "one")):
        assert two["step"] == one["step"] and two["tokens"] == one["tokens"]
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)   # float32 sums, other order


@pytest.mark.mpi
def test_two_workers_sum_in_another_order_within_float64_rounding(worker_runs):
    """Two workers with update_freq 2 against one with 4, in float64: one worker sums
    ((g0 + g1) + g2) + g3, the all-reduce (g0 + g1) + (g2 + g3). Every parameter agrees to
    1e-12 (rounding is ~1e-16 relative) except the key biases: attention is blind to them
    (softmax ignores a shift of a row of scores), so their gradient is zero up to rounding
    noise, and Adam divides that noise by sqrt(v) + eps (eps = 1e-9), turning 1e-17 into steps
    of up to ~lr * 1e-8; those agree to 1e-6. (In float32 the same noise, ~1e-9, is as large as
    eps and moves the key biases by O(lr): the reason this comparison is in float64.)"""
    from minitfm import flat, tasks
    from minitfm.models import translator
    from minitfm.models.translator import Config
    cfg = Config.preset("tiny", src_vocab=tasks.model_vocab(7), tgt_vocab=tasks.model_vocab(7))
    one, two = (flat.FlatDict(result(worker_runs, name), translator.parameter_shapes(cfg).items())
                for name in ("one64", "two64"))
    assert one.buffer.dtype == np.float64
    assert np.array_equal(result(worker_runs, "two64", 1), two.buffer)
    d = cfg.d_model
    for name in one:
        a, b = one[name], two[name]
        if name.endswith(("b_qkv", "b_kv")):                 # [q | k | v] or [k | v], d each
            key = slice(d, 2 * d) if name.endswith("b_qkv") else slice(0, d)
            np.testing.assert_allclose(b[key], a[key], rtol=0, atol=1e-6, err_msg=name)
            others = np.ones(a.size, dtype=bool)
            others[key] = False
            a, b = a[others], b[others]
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-12, err_msg=name)
    assert not np.array_equal(one.buffer, two.buffer)     # another order: not bit-identical


@pytest.mark.mpi
def test_only_rank_0_writes_files(worker_runs):
    assert worker_runs["two"][1]["written"] == []
    written = worker_runs["two"][0]["written"]
    assert any("log.jsonl" in w for w in written) and any("checkpoint_" in w for w in written)
    run_dir = worker_runs["runs"] / "two"
    assert sorted(p.name for p in run_dir.iterdir()) == \
        sorted(p.name for p in (worker_runs["runs"] / "one").iterdir())
    assert [r["step"] for r in logged_steps(worker_runs, "two")] == [1, 2, 3, 4]   # once each
    assert json.loads((run_dir / "run.json").read_text())["args"] == {"workers": 2}


@pytest.mark.mpi
def test_resume_from_two_workers_into_one_and_from_one_into_two(worker_runs):
    """2 steps with one number of workers, 2 more with the other, from the checkpoint: the
    parameters of 4 uninterrupted steps (the checkpoint holds the position in the one global
    batch order; each update here is the same 2 batches)."""
    one = result(worker_runs, "one")
    assert np.array_equal(result(worker_runs, "two-then-one"), one)
    assert np.array_equal(result(worker_runs, "one-then-two", 0), one)
    assert np.array_equal(result(worker_runs, "one-then-two", 1), one)
    for directory in ("two-then-one", "one-then-two"):
        assert [r["step"] for r in logged_steps(worker_runs, directory)] == [1, 2, 3, 4]


def launch(argv: list[str], workers: int = 2) -> subprocess.Popen:
    return subprocess.Popen([_mpiexec(), "-n", str(workers), sys.executable] + argv,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            start_new_session=True)


@pytest.mark.mpi
def test_sigterm_to_one_training_worker_stops_both_with_a_checkpoint(mpi, tmp_path):
    out = tmp_path / "run"
    toy = [str(ROOT / "train_toy.py"), "--preset", "tiny", "--out", str(out), "--quiet",
           "--eval-size", "20", "--examples", "0"]
    started = time.monotonic()
    process = launch(toy + ["--max-steps", "100000"])
    try:
        header = process.stdout.readline()               # rank 0's placement, then its header
        while header.startswith("placement:"):           # the header names every worker's pid
            header = process.stdout.readline()
        pid = int(re.search(r"rank 1 pid (\d+)", header).group(1))
        while not (out / "log.jsonl").exists() and time.monotonic() - started < TIMEOUT / 2:
            time.sleep(0.05)                             # training is under way
        os.kill(pid, signal.SIGTERM)
    finally:
        run = finish(process, started)
    assert run.returncode == 143, run.stderr                       # 128 + SIGTERM, from both
    stops = re.findall(r"stopped by SIGTERM at step (\d+); checkpoint (\S+) saved", run.stdout)
    assert len(stops) == 1, run.stdout                             # said once, by rank 0
    step = int(stops[0][0])
    from minitfm import checkpoint
    assert [s for s, _ in checkpoint.list_checkpoints(out)] == [step]
    assert checkpoint.load(stops[0][1]).step == step

    # one worker continues the run from there
    done = subprocess.run([sys.executable] + toy + ["--max-steps", str(step + 2), "--resume"],
                          capture_output=True, text=True, env=ENV, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert [s for s, _ in checkpoint.list_checkpoints(out)][-1] == step + 2


@pytest.mark.mpi
def test_train_wmt_with_two_workers(mpi, tmp_path):
    """Rank 0 builds the vocabulary and the encoded corpora, then both train; rank 0 alone
    prints, writes the run directory and scores the test set."""
    from .test_train_wmt import TINY, sentence_pairs, write_split
    for split, n, seed in (("train", 300, 0), ("val", 30, 1), ("test", 20, 2)):
        write_split(tmp_path / split, *sentence_pairs(n, seed))
    out = tmp_path / "run"
    started = time.monotonic()
    run = finish(launch([str(ROOT / "train_wmt.py"), "--trainpref", str(tmp_path / "train"),
                         "--validpref", str(tmp_path / "val"), "--testpref",
                         str(tmp_path / "test"), "--max-steps", "4", "--save-every", "2",
                         "--log-every", "1", "--out", str(out), *TINY]), started)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("done: step 4") == 1
    assert re.search(r"workers  2 workers: rank 0 pid \d+ on \S+, rank 1 pid \d+", run.stdout)
    assert "x 1 x 2 workers" in run.stdout
    with open(out / "log.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2, 3, 4, 4]   # 4: validation
    assert (out / "averaged.test.bleu.json").exists()
    assert len(list((out / "data").glob("encoded-*"))) == 1
