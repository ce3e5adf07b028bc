"""The fast paths of attention's softmax (``minitfm/layers/softmax.py``), chosen per call by
:mod:`minitfm.speed.policy`; the plain functions are their twins.

Fused (``--kernels fused``): on CuPy one kernel each way, a block of threads per row. On NumPy,
where Numba is installed (:mod:`minitfm.speed.compiled`, chosen by the row passes:
:func:`minitfm.speed.rows.compiled`), the forward is a compiled loop for the scale, mask, max and
shift, NumPy's exp (vectorised, where Numba's is scalar code), and a second loop for the sum and
the division; the backward is one loop. A row's sums are taken in another order than NumPy's, so
they equal the plain code up to float32 rounding (the tolerance its test states).
"""

from __future__ import annotations

from minitfm import backend
from minitfm.layers import softmax
from minitfm.speed import compiled, fused, policy, rows


# ---- the fast paths' choice -------------------------------------------------------------------

def _fast_pass(fused_pass, loops_pass, s, *others):
    """The fast pass for scores s (and ``others``, the mask or P; None: no array): the CUDA
    kernel, the compiled loops (4-D arrays), or None, the plain lines. A row pass asks before it
    splits the work (``policy.path``): on its blocks the layers run their plain code."""
    arrays = (s, *(a for a in others if a is not None))
    if s.ndim != 4:
        return None
    if fused.active(*arrays):
        return fused_pass
    if rows.compiled(*arrays) and all(a.ndim == 4 for a in arrays):
        return loops_pass
    return None


@policy.fast_path(softmax.forward)
def choose_forward(s, scale, mask=None):
    """One fused kernel on CuPy; compiled loops on NumPy (--kernels fused), 4-D scores."""
    return _fast_pass(fused_forward, loops_forward, s, mask)


@policy.fast_path(softmax.backward)
def choose_backward(dp, p, scale):
    """One fused kernel on CuPy; a compiled loop on NumPy (--kernels fused), 4-D scores."""
    return _fast_pass(fused_backward, loops_backward, dp, p)


# ---- compiled loops (CPU, Numba: minitfm.speed.compiled) -----------------------------------------

def loops_forward(s, scale, mask=None):
    """``forward`` by the loops below and NumPy's exp, on 4-D float32 scores."""
    xp, f32 = backend.xp, compiled.float32
    # no mask: s stands in, never read
    m = s if mask is None else xp.broadcast_to(mask, s.shape)
    shift_loop(s, m, mask is not None, f32(scale))
    xp.exp(s, out=s)
    normalize_loop(s)
    return s


def loops_backward(dp, p, scale):
    """``backward`` by the loop below, on 4-D float32 arrays."""
    backward_loop(dp, p, compiled.float32(scale))
    return dp


@compiled.kernel
def shift_loop(s, mask, has_mask, scale):
    """z = s * scale + mask, then z - max z, a row at a time, in place on s (B, H, T, S)."""
    nb, nh, nt, ns = s.shape
    for b in range(nb):
        for h in range(nh):
            for t in range(nt):
                top = compiled.float32(-compiled.inf)
                for j in range(ns):
                    z = s[b, h, t, j] * scale
                    if has_mask:
                        z = z + mask[b, h, t, j]
                    s[b, h, t, j] = z
                    top = max(top, z)
                for j in range(ns):
                    s[b, h, t, j] = s[b, h, t, j] - top


@compiled.kernel
def normalize_loop(e):
    """P = e / rowsum(e), in place on e (B, H, T, S)."""
    nb, nh, nt, ns = e.shape
    for b in range(nb):
        for h in range(nh):
            for t in range(nt):
                total = compiled.float32(0.0)
                for j in range(ns):
                    total += e[b, h, t, j]
                for j in range(ns):
                    e[b, h, t, j] = e[b, h, t, j] / total


