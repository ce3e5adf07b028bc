"""The CuPy double (tests/cupy_double): each rule of its RULES.md, exercised.

The double stands in for CuPy in the default test run, so it must refuse what CuPy refuses and
count what costs a device-to-host copy; these tests hold it to that (the conformance test holds
it to the real package's names and signatures where CuPy is installed).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pytest

from .conftest import CUPY_RULES, cupy_double, cupy_double_env
from .test_distributed import ENV, _why_mpi_cannot_run, finish, json_records, start
from tests import forkserver


@pytest.fixture(params=CUPY_RULES, ids=[f"cupy{r}" for r in CUPY_RULES])
def cp(request):
    """The double as ``cupy``, under each CuPy release's rules, with 2 emulated devices."""
    with cupy_double(request.param, devices=2) as module:
        yield module


@pytest.fixture
def cp14():
    with cupy_double("14", devices=2) as module:
        yield module


@pytest.fixture
def cp13():
    with cupy_double("13", devices=2) as module:
        yield module


# ---- the array and NumPy ---------------------------------------------------------------------

def test_version_follows_the_rules(cp):
    assert cp.__version__ == {14: "14.2.0", 13: "13.6.0"}[cp._double.RULES]


def test_arrays_are_not_numpy_arrays_and_numpy_cannot_take_them(cp):
    x = cp.arange(3.0)
    assert not isinstance(x, np.ndarray) and type(x).__module__ == "cupy"
    for convert in (np.asarray, np.array, lambda a: np.testing.assert_allclose(a, [0, 1, 2])):
        with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
            convert(x)


def test_numpy_array_operands_are_refused(cp):
    x, host = cp.arange(3.0), np.ones(3)
    refusals = [lambda: x + host, lambda: host + x, lambda: x * host, lambda: cp.add(x, host),
                lambda: cp.maximum(host, 1.0), lambda: cp.where(x > 0, host, x),
                lambda: cp.exp(host), lambda: x.__iadd__(host), lambda: cp.einsum("i,i", x, host)]
    for refuse in refusals:
        with pytest.raises(TypeError, match="Unsupported type <class 'numpy.ndarray'>"):
            refuse()
    assert float((x + np.float32(2.0)).sum()) == 9.0            # NumPy scalars are fine
    assert float((2 * x + 1).max()) == 5.0                       # Python scalars too


def test_numpy_functions_dispatch_to_the_double(cp):
    x = cp.arange(6.0).reshape(2, 3)
    for result in (np.sum(x), np.exp(x), np.linalg.norm(x), np.concatenate([x, x]), np.mean(x, 0)):
        assert isinstance(result, cp.ndarray)
    assert np.sum(x).shape == () and float(np.sum(x)) == 15.0
    with pytest.raises(TypeError, match="no implementation found"):
        np.median(x)                       # CuPy has it; the double does not: refused, not converted
    with pytest.raises(TypeError, match="no implementation found"):
        np.lib.stride_tricks.sliding_window_view(x, 2)


def test_reductions_return_0d_device_arrays(cp):
    x = cp.arange(4.0)
    for result in (x.sum(), x.max(), x.mean(), cp.linalg.norm(x), cp.vdot(x, x), x.argmax(),
                   cp.einsum("i,i->", x, x), cp.allclose(x, x)):
        assert isinstance(result, cp.ndarray) and result.shape == ()


def test_no_index_conversion(cp):
    n = cp.asarray(3)
    with pytest.raises(TypeError):
        range(n)
    with pytest.raises(TypeError):
        [1, 2, 3, 4][n]


# ---- keywords and signatures -----------------------------------------------------------------

def test_ufunc_keywords(cp):
    x, out = cp.arange(3.0), cp.empty(3)
    assert cp.exp(x, out=out) is out
    cp.exp(x, dtype=np.float64, casting="same_kind")
    for keyword in ("order", "where", "subok", "axis"):
        with pytest.raises(TypeError, match=f"Wrong arguments {{'{keyword}'"):
            cp.exp(x, **{keyword: None})
    with pytest.raises(TypeError, match="Output arguments must be cupy.ndarray"):
        cp.exp(x, out=np.empty(3))
    ints = cp.arange(3)
    with pytest.raises(Exception):          # same_kind casting: float into int, as CuPy refuses
        ints += 1.5


