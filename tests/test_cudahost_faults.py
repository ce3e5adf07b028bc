"""The host execution's faults where a learner's line matters most (minitfm.cudahost): a loop
that never ends, stopped at its time limit and named; a race on a ``__shared__`` scalar named at
its line, as one on an array is; a fault inside a function the kernel calls (a barrier in
``block_sum`` that a branch keeps some threads from) named at the kernel's line that called it;
what would crash a process (a failing ``assert``, ``__trap()``, a stack that overflows, a wild
pointer, an integer division by zero) stopping the launch as a fault of its thread, the library
able to launch again, the process's signal handlers as they were; an ``#include`` of a file the
host execution does not read refused before anything is compiled.

The kernels that never end run in a process of their own, under a limit of its own: without
the time limit they would hang the suite, not fail it.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import re
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from minitfm import cudahost
from minitfm.speed import fused
from minitfm.speed import softmax as fast_softmax
from minitfm.cudahost import rewrite
from minitfm.layers import softmax
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
i32, f32 = np.int32, np.float32


def line_of(source: str, text: str, nth: int = 0) -> int:
    """The line of ``source`` holding ``text`` (the ``nth`` such line, from 0)."""
    return [i for i, line in enumerate(source.splitlines(), 1) if text in line][nth]


def fault_of(source: str, grid, block, args, name: str = "k", **launch) -> cudahost.KernelFault:
    with pytest.raises(cudahost.KernelFault) as caught:
        cudahost.checked_launch(cudahost.HostKernel(source, name), grid, block, args, **launch)
    return caught.value


# ---- a loop that never ends ----------------------------------------------------------------------

# name -> (source, grid, block): each kernel takes (float* y, int n), y one element a thread
NEVER_ENDING = {
    "while (true) in one thread": (r"""
extern "C" __global__ void k(float* y, int n) {
    if (blockIdx.x == 1 && threadIdx.x == 5) {
        while (true) {}
    }
    y[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}
""", (2,), (32,)),
    "a for whose step goes the wrong way": (r"""
extern "C" __global__ void k(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int j = threadIdx.x; j < n; j--)
        y[i] += 1.0f;
}
""", (2,), (32,)),
    "a do-while whose condition stays true": (r"""
extern "C" __global__ void k(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, k = 0;
    if (i == 3) do {
        k += 0;
    } while (k < n);
    y[i] = 1.0f;
}
""", (1,), (32,)),
    "a loop of barriers around a loop that ends": (r"""
extern "C" __global__ void k(float* y, int n) {
    __shared__ float t[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i -= blockDim.x) {
        for (int j = 0; j < 4; ++j) s += 1.0f;
        t[threadIdx.x] = s;
        __syncthreads();
    }
    y[threadIdx.x] = s;
}
""", (1,), (32,)),
    "a loop in a function the kernel calls": (r"""
__device__ void wait_for(int n) {
    for (int k = 0; k < n; k *= 2) {}
}
extern "C" __global__ void k(float* y, int n) {
    if (threadIdx.x == 7) wait_for(n);
    y[threadIdx.x] = 1.0f;
}
""", (1,), (32,)),
}

CHILD = """
import json, time
import numpy as np
from minitfm import cudahost
from minitfm.speed import softmax as fast_softmax
from tests.test_cudahost_faults import NEVER_ENDING
found = {}
for name, (source, grid, block) in NEVER_ENDING.items():
    kernel = cudahost.HostKernel(source, "k")
    kernel.library                                  # compiled before the clock starts
    y = np.zeros(grid[0] * block[0], np.float32)
    started = time.monotonic()
    try:
        cudahost.checked_launch(kernel, grid, block, (y, np.int32(32)), time_limit=0.5)
        found[name] = None
    except cudahost.KernelFault as fault:
        found[name] = dict(what=fault.what, line=fault.line, block=fault.block,
                           thread=fault.thread, timed_out=fault.timed_out,
                           seconds=time.monotonic() - started)
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def stopped() -> dict:
    """Each kernel of NEVER_ENDING launched with a time limit of 0.5 s: its fault."""
    done = forkserver.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("case, line, block, thread", [
    ("while (true) in one thread", 4, (1, 0, 0), (5, 0, 0)),
    ("a for whose step goes the wrong way", 4, (0, 0, 0), (0, 0, 0)),
    ("a do-while whose condition stays true", 6, (0, 0, 0), (3, 0, 0)),
    ("a loop in a function the kernel calls", 6, (0, 0, 0), (7, 0, 0)),
])
def test_a_loop_that_never_ends_is_stopped_at_its_line(stopped, case, line, block, thread):
    fault = stopped[case]
    assert fault is not None, f"{case}: the launch ended"
    assert fault["timed_out"] is True and fault["seconds"] < 5, fault
    assert (fault["line"], tuple(fault["block"]), tuple(fault["thread"])) == (line, block, thread)
    assert re.fullmatch(r"has run \d+\.\d s without ending: the loop at line \d+( \(.*\))? is "
                        r"still going \(a loop whose condition never turns false\?\)",
                        fault["what"]), fault["what"]


