"""The operation and sync counter of benchmarks/bench_ops.py (op_counter.py) counts what it says
it counts, and bench_ops.py counts the kernel launches of CuPy's path on the double."""

import importlib.util
import pathlib
import sys

import numpy
import pytest

from minitfm import backend
from minitfm.models import translator

from tests.conftest import cupy_double

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module               # bench_ops imports it by this name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def counter():
    return load("op_counter")


@pytest.fixture(scope="module")
def bench(counter):
    return load("bench_ops")


def counted(bench, work):
    bench.TALLY.ops.clear()
    bench.TALLY.syncs.clear()
    with bench.counting_backend():
        work(backend.xp)
    return sum(bench.TALLY.ops.values()), sum(bench.TALLY.syncs.values())


def test_functions_ufuncs_and_reductions_count_once_each(bench, numpy_backend):
    def work(xp):
        a = xp.ones((4, 3), dtype=xp.float32)       # 1
        b = xp.exp(a)                              # 1 (not 2: exp on a counted array inside)
        b += a                                     # 1
        c = a @ b.T                                # 1 (the transpose is a view)
        c.mean(axis=1)                             # 1
        xp.einsum("ij,ij->i", a, b)                # 1
    assert counted(bench, work) == (6, 0)


def test_views_are_free_and_copies_count(bench, numpy_backend):
    def work(xp):
        xp.empty((4, 6), dtype=xp.float32)         # an allocation that writes nothing: free
        a = xp.zeros((4, 6), dtype=xp.float32)     # 1
        a[1:3].reshape(-1)                         # view of contiguous rows: free
        a.T.reshape(-1)                            # not a view: a copy, 1
        a[:, ::2]                                  # view: free
        a[xp.asarray([0, 2])]                      # asarray 1 + gather 1
        a[0] = 1.0                                 # write: 1
        a.astype(xp.float64)                       # 1
    assert counted(bench, work) == (6, 0)


def test_conversions_to_host_count_as_syncs(bench, numpy_backend):
    def work(xp):
        a = xp.arange(5)                           # 1
        s = a.sum()                                # 1: a 0-d array, as on a GPU
        assert not isinstance(s, numpy.generic)
        int(s)                                     # sync
        float(a.max())                             # 1 op, 1 sync
        a.tolist()                                 # sync
        backend.to_host(a)                         # sync
    assert counted(bench, work) == (3, 4)


def test_shapes_that_depend_on_the_data_count_as_syncs(bench, numpy_backend):
    def work(xp):
        a = xp.arange(6)                           # 1
        xp.flatnonzero(a > 2)                      # compare 1 + flatnonzero 1, sync
        a[a > 2]                                   # compare 1 + gather 1, sync
        a[xp.asarray([1, 2])]                      # asarray 1 + gather 1: shape known, no sync
    assert counted(bench, work) == (7, 2)


def test_one_update_is_counted_by_phase(bench, numpy_backend):
    cfg = translator.Config.preset("tiny")
    result = bench.per_update(cfg, 1, sentences=2, src_len=5, tgt_len=5, clip_norm=1.0)
    phases = result["by_phase"]
    assert set(phases) <= {"forward", "backward", "optimizer", "loop"}
    assert phases["forward"] > 0 and phases["backward"] > 0
    n_params = len(translator.parameter_shapes(cfg))
    assert 0 < phases["optimizer"] < n_params       # whole flat buffers, not array by array
    assert result["ops"] == sum(phases.values())
    assert result["syncs"] == 0                     # nothing waits for the device in an update


def test_the_clock_times_each_operation_once_and_splits_off_the_products(counter, numpy_backend):
    def make_step():
        xp = backend.xp
        a = xp.ones((64, 64), dtype=xp.float32)     # set-up: not timed

        def step():
            b = a @ a
            xp.exp(b / 64.0)                        # exp once, not again for its inner ufunc
        return step

    seconds = counter.clocked(make_step, steps=2)
    assert {name for _, _, name in seconds} == {"matmul", "divide", "exp"}
    assert all(s > 0 for s in seconds.values())
    products, others = counter.split_seconds(seconds)
    assert products == seconds["loop", "other", "matmul"]
    assert others["other"] == pytest.approx(seconds["loop", "other", "divide"]
                                            + seconds["loop", "other", "exp"])
    assert counter.TALLY.clock is None              # off again: counting runs are not timed


def test_call_sites_are_attributed_to_their_module(bench):
    assert bench.module_of("/src/minitfm/minitfm/layers/attention.py:97 (forward)") == \
        "layers.attention"
    assert bench.module_of("/src/minitfm/minitfm/backend/philox.py:70 (block)") == "backend.philox"
    assert bench.module_of("<string>:3 (<module>)") == "other"


def test_launches_on_cupys_path_include_philox(bench, numpy_backend):
    """Dropout's masks on the CuPy path are Philox's array operations: launches there, none in
    the NumPy count of operations; an update's launches are counted by module."""
    cfg = translator.Config.preset("tiny", dropout=0.1)
    batches = bench.make_batches(cfg, 1, sentences=2, src_len=5, tgt_len=5)
    with cupy_double("14") as cupy:
        backend.use("cupy")
        one = bench.launch_run(cupy, cfg, batches, 1, 1, 1.0)
        launches = bench.launch_run(cupy, cfg, batches, 2, 1, 1.0) - one
        backend.use("numpy")
    ops = bench.per_update(cfg, 1, sentences=2, src_len=5, tgt_len=5, clip_norm=1.0)
    assert "other" not in launches and launches["backend.philox"] > 0
    assert "backend.philox" not in ops["by_module"]
    for module in ("layers.layernorm", "layers.linear"):
        assert launches[module] == ops["by_module"][module]      # one launch per operation


def test_fused_kernels_cut_the_launches_and_nothing_waits(bench, numpy_backend):
    """Plain and fused counts side by side: the fused update launches a fraction of the plain
    one's kernels (Philox's masks drawn inside the kernels), and neither copies to the host."""
    cfg = translator.Config.preset("tiny", dropout=0.1, attention_dropout=0.1, relu_dropout=0.1)
    with cupy_double("14"):
        result = bench.launches_per_update(cfg, 1, sentences=2, src_len=5, tgt_len=5,
                                           clip_norm=1.0)
    assert result["device_to_host"] == result["device_to_host_fused"] == 0, result
    assert result["device_to_host_fp16"] == 0, result
    assert "backend.philox" in result["launches_by_module"]
    assert "backend.philox" not in result["launches_by_module_fused"]
    assert result["launches_by_module_fused"]["fused kernels"] > 0
    assert result["launches_fused"] < result["launches"] / 3, result
    # fp16: float16 casts and GEMMs in mixed, the scaler's kernels; no float32 product left
    assert result["launches_by_module_fp16"]["speed.mixed"] > 0
    assert result["launches_fp16"] < result["launches"] / 3, result


@pytest.mark.slow
def test_the_base_update_keeps_its_launch_budget(bench, numpy_backend):
    """The budget itself: one ``base`` update of one batch with fused kernels and fp16 launches at
    most bench_ops.LAUNCH_BUDGET kernels on the double (737 measured), and copies nothing to the
    host (about 3 minutes: the base model, three paths, two runs each)."""
    cfg = translator.Config.preset("base")
    with cupy_double("14"):
        result = bench.launches_per_update(cfg, 1, sentences=4, src_len=12, tgt_len=12,
                                           clip_norm=1.0)
    assert result["launches_fp16"] <= bench.LAUNCH_BUDGET, result["launches_by_module_fp16"]
    assert result["device_to_host_fp16"] == result["device_to_host_fused"] == 0, result