def test_einsum_takes_only_dtype_and_optimize(cp):
    a = cp.ones((2, 3))
    for keyword in ("out", "order", "casting"):
        with pytest.raises(TypeError, match=rf"Did not understand the following kwargs: \['{keyword}'\]"):
            cp.einsum("ij->i", a, **{keyword: None})
    assert float(cp.einsum("ij->", a, dtype=np.float64, optimize=True)) == 6.0


def test_astype_reshape_sort_rules(cp):
    x = cp.arange(6.0)
    with pytest.raises(TypeError, match="subok"):
        x.astype(np.float32, subok=True)
    assert x.astype(np.float64, copy=False) is x
    with pytest.raises(ValueError, match="kind can only be None or 'stable'"):
        cp.argsort(x, kind="quicksort")
    with pytest.raises(ValueError, match="kind can only be None or 'stable'"):
        cp.sort(x, kind="quicksort")
    if cp._double.RULES >= 14:
        assert x.reshape(2, 3, copy=False).shape == (2, 3)
        assert cp.reshape(x, (3, 2), copy=True).shape == (3, 2)
        assert cp.asarray(x, copy=False) is x
        x.sort(kind="stable")
        x.argsort(kind=None)
        with pytest.raises(ValueError, match="kind can only be None or 'stable'"):
            x.sort(kind="quicksort")
    else:
        for call in (lambda: x.reshape(2, 3, copy=False), lambda: cp.reshape(x, (3, 2), copy=True),
                     lambda: cp.asarray(x, copy=False), lambda: x.sort(kind="stable"),
                     lambda: x.argsort(kind=None)):
            with pytest.raises(TypeError, match="unexpected keyword argument"):
                call()


def test_matmul_dot_cumsum_out_rules(cp):
    a = cp.ones((2, 2), dtype=np.float32)
    with pytest.raises(ValueError, match="Scalar operands are not allowed"):
        cp.matmul(a, 2.0)
    with pytest.raises(TypeError, match="`out` must be a tuple or `cupy.ndarray`"):
        cp.matmul(a, a, out=np.empty((2, 2), np.float32))
    with pytest.raises(TypeError if cp._double.RULES >= 14 else RuntimeError):
        cp.matmul(a, a, foo=1)
    out = cp.empty((2, 2), dtype=np.float32)
    assert cp.matmul(a, a, out=out) is out and float(out.sum()) == 8.0
    with pytest.raises(ValueError, match="Not supported dtype combination"):
        cp.dot(a, a, out=cp.empty((2, 2), dtype=np.float64))
    with pytest.raises(ValueError, match="Output array must be C-contiguous"):
        cp.dot(a, a, out=cp.empty((2, 2), dtype=np.float32).T)
    values = cp.arange(4, dtype=np.float32)
    prefix = cp.zeros(5, dtype=np.float64)
    cp.cumsum(values, axis=0, dtype=np.float64, out=prefix[1:])
    assert prefix.tolist() == [0.0, 0.0, 1.0, 3.0, 6.0]
    with pytest.raises(TypeError, match="Argument 'out' has incorrect type"):
        cp.cumsum(values, out=np.zeros(4))


# ---- device-to-host copies, counted -----------------------------------------------------------

def test_each_device_to_host_copy_is_counted_once(cp):
    x = cp.arange(6.0)
    mask = x > 2
    copies = {
        "float": lambda: float(x[0]), "int": lambda: int(x[1]), "bool": lambda: bool(x[1]),
        "item": lambda: x[2].item(), "tolist": lambda: x.tolist(), "get": lambda: x.get(),
        "asnumpy": lambda: cp.asnumpy(x), "repr": lambda: repr(x), "str": lambda: str(x),
        "format": lambda: f"{x[0]:.2f}", "mask index": lambda: x[mask],
        "mask assignment": lambda: x.__setitem__(mask, 0.0), "nonzero": lambda: cp.nonzero(x),
        "one-argument where": lambda: cp.where(mask), "flatnonzero": lambda: cp.flatnonzero(x),
        "unique": lambda: cp.unique(x), "host mask": lambda: x[np.array([True] * 6)],
    }
    for what, copy in copies.items():
        with cp._double.counting() as syncs:
            copy()
        assert syncs.device_to_host == 1, what
        assert "test_cupy_double.py" in syncs.events[0]["where"], syncs.events