def test_the_loop_named_is_the_one_that_never_ends(stopped):
    """The outer loop, which turns through barriers; the inner one ends each time."""
    fault = stopped["a loop of barriers around a loop that ends"]
    assert fault["timed_out"] and fault["line"] == 5, fault
    assert "the loop at line 5 is still going" in fault["what"]


def test_a_loop_in_a_called_function_is_named_at_the_call(stopped):
    fault = stopped["a loop in a function the kernel calls"]
    assert "the loop at line 3 (in wait_for, called at line 6) is still going" in fault["what"]


def test_the_time_limit_covers_all_the_launches_of_a_checked_launch():
    """Four launches, each well within the limit alone, together past it: the fourth is
    stopped (a limit of each launch alone would let all four end)."""
    source = r"""
extern "C" __global__ void k(float* y, int n) {
    float s = 0.0f;
    for (int j = 0; j < n; ++j) s += 1.0f;
    y[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""
    kernel = cudahost.HostKernel(source, "k")
    kernel.library                                  # compiled before the clock starts
    y = np.zeros(400 * 64, np.float32)
    started = time.monotonic()
    kernel((400,), (64,), (y, i32(2000)))
    one = time.monotonic() - started
    assert (y == 2000).all()
    with pytest.raises(cudahost.KernelFault) as caught:
        cudahost.checked_launch(kernel, (400,), (64,), (y, i32(2000)), seeds=(0, 1, 2, 3),
                                time_limit=2.5 * one)
    assert caught.value.timed_out and caught.value.what.startswith("has run "), caught.value


def test_other_faults_are_not_timed_out_and_a_limit_must_be_a_time():
    fault = fault_of(r"""extern "C" __global__ void k(float* y) { y[threadIdx.x + 1] = 0.0f; }""",
                     (1,), (4,), (np.zeros(4, f32),), time_limit=10)
    assert fault.timed_out is False and "outside its 4 elements" in fault.what
    kernel = cudahost.HostKernel(r"""extern "C" __global__ void k(float* y) { y[0] = 1.0f; }""",
                                 "k")
    for wrong in (0, -1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="time_limit must be a positive number of seconds"):
            kernel((1,), (1,), (np.zeros(1, f32),), time_limit=wrong)


def test_every_loop_condition_ticks_and_no_line_moves():
    source = """extern "C" __global__ void k(float* y, int n) {
    for (;;) { break; }
    for (int i = 0; i < min(n, (3)); ++i) y[i] = 0.0f;   // while (
    const char* s = "for (;;) while (";
    char c = ')';
    while (c != ')'
           && n > 0) { n--; }
    do { n++; } while (n < 2);
    for (int k = 0; k < n; ++k)
        while (int left = n - k) { break; }
}
"""
    text = rewrite.rewrite(source).text
    assert text.count("\n") == source.count("\n")
    lines = text.splitlines()
    assert "for (; minitfm::tick(2, true);) { break; }" in lines[1]
    assert "for (int i = 0;minitfm::tick(3, !!( i < min(n, (3)))); ++i)" in lines[2]
    assert '"for (;;) while ("' in lines[3] and "tick" not in lines[3] + lines[4]
    assert "while (minitfm::tick(6, !!(c != ')'" in lines[5]
    assert lines[6].endswith("&& n > 0))) { n--; }")
    assert "while (minitfm::tick(8, !!(n < 2)));" in lines[7]
    assert "minitfm::tick(9, !!( k < n))" in lines[8]
    assert "while (int left = n - k)" in lines[9]          # a declaration: left as it is
    for kernel in fused.KERNELS.values():
        plain = rewrite.blank_comments(kernel.source)
        host = rewrite.rewrite(kernel.source).text
        assert host.count("\n") == plain.count("\n"), kernel.name
        assert host.count("minitfm::tick(") == len(re.findall(r"\b(?:for|while)\s*\(", plain))


# ---- a race on a __shared__ scalar names its line ------------------------------------------------

RACES = {   # name -> the kernel's body, TOTAL the __shared__ variable; the line at fault
    "every thread writes it": ("TOTAL = x[threadIdx.x];\n    y[threadIdx.x] = 0.0f;", 4),
    "thread 0 writes it, the others read it": (
        "if (threadIdx.x == 0) TOTAL = x[0];\n    y[threadIdx.x] = TOTAL * 2.0f;", 5),
    "a compound assignment by every thread": (
        "if (threadIdx.x == 0) TOTAL = 0.0f;\n    __syncthreads();\n    TOTAL += x[threadIdx.x];",
        6),
    "read in a condition": (
        "if (threadIdx.x == 0) TOTAL = 1.0f;\n    if (TOTAL > 0.0f) y[threadIdx.x] = 1.0f;", 5),
}


@pytest.mark.parametrize("case", RACES)
def test_a_race_on_a_shared_scalar_is_named_as_one_on_an_array(case):
    body, line = RACES[case]
    faults = []
    for declared, used in (("total", "total"), ("total[1]", "total[0]")):
        source = (f'\nextern "C" __global__ void k(const float* x, float* y) {{\n'
                  f"    __shared__ float {declared};\n    {body.replace('TOTAL', used)}\n}}\n")
        x = np.arange(32, dtype=f32)
        faults.append(fault_of(source, (1,), (32,), (x, np.zeros(32, f32)), seeds=(0,)))
    scalar, array = faults
    assert scalar.line == array.line == line, (str(scalar), str(array))
    assert scalar.what == array.what and "__shared__ total[0]" in scalar.what
    assert (scalar.block, scalar.thread) == (array.block, array.thread)


def test_a_name_that_shadows_a_shared_scalar_is_refused():
    source = r"""