@compiled.kernel
def backward_loop(dp, p, scale):
    """dS = P * (dP - rowsum(dP * P)) * scale, a row at a time, in place on dP (B, H, T, S)."""
    nb, nh, nt, ns = dp.shape
    for b in range(nb):
        for h in range(nh):
            for t in range(nt):
                dot = compiled.float32(0.0)
                for j in range(ns):
                    dot += dp[b, h, t, j] * p[b, h, t, j]
                for j in range(ns):
                    dp[b, h, t, j] = (dp[b, h, t, j] - dot) * p[b, h, t, j] * scale


# ---- fused: one CUDA kernel each way ---------------------------------------------------------

FORWARD_SOURCE = fused.BLOCK_REDUCE + r"""
// scores s (rows of `cols`; row r = (b, h, t) of (B, H, T)) -> softmax(s * scale + mask), in
// place; the mask element of (b, h, t, j) is mask[b*mb + h*mh + t*mt + j*mj] (0 strides where
// it broadcasts), no mask when has_mask is 0
extern "C" __global__ void softmax_forward(float* s, const float* mask, int cols, int heads,
        int steps, long long mb, long long mh, long long mt, long long mj, int has_mask,
        float scale) {
    __shared__ float scratch[32];
    long long r = blockIdx.x, row = r * cols;
    long long m0 = (r / ((long long)heads * steps)) * mb + ((r / steps) % heads) * mh
                   + (r % steps) * mt;
    float top = __int_as_float(0xff800000);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = s[row + j] * scale;
        if (has_mask) v = v + mask[m0 + j * mj];
        s[row + j] = v;
        top = fmaxf(top, v);
    }
    top = block_max(top, scratch);
    float total = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float e = expf(s[row + j] - top);
        s[row + j] = e;
        total += e;
    }
    total = block_sum(total, scratch);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s[row + j] = s[row + j] / total;
}
"""


def _forward_twin(s, mask, cols, heads, steps, mb, mh, mt, mj, has_mask, scale):
    # the mask broadcasts as its strides
    softmax.forward(s, float(scale), mask if has_mask else None)


FORWARD = fused.Kernel("softmax_forward", FORWARD_SOURCE, _forward_twin)


def fused_forward(s, scale, mask=None):
    """``forward`` as one kernel launch, on 4-D scores (B, H, T, S)."""
    xp, (b, h, t, cols) = backend.xp, s.shape
    strides = (0, 0, 0, 0)              # no mask (has_mask 0): s stands in, never read
    if mask is not None:
        mask = xp.ascontiguousarray(mask)
        strides = tuple(st // mask.dtype.itemsize for st in xp.broadcast_to(mask, s.shape).strides)
    FORWARD((b * h * t,), (s, s if mask is None else mask, fused.i32(cols), fused.i32(h),
                           fused.i32(t), *map(fused.i64, strides), fused.i32(mask is not None),
                           fused.f32(scale)))
    return s


BACKWARD_SOURCE = fused.BLOCK_REDUCE + r"""
// dS = P * (dP - rowsum(dP * P)) * scale, in place over dP, a block per row
extern "C" __global__ void softmax_backward(float* dp, const float* p, int cols, float scale) {
    __shared__ float scratch[32];
    long long row = (long long)blockIdx.x * cols;
    float dot = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) dot += dp[row + j] * p[row + j];
    dot = block_sum(dot, scratch);
    for (int j = threadIdx.x; j < cols; j += blockDim.x)
        dp[row + j] = (dp[row + j] - dot) * p[row + j] * scale;
}
"""


def _backward_twin(dp, p, cols, scale):
    softmax.backward(dp, p, float(scale))


BACKWARD = fused.Kernel("softmax_backward", BACKWARD_SOURCE, _backward_twin)


def fused_backward(dp, p, scale):
    """``backward`` as one kernel launch."""
    BACKWARD((p.size // p.shape[-1],), (dp, p, fused.i32(p.shape[-1]), fused.f32(scale)))
    return dp