def test_device_work_costs_no_copy(cp):
    cp._double.reset()
    x = cp.arange(12.0).reshape(3, 4)
    ids = cp.asarray([2, 0, 2])
    with cp._double.counting() as syncs:
        y = (x @ x.T + 1.0) * 2
        y[ids] += 1.0
        z = cp.take_along_axis(y, cp.argsort(y, axis=1), axis=1)
        s = z.sum() / z.size + cp.linalg.norm(z) + cp.exp(z / 100).max()
        cp.cumsum(x, axis=0)
        cp.searchsorted(cp.arange(5), ids)
        cp.random.default_rng([1, 2]).random((3,), dtype=np.float32)
        for row in x:                     # iteration yields device arrays: no copy by itself
            row + 1
        len(x), x.shape, x.dtype, x.data.ptr
    assert syncs.device_to_host == 0, cp._double.describe(syncs.events)
    assert syncs.generators == 1
    assert isinstance(s, cp.ndarray)
    counts = cp._double.counts()
    assert (counts["device_to_host"], counts["generators"]) == (0, 1)


def test_counts_report_at_exit_and_traces(tmp_path):
    report = tmp_path / "counts.json"
    env = {**cupy_double_env("14", report=report), "CUPY_DOUBLE_TRACE": "1"}
    code = ("import cupy\nx = cupy.arange(3.0)\nfloat(x.sum())\nx.tolist()\n"
            "cupy.random.default_rng(0)\n")
    done = forkserver.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    data = json.loads(report.read_text())
    assert data["rules"] == 14
    assert (data["counts"]["device_to_host"], data["counts"]["generators"]) == (2, 1)
    assert data["counts"]["launches"] == 3         # arange, sum, the cuRAND states' set-up
    assert [(e["what"], e["where"].split(" ")[0]) for e in data["events"]] == [
        ("float()", "<string>:3"), ("tolist()", "<string>:4"), ("default_rng()", "<string>:5")]


# ---- memory ----------------------------------------------------------------------------------

def test_empty_is_filled_with_garbage(cp):
    assert np.isnan(cp.empty((2, 3)).get()).all()
    assert np.isnan(cp.empty_like(cp.zeros(4, dtype=np.float32)).get()).all()
    assert np.isnan(cp.ndarray((3,), dtype=np.float32).get()).all()
    garbage = cp.empty(3, dtype=np.int64).get()
    assert (garbage == np.iinfo(np.int64).max - 6).all()


def test_pointers_name_allocations_and_offsets(cp):
    x = cp.zeros((4, 3), dtype=np.float32)
    y = cp.zeros((4, 3), dtype=np.float32)
    assert x.data.ptr != y.data.ptr
    assert x[1].data.ptr == x.data.ptr + 12 and x[1:].data.ptr == x[1].data.ptr
    assert x.reshape(-1).data.ptr == x.data.ptr and (x + 0).data.ptr != x.data.ptr
    assert x.__cuda_array_interface__["data"] == (x.data.ptr, False)
    assert x.flags.c_contiguous and not x.T.flags.c_contiguous


def test_memory_is_accounted_and_bounded(cp):
    free, total = cp.cuda.runtime.memGetInfo()
    assert total == 16 << 30
    x = cp.zeros(1 << 20, dtype=np.float32)
    assert cp.cuda.runtime.memGetInfo()[0] == free - (4 << 20)
    del x
    assert cp.cuda.runtime.memGetInfo()[0] == free
    with pytest.raises(cp.cuda.memory.OutOfMemoryError, match="Out of memory allocating"):
        cp.empty(17 << 30, dtype=np.uint8)


# ---- devices and streams ---------------------------------------------------------------------