extern "C" __global__ void k(float* y) {
    __shared__ float total;
    if (threadIdx.x == 0) total = 1.0f;
    __syncthreads();
    { float total = 2.0f; y[threadIdx.x] = total; }
}
"""
    with pytest.raises(cudahost.Unsupported, match=r"line 6: `float total` declares a name the "
                                                   r"__shared__ variable total already has"):
        rewrite.rewrite(source)


# ---- a fault inside a function the kernel calls is named at the call -----------------------------

def test_a_barrier_in_a_branch_around_a_call_is_named_at_the_branch():
    """The softmax backward kernel with its block_sum called by the first warp alone: the
    barrier inside block_sum waits for threads that ended the kernel."""
    source = fast_softmax.BACKWARD_SOURCE.replace(
        "dot = block_sum(dot, scratch);", "if (threadIdx.x < 32) dot = block_sum(dot, scratch);")
    branch = line_of(source, "if (threadIdx.x < 32) dot = block_sum")
    barrier = line_of(source, "__syncthreads();")                # block_sum's first
    p = np.random.default_rng(0).random((4, 64)).astype(f32)
    fault = fault_of(source, (4,), (256,), (p.copy(), p, i32(64), f32(1)), "softmax_backward")
    assert fault.line == branch and fault.thread is None and fault.block == (0, 0, 0)
    assert fault.what == (
        f"deadlock: 32 threads wait at __syncthreads() on line {barrier} (in block_sum, called "
        f"at line {branch}), which threads 32-255 never reach: they have returned from the "
        f"kernel (a barrier inside a branch that not every thread of the block takes, or after "
        f"an early return?)")
    assert f"line {branch} of the kernel's source: if (threadIdx.x < 32) dot = " in str(fault)


def test_a_barrier_in_a_branch_of_the_kernel_is_named_at_the_barrier():
    source = r"""
