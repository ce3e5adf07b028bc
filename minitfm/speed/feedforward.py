"""The fast paths of the position-wise feed-forward network (``minitfm/layers/feedforward.py``),
chosen per call by :mod:`minitfm.speed.policy`; the plain functions are their twins.

Fused (``--kernels fused``, on CuPy): b1, the ReLU and its dropout are one kernel over x W1 (the
dropout's Philox mask drawn inside, as ``speed/dropout.py``'s kernel draws it), and their
backward one kernel over da; the twins are the plain lines of ``forward`` and ``backward``.
Under mixed precision the forward kernel also writes its output in float16, for the second
product. On NumPy (``--kernels fused``, the default there) b1 + ReLU, and the ReLU's (and
dropout's) backward, run on blocks of rows on the worker's threads (:mod:`minitfm.speed.rows`),
bit for bit the plain code; the dropout's mask is still drawn over the whole array, from its
generator's one stream. Where Numba is installed, a block is one compiled loop
(``bias_relu_loop``, ``relu_dropout_backward_loop``), one pass over the block where the plain
lines make two or three: the same operations on each number, but for a multiply and an add that
may become one fused instruction.
"""

from __future__ import annotations

from minitfm import backend
from minitfm.backend import philox
from minitfm.layers import dropout, feedforward, linear
from minitfm.speed import compiled, fused, mixed, policy, rows
from minitfm.speed import dropout as fast_dropout


# ---- the fast paths' choice -------------------------------------------------------------------

@policy.fast_path(feedforward.forward)
def choose_forward(x, p, p_drop=0.0, rng=None, add_bias=True):
    """b1, ReLU and dropout: one fused kernel on CuPy, a row pass or compiled loop on NumPy
    (--kernels fused)."""
    if fused.active(x, p["w1"]) and (rng is None or isinstance(rng, philox.Philox)):
        return fused_forward
    if rows.active(x, p["w1"], p["b1"]) or rows.compiled(x, p["w1"], p["b1"]):
        return rows_forward
    return None


@policy.fast_path(feedforward.backward)
def choose_backward(dy, cache: feedforward.Cache, out=None):
    """The ReLU's and dropout's backward: one fused kernel on CuPy, a row pass or compiled loop on
    NumPy (--kernels fused)."""
    # the ReLU's backward runs on da = dy W2^T, of a's shape and dy's type, and on a
    if fused.active(dy, cache.a):
        return fused_backward
    if rows.chosen(dy) and (rows.active(cache.a, cache.a) or rows.compiled(cache.a)):
        return rows_backward
    return None


def _backward_through(relu_dropout_backward, dy, cache: feedforward.Cache, out):
    """``backward`` with ``relu_dropout_backward(da, cache) -> dh`` for its dropout and ReLU
    lines: the fast paths' backward."""
    out1 = None if out is None else {"w": out["w1"], "b": out["b1"]}
    out2 = None if out is None else {"w": out["w2"], "b": out["b2"]}
    da, g2 = linear.backward(dy, cache.second, out2)                   # (..., d_ff)
    dx, g1 = linear.backward(relu_dropout_backward(da, cache), cache.first, out1)
    return dx, {"w1": g1["w"], "b1": g1["b"], "w2": g2["w"], "b2": g2["b"]}


# ---- row passes (CPU) -----------------------------------------------------------------------

def rows_forward(x, p, p_drop=0.0, rng=None, add_bias=True):
    """``forward`` with b1 and the ReLU one pass over blocks of rows of x W1."""
    # b1 is the pass's to add; its gradient stays linear's row sum, as without the pass
    h, c_first = linear.forward(x, {"w": p["w1"], "b": p["b1"]}, add_bias=False)  # (..., d_ff)
    a = bias_relu_rows(h, p["b1"])                                     # in place over h
    # the mask is drawn over all of a at once: the generator's stream, as the plain code draws it
    a, c_drop = dropout.forward(a, p_drop, rng, inplace=True)
    y, c_second = linear.forward(a, {"w": p["w2"], "b": p["b2"]}, add_bias)   # (..., d_model)
    return y, feedforward.Cache(c_first, a, c_drop, c_second)