def test_devices(cp):
    assert cp.cuda.runtime.getDeviceCount() == 2 and cp.is_available()
    assert cp.cuda.Device().id == 0
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError,
                       match="cudaErrorInvalidDevice: invalid device ordinal"):
        cp.cuda.Device(2).use()
    x = cp.ones(3)
    with cp.cuda.Device(1):
        assert cp.cuda.Device().id == 1
        y = cp.ones(3)
        with pytest.raises(ValueError, match=r"resides \(0\) is different from the current device \(1\)"):
            x + y
    assert cp.cuda.Device().id == 0 and y.device.id == 1 and x.data.device_id == 0
    cp.cuda.Device(1).use()
    assert cp.cuda.runtime.getDevice() == 1
    cp.cuda.Device(0).use()
    assert cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    assert cp.cuda.get_current_stream().ptr == 0
    with cp.cuda.Stream() as stream:
        assert cp.cuda.get_current_stream() is stream and stream.ptr != 0
    cp.cuda.Stream.null.synchronize()


# ---- random ----------------------------------------------------------------------------------

def test_generator_has_cupys_methods_only_and_is_counted(cp):
    cp._double.reset()
    g = cp.random.default_rng([3, 1, 4])
    for missing in ("choice", "permutation", "shuffle", "normal", "bytes"):
        assert not hasattr(g, missing)
    draws = g.random((5,), dtype=np.float32)
    assert isinstance(draws, cp.ndarray) and draws.dtype == np.float32
    again = cp.random.default_rng([3, 1, 4]).random((5,), dtype=np.float32)
    assert cp._double.counts()["generators"] == 2
    assert draws.tolist() == again.tolist()
    with cp.cuda.Device(1):
        with pytest.raises(RuntimeError, match="allocated in a different device"):
            g.random(3)


# ---- NCCL ------------------------------------------------------------------------------------

def test_nccl_unique_id_type(cp):
    from cupy.cuda import nccl
    unique_id = nccl.get_unique_id()
    if cp._double.RULES >= 14:
        assert isinstance(unique_id, bytes) and len(unique_id) == 128
        other = tuple(unique_id)
        expected = "bytes"
    else:
        assert isinstance(unique_id, tuple) and len(unique_id) == 128
        assert all(-128 <= v < 128 for v in unique_id)
        other, expected = bytes(128), "tuple"
    with pytest.raises(TypeError, match=f"expected {expected}, got"):
        nccl.NcclCommunicator(2, other, 0)


NCCL_SCRIPT = """
import json, os, sys
from mpi4py import MPI
import cupy
from cupy.cuda import nccl
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
cupy.cuda.Device(rank % cupy.cuda.runtime.getDeviceCount()).use()
uid = nccl.get_unique_id() if rank == 0 else None
uid = comm.bcast(uid, root=0)
try:
    communicator = nccl.NcclCommunicator(2, uid, rank)
except nccl.NcclError as exc:
    print(json.dumps({"rank": rank, "error": str(exc)}), flush=True)
    sys.exit(0)
x = cupy.arange(4, dtype=cupy.float32) * (rank + 1)
b = cupy.full(3, rank + 5.0)
communicator.allReduce(x.data.ptr, x.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                       cupy.cuda.get_current_stream().ptr)
communicator.bcast(b[1:].data.ptr, 2, nccl.NCCL_FLOAT64, 0, 0)
print(json.dumps({"rank": rank, "device": cupy.cuda.Device().id, "x": x.tolist(),
                  "b": b.tolist()}), flush=True)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("rules", CUPY_RULES)
@pytest.mark.parametrize("devices", [2, 1])
def test_nccl_over_mpi(rules, devices):
    reason = _why_mpi_cannot_run()
    if reason:
        pytest.skip(reason)
    env = cupy_double_env(rules, devices=devices, base=ENV)
    run = finish(start(NCCL_SCRIPT, 2, env), time.monotonic())
    assert run.returncode == 0, run.stderr
    records = {r["rank"]: r for r in json_records(run.stdout)}
    assert sorted(records) == [0, 1]
    if devices == 1:                     # both ranks on device 0: NCCL refuses
        for record in records.values():
            assert "NCCL_ERROR_INVALID_USAGE" in record["error"]
            assert "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 0" in record["error"]
        return
    for rank, record in records.items():
        assert record["device"] == rank
        assert record["x"] == [0.0, 3.0, 6.0, 9.0]
        assert record["b"] == [rank + 5.0, 5.0, 5.0]