extern "C" __global__ void k(float* y) {
    if (threadIdx.x < 32) {
        y[threadIdx.x] = 1.0f;
        __syncthreads();
    }
}
"""
    fault = fault_of(source, (1,), (64,), (np.zeros(64, f32),))
    assert fault.line == 5 and fault.what.startswith(
        "deadlock: 32 threads wait at __syncthreads() on line 5, which threads 32-63 never "
        "reach: they have returned from the kernel")


def test_two_barriers_of_one_call_are_named_at_the_call():
    source = fused.BLOCK_REDUCE.replace(
        "    if (lane == 0) scratch[warp] = v;\n    __syncthreads();\n",
        "    if (lane == 0) scratch[warp] = v;\n    if (warp == 0) __syncthreads();\n", 1) + r"""
extern "C" __global__ void k(const float* x, float* y) {
    __shared__ float scratch[32];
    float s = block_sum(x[threadIdx.x], scratch);
    if (threadIdx.x == 0) y[0] = s;
}
"""
    call = line_of(source, "float s = block_sum(")
    fault = fault_of(source, (1,), (64,), (np.ones(64, f32), np.zeros(1, f32)))
    assert fault.line == call
    assert ("threads 0-31 at __syncthreads() on line 7, threads 32-63 at __syncthreads() on line "
            f"13, both in block_sum, called at line {call} (a __syncthreads() in a branch") \
        in fault.what


def test_a_race_inside_a_called_function_is_named_at_the_call():
    """The caller left out the barrier the function needs before it reads every element."""
    source = r"""
__device__ float sum_of(const float* values, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; ++i) s += values[i];
    return s;
}
extern "C" __global__ void k(const float* x, float* y) {
    __shared__ float row[32];
    row[threadIdx.x] = x[threadIdx.x];
    y[threadIdx.x] = sum_of(row, 32);
}
"""
    fault = fault_of(source, (1,), (32,), (np.ones(32, f32), np.zeros(32, f32)), seeds=(0,))
    assert fault.line == 10 and fault.thread == (0, 0, 0)
    assert fault.what == (
        "reads __shared__ row[1] before any thread of this block wrote it: shared memory starts "
        "as garbage in every block (a barrier missing before the read?); at line 4 (in sum_of, "
        "called at line 10)")


def test_a_warp_operation_inside_a_called_function_is_named_at_the_call():
    source = r"""
__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
extern "C" __global__ void k(float* y) {
    if (threadIdx.x == 5) return;
    y[threadIdx.x] = warp_sum(1.0f);
}
"""
    fault = fault_of(source, (1,), (32,), (np.zeros(32, f32),))
    assert fault.line == 8
    assert fault.what.endswith("for lane 5 (thread 5), which has exited: it never arrives; at "
                               "line 3 (in warp_sum, called at line 8)"), fault.what


HELPERS = r"""
__device__ float scaled(const float* x, int i, float by);           // declared first
template <class T> __device__ __forceinline__ T twice(T v, int times = 2) { return v * times; }
static __device__ inline float pick(const float* x, int i) { return x[i]; }
__device__ float pick(const float* x, int i, int j) { return x[i] + x[j]; }
__device__ float outer(const float* x, int i) {
    return scaled(x, i, 1.0f);
}
struct Sum {
    float s;
    __device__ void add(float v) { s += v; }
};
extern "C" __global__ void k(const float* x, float* y, int n) {
    int i = threadIdx.x;
    Sum sum = {0.0f};
    sum.add(twice(pick(x, i)) + twice<float>(pick(x, i, 0), 1));
    y[i] = sum.s + outer(x, i + n);
}
__device__ float scaled(const float* x, int i, float by) {
    return x[i] * by;
}
"""


def test_functions_of_every_kind_take_their_calls_line():
    """A forward declaration, a template with a default argument, static and inline, an
    overload with one more int parameter, a member function, calls within calls: each runs as
    written, and a fault two calls deep is named at the kernel's line."""
    x, y = np.arange(8, dtype=f32), np.zeros(8, f32)
    kernel = cudahost.HostKernel(HELPERS, "k")
    kernel((1,), (8,), (x, y, i32(0)))
    assert np.array_equal(y, 2 * x + (x + x[0]) + x)
    with pytest.raises(cudahost.KernelFault) as caught:
        kernel((1,), (8,), (x, y, i32(1)))
    fault = caught.value
    assert fault.line == 17 and fault.thread == (7, 0, 0)
    assert fault.what == ("reads x[8], outside its 8 elements; at line 20 (in scaled, called at "
                          "line 7, in outer, called at line 17)")


