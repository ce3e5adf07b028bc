"""CUDA C kernels executed on the CPU (minitfm.cudahost): CUDA's semantics where the model has
them, every fault it promises to find named by kernel, block, thread and line, and everything
it does not model refused by name.

The kernels here are small sources of the tests' own; the shipped kernels' faults, planted in
copies of them, are tests/test_kernels.py's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from minitfm import cudahost
from minitfm.speed import fused
from minitfm.cudahost import cxx
from tests import forkserver

i32, i64, f32 = np.int32, np.int64, np.float32


def kernel(body: str, name: str = "k") -> cudahost.HostKernel:
    return cudahost.HostKernel(body, name)


# ---- CUDA's semantics ----------------------------------------------------------------------------

HALVES = fused.HALF_CONVERSIONS + r"""
extern "C" __global__ void halves(const half_bits* h, float* f, const float* x, half_bits* y,
                                  long long n, long long m) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) f[i] = half_to_float(h[i]);
    if (i < m) y[i] = float_to_half(x[i]);
}
"""


def _floats_to_round(exact):
    """Every half, its neighbouring floats, the ties between halves and their neighbours, many
    normal and subnormal floats, overflow and the specials."""
    mid = ((exact[:-1].astype(np.float64) + exact[1:]) / 2).astype(np.float32)
    rng = np.random.default_rng(0)
    return np.concatenate([
        exact, np.nextafter(exact, -np.inf, dtype=np.float32),
        np.nextafter(exact, np.inf, dtype=np.float32), mid, np.nextafter(mid, np.float32(0)),
        rng.standard_normal(50_000).astype(np.float32) * 3e4,
        rng.standard_normal(50_000).astype(np.float32) * 1e-6,
        np.float32([65504, 65519.99, 65520, 1e9, -1e9, np.inf, -np.inf, 0, -0.0, 2 ** -25,
                    2 ** -24 * 1.5, 2 ** -26, np.nan])])


def test_the_ptx_half_conversions_are_bit_exact():
    """Every half to float, and floats around every rounding boundary, subnormals, overflow
    and specials to half, as NumPy converts them (round to nearest even); a NaN becomes the
    canonical 0x7fff, as cvt.rn.f16.f32 makes it."""
    h = np.arange(1 << 16, dtype=np.uint16)
    exact = h.view(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore"):                   # the NaNs among the halves
        x = _floats_to_round(exact)
    f, y = np.empty(h.size, np.float32), np.empty(x.size, np.uint16)
    k = kernel(HALVES, "halves")
    k((x.size // 256 + 1,), (256,), (h, f, x, y, i64(h.size), i64(x.size)))
    numbers = ~np.isnan(exact)
    assert np.array_equal(f[numbers].view(np.uint32), exact[numbers].view(np.uint32))
    assert np.isnan(f[~numbers]).all()
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).view(np.uint16)
    expected = np.where(np.isnan(x), np.uint16(0x7FFF), expected)
    wrong = np.flatnonzero(y != expected)
    assert wrong.size == 0, [(x[i], hex(y[i]), hex(expected[i])) for i in wrong[:5]]


WARPS = r"""
extern "C" __global__ void warps(int* out, unsigned int* votes, float* t, int* count) {
    __shared__ float tile[4][33];
    __shared__ int hits;
    int lane = threadIdx.x, row = threadIdx.y;
    int block = blockIdx.y * gridDim.x + blockIdx.x;
    int me = (block * blockDim.z + threadIdx.z) * blockDim.y * blockDim.x + row * blockDim.x + lane;
    int v = me * 10;
    out[me * 6 + 0] = __shfl_xor_sync(0xffffffffu, v, 5);
    out[me * 6 + 1] = __shfl_up_sync(0xffffffffu, v, 3);
    out[me * 6 + 2] = __shfl_down_sync(0xffffffffu, v, 2, 16);
    out[me * 6 + 3] = __shfl_sync(0xffffffffu, v, 7, 8);
    out[me * 6 + 4] = __any_sync(0xffffffffu, lane == 31 && row == 0);
    out[me * 6 + 5] = __all_sync(0xffffffffu, lane >= 0);
    unsigned int b = __ballot_sync(0xffffffffu, lane % 3 == 0);
    if (lane == 0) votes[block * blockDim.z * blockDim.y + threadIdx.z * blockDim.y + row] = b;
    if (threadIdx.z == 0) tile[row][lane] = (float)(row * 100 + lane);
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) hits = 0;
    __syncthreads();
    if (threadIdx.z == 1) t[block * 128 + lane * 4 + row] = tile[row][lane];
    __syncthreads();
    atomicAdd(&hits, 1);
    atomicAdd(&count[0], 2);
    __syncthreads();
    if (lane == 0 && row == 0 && threadIdx.z == 0) count[1 + block] = hits;
}
"""


@pytest.mark.parametrize("seed", [0, 7])
def test_blocks_threads_and_warp_operations_follow_cuda(seed):
    """A grid of 3 x 2 blocks of 32 x 4 x 2 threads: CUDA's indices, the four shuffles (with a
    width), the votes, a two-dimensional __shared__ array read across a barrier, atomics; the
    same in the natural order and in a seeded one."""
    blocks, threads = 6, 256
    out = np.zeros(blocks * threads * 6, np.int32)
    votes = np.zeros(blocks * 8, np.uint32)
    t = np.zeros(blocks * 128, np.float32)
    count = np.zeros(1 + blocks, np.int32)
    kernel(WARPS, "warps")((3, 2), (32, 4, 2), (out, votes, t, count), seed=seed)
    me = np.arange(blocks * threads)
    lane = me % 32
    v = me * 10
    got = out.reshape(-1, 6)
    assert np.array_equal(got[:, 0], (me ^ 5) * 10)
    assert np.array_equal(got[:, 1], np.where(lane >= 3, v - 30, v))
    assert np.array_equal(got[:, 2], np.where(lane % 16 < 14, v + 20, v))
    assert np.array_equal(got[:, 3], (me - lane % 8 + 7) * 10)
    warp_has_lane_31_row_0 = (me // 32) % 4 == 0
    assert np.array_equal(got[:, 4], warp_has_lane_31_row_0.astype(np.int32))
    assert (got[:, 5] == 1).all()
    assert (votes == sum(1 << i for i in range(0, 32, 3))).all()
    rows, lanes = np.meshgrid(np.arange(4), np.arange(32), indexing="ij")
    expected_tile = np.zeros(128, np.float32)
    expected_tile[lanes.ravel() * 4 + rows.ravel()] = rows.ravel() * 100 + lanes.ravel()
    assert np.array_equal(t.reshape(blocks, 128), np.tile(expected_tile, (blocks, 1)))
    assert count[0] == 2 * blocks * threads and (count[1:] == threads).all()


# ---- faults, each named by kernel, block, thread and line --------------------------------------

def fault_of(source: str, grid, block, args, name: str = "k", seed: int = 0):
    with pytest.raises(cudahost.KernelFault) as caught:
        kernel(source, name)(grid, block, args, seed=seed)
    return caught.value


ROW_SUM = r"""
extern "C" __global__ void k(const float* x, float* y, int d) {
    float s = 0.0f;
    for (int c = 0; c <= d; ++c) s += x[blockIdx.x * d + c];     // one past the row
    if (threadIdx.x == 0) y[blockIdx.x] = s;
}
"""


def test_a_read_outside_an_array_is_named_with_its_index_and_line():
    x, y = np.ones((3, 8), np.float32), np.zeros(3, np.float32)
    fault = fault_of(ROW_SUM, (3,), (32,), (x, y, i32(8)))
    assert fault.kernel == "k" and fault.block == (2, 0, 0) and fault.thread == (0, 0, 0)
    assert "reads x[24], outside its 24 elements" in str(fault)
    assert "line 4 of the kernel's source: for (int c = 0; c <= d; ++c)" in str(fault)
    # a view ends where the view ends, not where its buffer does
    buffer = np.ones(100, np.float32)
    fault = fault_of(ROW_SUM, (3,), (32,), (buffer[:24], y, i32(8)))
    assert "reads x[24], outside its 24 elements" in str(fault)


def test_a_write_before_an_array_is_a_fault():
    source = r"""extern "C" __global__ void k(float* y) { y[(int)threadIdx.x - 1] = 1.0f; }"""
    fault = fault_of(source, (1,), (4,), (np.zeros(4, np.float32),))
    assert "writes y[-1], outside its 4 elements" in str(fault) and fault.thread == (0, 0, 0)


NO_BARRIER = r"""
extern "C" __global__ void k(const float* x, float* y) {
    __shared__ float row[64];
    row[threadIdx.x] = x[blockIdx.x * 64 + threadIdx.x];
    %s
    y[blockIdx.x * 64 + threadIdx.x] = row[63 - threadIdx.x];    // another thread's element
}
"""


def test_a_missing_barrier_is_a_race_in_any_order():
    x, y = np.arange(128, dtype=np.float32), np.zeros(128, np.float32)
    kernel(NO_BARRIER % "__syncthreads();")((2,), (64,), (x, y))
    assert np.array_equal(y, np.concatenate([x[63::-1], x[:63:-1]]))
    for seed in (0, 3, 11):
        fault = fault_of(NO_BARRIER % "", (2,), (64,), (x, y), seed=seed)
        assert "__shared__ row" in str(fault) and "barrier missing" in str(fault), str(fault)
        assert "line 6" in str(fault)


def test_a_barrier_in_a_branch_is_a_deadlock_not_a_hang():
    source = r"""
