"""The float16 products of the linear layer (``minitfm/layers/linear.py``) under ``--precision
fp16`` (:mod:`minitfm.speed.mixed`), chosen per call by :mod:`minitfm.speed.policy`.

The three products take float16 operands (x, W and dY cast, W from the update's float16 copy of
the parameters), sum in float32 and give float32 results (dW straight into the float32 gradient
buffer). The cache keeps the float16 x, half the memory of x. Fused (``--kernels fused``): dY's
float16 copy and db, its column sums, come from one kernel. On NumPy (``--kernels fused``, the
default there) the bias add and db stay the plain code, whole-array: each is one operation, one
sweep of memory already, which blocks of rows (:mod:`minitfm.speed.rows`) made slower, not
faster; the feed-forward's row pass adds its b1.
"""

from __future__ import annotations

from minitfm import backend
from minitfm.layers import linear
from minitfm.speed import fused, mixed, policy


# ---- mixed precision: the products in float16 --------------------------------------------------

@policy.fast_path(linear.forward)
def choose_forward(x, p, add_bias=True):
    """The float16 products (--precision fp16)."""
    return half_forward if mixed.enabled(x, p["w"]) else None


@policy.fast_path(linear.backward)
def choose_backward(dy, cache: linear.Cache, out=None):
    """The float16 products, where the forward pass kept a float16 x (--precision fp16)."""
    return half_backward if cache.x.dtype == mixed.HALF else None


def half_forward(x, p, add_bias=True):
    """``forward`` under mixed precision: x and W in float16, x kept so for the backward pass."""
    w, b = p["w"], p.get("b")
    d_in, d_out = w.shape
    x = mixed.half(x)
    y = mixed.matmul(x.reshape(-1, d_in), mixed.half_of(w)).reshape(*x.shape[:-1], d_out)
    if b is not None and add_bias:
        y += b
    return y, linear.Cache(x, w, b is not None)


def half_backward(dy, cache: linear.Cache, out=None):
    """``backward`` under mixed precision: the products of float16 dY, W and x; dY's float16
    copy and db one kernel (``--kernels fused``)."""
    d_in, d_out = cache.w.shape
    xp = backend.xp
    dy2 = dy.reshape(-1, d_out)                             # (N, d_out)
    grads = {}
    if cache.has_bias and fused.active(dy2):
        dy2 = xp.ascontiguousarray(dy2)
        dy16 = xp.empty(dy2.shape, dtype=mixed.HALF)
        grads["b"] = xp.empty(d_out, dtype=dy2.dtype) if out is None else out["b"]
        BIAS_HALF((-(-d_out // 32),), (dy2, grads["b"], dy16, fused.i64(dy2.shape[0]),
                                       fused.i32(d_out)))
    else:
        dy16 = mixed.half(dy2)
        if cache.has_bias:
            grads["b"] = dy2.sum(axis=0, out=None if out is None else out["b"])
    dx = mixed.matmul(dy16, mixed.half_of(cache.w).T)                         # (N, d_in)
    grads["w"] = mixed.matmul(cache.x.reshape(-1, d_in).T, dy16,              # (d_in, d_out)
                              out=None if out is None else out["w"])
    return dx.reshape(cache.x.shape), grads


BIAS_HALF_SOURCE = fused.HALF_CONVERSIONS + r"""
// db = sum_rows dy and dy16 = dy in float16, one pass over dy (N, d): a block per 32 columns,
// 8 rows at a time, the 8 partial sums of a column added in a fixed order
extern "C" __global__ void bias_grad_half(const float* dy, float* db, half_bits* dy16,
                                          long long rows, int d) {
    __shared__ float partial[8][33];
    int c = blockIdx.x * 32 + (threadIdx.x & 31), lane = threadIdx.x >> 5;
    float s = 0.0f;
    if (c < d) {
        for (long long r = lane; r < rows; r += 8) {
            float g = dy[r * d + c];
            dy16[r * d + c] = float_to_half(g);
            s += g;
        }
    }
    partial[lane][threadIdx.x & 31] = s;
    __syncthreads();
    if (lane == 0 && c < d) {
        for (int k = 1; k < 8; ++k) s += partial[k][threadIdx.x];
        db[c] = s;
    }
}
"""


def _bias_half_twin(dy, db, dy16, n_rows, d):
    dy16[...] = mixed.half(dy)
    dy.sum(axis=0, out=db)


BIAS_HALF = fused.Kernel("bias_grad_half", BIAS_HALF_SOURCE, _bias_half_twin)