# ---- what would crash a process: each a fault of its thread --------------------------------------

# kernels of one source (one compilation), each taking (float* y, int n): y one element a thread
CRASHING = r"""#include <assert.h>
__device__ float checked(float v) {
    assert(v >= 0.0f);
    return v;
}
__device__ int deep(int n) {
    volatile char pad[4096];
    pad[n & 4095] = (char)n;                  // a varying index: the whole pad is kept
    int below = n > 0 ? deep(n - 1) : 0;      // the frame's pad read after: no call in place
    return below + pad[n & 4095];
}
extern "C" __global__ void asserts(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    assert(i != n);
    y[i] = checked((float)(40 - i));
}
extern "C" __global__ void traps(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i == n) __trap();
    y[i] = 1.0f;
}
extern "C" __global__ void overflows(float* y, int n) {
    volatile float big[262144];
    big[threadIdx.x] = (float)n;
    y[blockIdx.x * blockDim.x + threadIdx.x] = big[threadIdx.x];
}
extern "C" __global__ void recurses(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = (float)deep(i == 5 ? n : 1);
}
extern "C" __global__ void wild(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i == n) *(volatile int*)0 = 1;
    y[i] = 2.0f;
}
extern "C" __global__ void wild_after_a_barrier(float* y, int n) {
    __shared__ float t[32];
    t[threadIdx.x] = 3.0f;
    __syncthreads();
    if (blockIdx.x * blockDim.x + threadIdx.x == n) *(volatile int*)8 = 1;
    y[blockIdx.x * blockDim.x + threadIdx.x] = t[threadIdx.x];
}
extern "C" __global__ void divides(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    volatile int zero = i == n ? 0 : 1;
    y[i] = (float)(n / zero);
}
"""


def crash(name: str, n: int, grid=(2,), block=(32,)) -> cudahost.KernelFault:
    """The fault of kernel ``name`` of CRASHING launched with ``n``."""
    return fault_of(CRASHING, grid, block, (np.zeros(grid[0] * block[0], f32), i32(n)), name,
                    seeds=(0,))


def test_a_failing_assert_stops_the_launch_at_its_line():
    fault = crash("asserts", 37)
    assert (fault.line, fault.block, fault.thread) == (14, (1, 0, 0), (5, 0, 0))
    assert fault.what == ("assertion `i != n` failed (on a device the launch ends with "
                          "cudaErrorAssert)")
    fault = crash("asserts", -1)            # inside a function: named at the kernel's call
    assert (fault.line, fault.block, fault.thread) == (15, (1, 0, 0), (9, 0, 0))
    assert fault.what.startswith("assertion `v >= 0.0f` failed") and fault.what.endswith(
        "; at line 3 (in checked, called at line 15)"), fault.what


def test_a_trap_stops_the_launch_at_its_line():
    fault = crash("traps", 40)
    assert (fault.line, fault.block, fault.thread) == (19, (1, 0, 0), (8, 0, 0))
    assert fault.what == "__trap() called: on a device the launch ends with an error"