def rows_backward(dy, cache: feedforward.Cache, out=None):
    """``backward`` with the dropout's and the ReLU's lines one pass over blocks of rows of da
    (``relu_dropout_backward_rows``)."""
    return _backward_through(relu_dropout_backward_rows, dy, cache, out)


def bias_relu_rows(h, b):
    """``h += b; a = max(0, h)`` in place, on blocks of rows of h (..., d) on the threads
    (minitfm.speed.rows): a block is added to and clipped while it is in the core's cache, one sweep
    of memory where the plain lines make two. Returns a, the plain lines' bits (a copy of h only
    where h could not be viewed as rows)."""
    h2 = h.reshape(-1, h.shape[-1])                         # (N, d_ff)
    # the same maximum against a row of zeros: NumPy's loop for an array operand is a few times
    # faster than its loop for a scalar one, and gives the same bits
    zeros = backend.xp.zeros(h2.shape[1], dtype=h2.dtype)
    loop = rows.compiled(h2, b) and h2.flags.c_contiguous

    def bias_relu(block: slice) -> None:
        if loop:
            bias_relu_loop(h2[block], b)
            return
        hb = h2[block]
        hb += b
        backend.xp.maximum(hb, zeros, out=hb)

    rows.map_rows(bias_relu, h2.shape[0], h2.shape[1] * h2.itemsize)
    return h2.reshape(h.shape)


def relu_dropout_backward_rows(da, cache: feedforward.Cache):
    """``backward``'s dropout and ReLU lines on blocks of rows of da (..., d_ff) on the threads
    (minitfm.speed.rows): the dropout's ``da * keep * scale``, then ``* [a > 0]``, the same operations
    in the same order on each block, so the plain code's bits. Each block's [a > 0] is made and
    used while the block is in the core's cache. In place over da (linear.backward's new array,
    ours), where the plain dropout backward makes a new one."""
    d = da.shape[-1]
    da2, a2 = da.reshape(-1, d), cache.a.reshape(-1, d)    # (N, d_ff)
    keep = None if cache.dropout is None else cache.dropout.keep.reshape(-1, d)
    loop = rows.compiled(da2, a2) and da2.flags.c_contiguous
    if loop:                            # the loop's arguments; no mask: a stand-in
        no_mask = backend.xp.ones((1, 1), dtype=bool)
        scale = compiled.float32(1.0 if keep is None else cache.dropout.scale)

    def backward_block(block: slice) -> None:
        if loop:
            relu_dropout_backward_loop(da2[block], a2[block],
                                       no_mask if keep is None else keep[block], scale,
                                       keep is not None)
            return
        dab = da2[block]
        if keep is not None:                                # dropout.backward, in place
            dropout.apply(dab, keep[block], cache.dropout.scale, out=dab)
        dab *= a2[block] > 0

    # a row in every array the pass touches: da and a (float32), [a > 0] and keep (bool)
    row_bytes = d * (2 * da2.itemsize + 1 + (keep is not None))
    rows.map_rows(backward_block, da2.shape[0], row_bytes)
    return da2.reshape(da.shape)


@compiled.kernel
def bias_relu_loop(h, b):
    """``bias_relu_rows``' block as a compiled loop: h = max(0, h + b) in place over rows (n, d)
    (a NaN stays NaN, as with NumPy's maximum)."""
    n, d = h.shape
    zero = compiled.float32(0.0)
    for r in range(n):
        for c in range(d):
            v = h[r, c] + b[c]
            h[r, c] = zero if v < zero else v


@compiled.kernel
def relu_dropout_backward_loop(da, a, keep, scale, drop):
    """``relu_dropout_backward_rows``' block as a compiled loop, in place over da (n, d): the
    dropout's da * keep * scale (``drop``), then da * [a > 0]."""
    n, d = da.shape
    zero = compiled.float32(0.0)
    for r in range(n):
        for c in range(d):
            g = da[r, c]
            if drop:
                g = g * compiled.float32(keep[r, c]) * scale
            da[r, c] = g if a[r, c] > zero else g * zero


