"""The host execution's faults where a learner's line matters most (minitfm.cudahost): a race on
a ``__shared__`` scalar named at its line, as one on an array is.
"""

from __future__ import annotations

import numpy as np
import pytest

from minitfm import cudahost
from minitfm.cudahost import rewrite

f32 = np.float32


def fault_of(source: str, grid, block, args, name: str = "k", **launch) -> cudahost.KernelFault:
    with pytest.raises(cudahost.KernelFault) as caught:
        cudahost.checked_launch(cudahost.HostKernel(source, name), grid, block, args, **launch)
    return caught.value


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