extern "C" __global__ void k(float* y) {
    if (threadIdx.x < 16) __syncthreads();
    else y[threadIdx.x] = 1.0f;
    __syncthreads();
}
"""
    fault = fault_of(source, (2,), (64,), (np.zeros(64, np.float32),))
    assert fault.block == (0, 0, 0) and fault.thread is None
    assert ("deadlock: the threads of the block wait at different barriers: threads 0-15 at "
            "__syncthreads() on line 3, threads 16-63 at __syncthreads() on line 5") in str(fault)


def test_a_barrier_that_returned_threads_never_reach_is_a_deadlock():
    source = r"""
extern "C" __global__ void k(float* y, int n) {
    if (threadIdx.x >= n) return;
    __syncthreads();
    y[threadIdx.x] = 1.0f;
}
"""
    fault = fault_of(source, (1,), (64,), (np.zeros(64, np.float32), i32(40)))
    assert "deadlock: 40 threads wait at __syncthreads() on line 4, which threads 40-63 never " \
           "reach: they have returned" in str(fault)


def test_a_shuffle_waiting_for_a_lane_that_returned_is_a_fault():
    source = r"""
extern "C" __global__ void k(float* y) {
    if (threadIdx.x == 5) return;
    y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
"""
    fault = fault_of(source, (1,), (32,), (np.zeros(32, np.float32),))
    assert "waits at __shfl_xor_sync (mask 0xffffffff) for lane 5 (thread 5), which has " \
           "exited" in str(fault)


def test_shared_memory_starts_as_garbage_in_every_block():
    source = r"""
extern "C" __global__ void k(float* y) {
    __shared__ float s[32];
    if (blockIdx.x == 0) s[threadIdx.x] = 1.0f;
    __syncthreads();
    y[blockIdx.x * 32 + threadIdx.x] = s[threadIdx.x];
}
"""
    fault = fault_of(source, (2,), (32,), (np.zeros(64, np.float32),))
    assert fault.block == (1, 0, 0)
    assert "reads __shared__ s[0] before any thread of this block wrote it" in str(fault)


def test_two_blocks_writing_one_element_race():
    source = r"""
extern "C" __global__ void k(float* total, const float* x) {
    if (threadIdx.x == 0) total[0] = total[0] + x[blockIdx.x];
}
"""
    fault = fault_of(source, (2,), (32,), (np.zeros(1, np.float32), np.ones(2, np.float32)))
    assert fault.block == (1, 0, 0)
    assert "reads total[0], which block 0 wrote in this launch" in str(fault)
    assert "a race between blocks" in str(fault)


def test_an_array_of_another_type_is_a_fault_where_it_is_touched():
    """A placeholder the kernel never touches is fine, as on a device; a touched one is not."""
    source = r"""
extern "C" __global__ void k(float* y, bool* keep, int drop) {
    if (drop) keep[threadIdx.x] = true;
    y[threadIdx.x] = 1.0f;
}
"""
    y = np.zeros(8, np.float32)
    kernel(source)((1,), (8,), (y, y, i32(0)))
    assert (y == 1).all()
    fault = fault_of(source, (1,), (8,), (y, y, i32(1)))
    assert "writes keep[0]: the argument is a float32 array and the parameter a bool*" in str(fault)


def test_an_index_outside_a_dimension_of_a_shared_array():
    source = r"""
extern "C" __global__ void k(float* y) {
    __shared__ float t[4][8];
    t[threadIdx.x / 8][threadIdx.x % 8 + 1] = 0.0f;
}
"""
    fault = fault_of(source, (1,), (32,), (np.zeros(1, np.float32),))
    assert fault.thread == (7, 0, 0)
    assert "indexes __shared__ t with 8, outside a dimension of 8" in str(fault)


def test_a_result_that_depends_on_the_order_of_threads_is_caught():
    """Two parameters over one buffer: each thread reads its neighbour's element, which that
    neighbour writes. The race checks see two arrays; the orders see different results."""
    source = r"""
extern "C" __global__ void k(const float* x, float* y, int n) {
    int i = threadIdx.x;
    float v = i + 1 < n ? x[i + 1] : 0.0f;
    y[i] = v + 1.0f;
}
"""
    buffer = np.zeros(64, np.float32)
    with pytest.raises(cudahost.KernelFault, match="depend on the order its threads run in"):
        cudahost.checked_launch(kernel(source), (1,), (64,), (buffer, buffer, i32(64)),
                                seeds=(0, 5))
    x, y = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    errors = cudahost.checked_launch(
        kernel(source), (1,), (64,), (x, y, i32(64)), seeds=(0, 5),
        reference=lambda x, y, n: y.__setitem__(slice(None), np.append(x[1:], 0) + 1.0))
    assert errors == {"x": 0.0, "y": 0.0}


# ---- what is refused, by name ---------------------------------------------------------------------

ADD = r"""extern "C" __global__ void k(float* y, int n, float a) { if ((int)threadIdx.x < n) y[threadIdx.x] += a; }"""


def test_arguments_are_checked_as_cupy_passes_them():
    y = np.zeros(4, np.float32)
    k = kernel(ADD)
    k((1,), (4,), (y, i32(4), f32(2)))
    assert (y == 2).all()
    with pytest.raises(TypeError, match=r"argument 1 \(n, int\): pass numpy.int32\(...\), got int"):
        k((1,), (4,), (y, 4, f32(2)))
    with pytest.raises(TypeError, match=r"argument 2 \(a, float\): pass numpy.float32\(...\), "
                                        r"got float64"):
        k((1,), (4,), (y, i32(4), np.float64(2)))
    with pytest.raises(ValueError, match="C-contiguous"):
        k((1,), (4,), (np.zeros(8, np.float32)[::2], i32(4), f32(2)))
    with pytest.raises(TypeError, match=r"takes 3 arguments \(y, n, a\), got 2"):
        k((1,), (4,), (y, i32(4)))
    with pytest.raises(ValueError, match="at most 1024 threads"):
        k((1,), (1025,), (y, i32(4), f32(2)))
    with pytest.raises(cudahost.Unsupported, match="dynamic shared memory"):
        k((1,), (4,), (y, i32(4), f32(2)), shared_mem=128)


@pytest.mark.parametrize("line, named", [
    ('asm("{add.f32 %0, %1, %2;}" : "=f"(a) : "f"(a), "f"(a));', "inline PTX `add.f32 %0, %1, %2;`"),
    ("extern __shared__ float dynamic[];", "dynamic shared memory"),
    ("__threadfence();", "__threadfence is not modelled"),
    ("atomicInc((unsigned int*)0, 1u);", "atomicInc is not modelled"),
    ("__activemask();", "__activemask is not modelled"),
    ("long long t = clock64();", "clock64 is not modelled"),
])
def test_what_the_model_lacks_is_refused_by_name(line, named):
    source = f'extern "C" __global__ void k(float* y, float a) {{\n    {line}\n}}\n'
    with pytest.raises(cudahost.Unsupported) as refused:
        kernel(source)((1,), (1,), (np.zeros(1, np.float32), f32(1)))
    assert str(refused.value).startswith("line 2: ") and named in str(refused.value)


def test_a_compile_error_names_the_kernels_line():
    source = 'extern "C" __global__ void k(float* y) {\n    y[0] = undeclared;\n}\n'
    with pytest.raises(cudahost.BuildError, match=r"kernel.cu:2:.*undeclared"):
        kernel(source)((1,), (1,), (np.zeros(1, np.float32),))
    source = 'extern "C" __global__ void k(float* y) {\n    auto v = y[0];\n    y[1] = v;\n}\n'
    with pytest.raises(cudahost.BuildError, match=r"give it its type, `float v = x\[i\]`"):
        kernel(source)((1,), (1,), (np.zeros(2, np.float32),))


# ---- the compiler -------------------------------------------------------------------------------

def test_the_compiler_is_the_one_named_else_the_machines(monkeypatch):
    monkeypatch.setenv("MINITFM_CXX", "my-c++ --flag")
    assert cxx.compiler() == ["my-c++", "--flag"]
    monkeypatch.delenv("MINITFM_CXX")
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(cxx.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "ziglang", None)          # not installed
    with pytest.raises(cudahost.BuildError, match=r"no C\+\+ compiler .*pip install ziglang"):
        cxx.compiler()


def test_a_compiled_kernel_is_kept_and_found_again(tmp_path):
    """A second process loads the library the first compiled: it names the same file. The cache
    holds it and the runtime library it is linked to, found beside it."""
    script = ("from minitfm import cudahost; import numpy as np; "
              f"k = cudahost.HostKernel({ADD!r}, 'k'); y = np.zeros(4, np.float32); "
              "k((1,), (4,), (y, np.int32(4), np.float32(1))); assert (y == 1).all(); "
              "print(k.library.path)")
    env = dict(os.environ, MINITFM_CACHE=str(tmp_path))
    paths = [forkserver.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, check=True).stdout.strip() for _ in range(2)]
    assert paths[0] == paths[1] and paths[0].startswith(str(tmp_path))
    libraries = sorted(p.name for p in (tmp_path / "cudahost").glob("*.so"))
    assert len(libraries) == 2 and libraries[1].startswith("runtime-")
    assert Path(paths[0]).name == libraries[0]


@pytest.mark.slow
def test_the_ziglang_compiler_runs_the_kernels(tmp_path):
    """Where a machine has no C++ compiler, the one the test extra installs (ziglang's clang)
    compiles and runs every fused kernel: the whole kernel check, on the host."""
    env = dict(os.environ, MINITFM_CACHE=str(tmp_path),
               MINITFM_CXX=f"{sys.executable} -m ziglang c++")
    done = forkserver.run([sys.executable, "-m", "minitfm.kernelcheck", "--host"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ziglang c++" in done.stdout and "0 failed" in done.stdout


@pytest.mark.slow
def test_the_portable_fibers_run_the_kernels(tmp_path):
    """The fibers of systems other than x86-64 and AArch64 Linux (ucontext), forced here with
    -DMINITFM_UCONTEXT: the whole kernel check on the host."""
    env = dict(os.environ, MINITFM_CACHE=str(tmp_path),
               MINITFM_CXX=" ".join(cxx.compiler()) + " -DMINITFM_UCONTEXT")
    done = forkserver.run([sys.executable, "-m", "minitfm.kernelcheck", "--host"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "-DMINITFM_UCONTEXT" in done.stdout and "0 failed" in done.stdout