# ---- fused: b1 + ReLU + dropout, each way -----------------------------------------------------

FORWARD_SOURCE = philox.DEVICE + fused.HALF_CONVERSIONS + r"""
// a = dropout(max(0, h + b)) in place over h (N, d), 8 elements a thread (a block of Philox)
extern "C" __global__ void bias_relu_dropout(float* h, const float* b, bool* keep, long long n,
        int d, int drop, unsigned int threshold, float scale, unsigned int k0, unsigned int k1,
        unsigned long long first, half_bits* a16, int half_out) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x, i = t * 8;
    if (i >= n) return;
    unsigned int u[8];
    if (drop) philox_draws16(first + t, k0, k1, u);
    for (int j = 0; j < 8 && i + j < n; ++j) {
        float v = fmaxf(h[i + j] + b[(i + j) % d], 0.0f);
        if (drop) {
            bool kept = u[j] >= threshold;
            keep[i + j] = kept;
            v = kept ? v * scale : 0.0f;
        }
        h[i + j] = v;
        if (half_out) a16[i + j] = float_to_half(v);
    }
}
"""


def _forward_twin(h, b, keep, n, d, drop, threshold, scale, k0, k1, first, a16, half_out):
    h += b
    backend.xp.maximum(h, 0, out=h)
    if drop:
        fast_dropout.dropped_twin(h, h, keep, threshold, scale, k0, k1, first)
    if half_out:
        a16[...] = mixed.half(h)


FORWARD = fused.Kernel("bias_relu_dropout", FORWARD_SOURCE, _forward_twin)

BACKWARD_SOURCE = r"""
// dh = da * [a > 0] * scale, in place over da (a is 0 where the ReLU or the dropout zeroed it)
extern "C" __global__ void relu_dropout_backward(float* da, const float* a, float* dh,
                                                 long long n, float scale) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dh[i] = a[i] > 0.0f ? da[i] * scale : 0.0f;
}
"""


def _backward_twin(da, a, dh, n, scale):
    dh[...] = da * (a > 0)
    dh *= float(scale)


BACKWARD = fused.Kernel("relu_dropout_backward", BACKWARD_SOURCE, _backward_twin)


def fused_forward(x, p, p_drop=0.0, rng=None, add_bias=True):
    xp = backend.xp
    # b1 is the kernel's to add; its gradient stays linear's row sum, as without fusion
    h, c_first = linear.forward(x, {"w": p["w1"], "b": p["b1"]}, add_bias=False)  # (..., d_ff)
    keep, args, c_drop = fast_dropout.kernel_mask(rng, h, p_drop if rng is not None else 0.0)
    half_out = mixed.enabled(h)             # the second product reads a in float16
    a16 = xp.empty(h.shape, dtype=mixed.HALF) if half_out else h
    FORWARD(fused.grid_for(h.size, philox.KEEP_PER_BLOCK),
            (h, p["b1"], keep, fused.i64(h.size), fused.i32(h.shape[-1]),
             fused.i32(c_drop is not None), *args, a16, fused.i32(half_out)))
    if half_out:
        mixed.remember(h, a16)
    y, c_second = linear.forward(h, {"w": p["w2"], "b": p["b2"]}, add_bias)
    return y, feedforward.Cache(c_first, h, c_drop, c_second)


def fused_backward(dy, cache: feedforward.Cache, out=None):
    """``backward`` with the dropout's and the ReLU's lines one kernel, in place over da."""
    return _backward_through(_relu_dropout_kernel, dy, cache, out)


def _relu_dropout_kernel(da, cache: feedforward.Cache):
    """dh = da * [a > 0] (times the dropout's scale: a is 0 where it dropped), in place."""
    scale = 1.0 if cache.dropout is None else cache.dropout.scale
    BACKWARD(fused.grid_for(da.size), (da, cache.a, da, fused.i64(da.size), fused.f32(scale)))
    return da