@pytest.mark.parametrize("name, line, thread, calls", [
    ("overflows", 0, (0, 0, 0), ""),
    ("recurses", 29, (5, 0, 0), ", called at line 9, in deep, called at line 29)"),
], ids=["a local array of 1 MiB", "a recursion"])
def test_a_stack_that_overflows_is_a_fault_of_its_thread(name, line, thread, calls):
    fault = crash(name, 1000)
    assert (fault.line, fault.block, fault.thread) == (line, (0, 0, 0), thread)
    assert fault.what.startswith("the thread's stack overflowed: its local arrays (or a "
                                 "recursion) need more than 512 KiB; a device thread has at most "
                                 "512 KiB of local memory"), fault.what
    assert fault.what.endswith(calls)


@pytest.mark.parametrize("name, words", [
    ("wild", "a segmentation fault: it read or wrote memory at address 0x0, which is no array's"),
    ("wild_after_a_barrier", "a segmentation fault: it read or wrote memory at address 0x8"),
    ("divides", "an integer division (or remainder) by zero: its result is undefined"),
], ids=["a null pointer", "a null pointer, threads as fibers", "a division by zero"])
def test_a_hardware_fault_is_a_fault_of_its_thread_and_the_library_launches_again(name, words):
    fault = crash(name, 45)
    assert (fault.block, fault.thread) == ((1, 0, 0), (13, 0, 0)) and fault.what.startswith(
        words), fault.what
    y = np.zeros(64, f32)
    cudahost.HostKernel(CRASHING, name)((2,), (32,), (y, i32(-1)))   # no thread at fault
    assert np.all(y == {"wild": 2.0, "wild_after_a_barrier": 3.0, "divides": -1.0}[name])


def test_a_launch_sets_the_signal_handlers_back_as_they_were():
    """Python's faulthandler (or whatever handled SIGSEGV and its kind before) handles them
    again once a launch is over, on its own signal stack, whether the launch faulted or not."""
    libc = ctypes.CDLL(None, use_errno=True)

    def handlers() -> list[bytes]:
        """Each signal's handler and flags (struct sigaction: the handler first, the flags
        after a mask of 128 bytes), and the signal stack (its address, flags and size)."""
        found = []
        for signum in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL):
            action = ctypes.create_string_buffer(512)
            assert libc.sigaction(signum, None, action) == 0
            found.append(action.raw[:8] + action.raw[136:140])
        stack = ctypes.create_string_buffer(64)
        assert libc.sigaltstack(None, stack) == 0
        return found + [stack.raw[:24]]

    enabled = faulthandler.is_enabled()
    faulthandler.enable()
    try:
        before = handlers()
        assert before[0][:8] != bytes(8)                # faulthandler's, not the default
        crash("wild", 3)
        cudahost.HostKernel(CRASHING, "traps")((1,), (32,), (np.zeros(32, f32), i32(-1)))
        assert handlers() == before
    finally:
        if not enabled:
            faulthandler.disable()


@pytest.mark.parametrize("line, words", [
    ('#include "/dev/zero"', "`#include \"/dev/zero\"` includes the file /dev/zero, which the "
     "host execution does not read"),
    ("  #  include <cuda_fp16.h>", "`#  include <cuda_fp16.h>` includes the file cuda_fp16.h"),
    ("#include KERNEL_HELPERS", "`#include KERNEL_HELPERS` includes a file a macro names"),
])
def test_an_include_of_a_file_is_refused_before_anything_is_compiled(line, words):
    source = f'extern "C" __global__ void k(float* y) {{\n{line}\n    y[0] = 1.0f;\n}}\n'
    with pytest.raises(rewrite.Unsupported) as caught:
        rewrite.rewrite(source)
    message = str(caught.value)
    assert message.startswith(f"line 2: {words}"), message
    assert message.endswith("paste what you need from that file into this one"), message


def test_the_assert_and_standard_headers_are_blank_lines():
    source = ('#include <assert.h>\n#include <cassert>\n# include <cmath>\n#include <stdint.h>\n'
              'extern "C" __global__ void k(float* y) { y[0] = 1.0f; }\n')
    text = rewrite.rewrite(source).text
    assert all(not line.strip() for line in text.splitlines()[:4]), text
    assert text.count("\n") == source.count("\n") and "include" not in text
