"""The fast paths of the residual connection (``minitfm/layers/residual.py``), chosen per call by
:mod:`minitfm.speed.policy`; the plain functions are their twins.

Fused (``--kernels fused``, on CuPy): the sub-layer's last bias (where the caller left it to the
residual connection: ``speed/encoder.py``), the dropout and the residual add are one kernel over
F'(.) (its Philox mask drawn inside, as ``speed/dropout.py``'s kernel draws it); its twin is
``residual.add_dropped``. The backward pass's dropout is ``speed/dropout.py``'s fused kernel; b's
gradient is the sub-layer's (its linear layer's row sum).

Row passes (on NumPy, ``--kernels fused``, the default there: :mod:`minitfm.speed.rows`): the
bias, the dropout (its mask drawn whole, as the plain code draws it) and the add run on blocks of
rows on the worker's threads, and post-LN's LayerNorm on each block right after, while it is in
cache; backward, the LayerNorm's and the dropout's passes share their blocks too. Bit for bit the
plain code, but for the LayerNorm's dgamma and dbeta (sums over the rows: ``speed/layernorm.py``);
where Numba is installed, the add is one compiled loop a block (``add_dropped_loop``, beside
LayerNorm's and the dropout's), equal to the plain code up to float32 rounding (a multiply and an
add may be one fused instruction).
"""

from __future__ import annotations

from minitfm import backend
from minitfm.backend import philox
from minitfm.layers import dropout, layernorm, residual
from minitfm.speed import compiled, fused, policy, rows
from minitfm.speed import dropout as fast_dropout
from minitfm.speed import layernorm as fast_layernorm


# ---- the fast paths' choice -------------------------------------------------------------------

@policy.fast_path(residual.add_dropped)
def choose_add_dropped(x, f, p_drop, rng, bias=None):
    """Bias, dropout and add: one fused kernel on CuPy, a row pass or compiled loop on NumPy
    (--kernels fused)."""
    drop = rng is not None and p_drop > 0.0
    if fused.active(x, f) and (bias is not None or drop) and (
            not drop or isinstance(rng, philox.Philox)):
        return fused_add_dropped
    return rows_add_dropped if _rows_apply(x, f) else None


@policy.fast_path(residual.forward)
def choose_forward(x, sublayer, ln, p_drop, rng, pre_ln, bias=None):
    """Post-LN: the add and the LayerNorm on the same blocks of rows, on NumPy (--kernels fused)."""
    # post-LN's add and LayerNorm on the same blocks: chosen on x, as the sub-layer's output
    # is not made yet (the pass then asks _rows_apply of both)
    return None if pre_ln or not (rows.active(x) or rows.compiled(x)) else rows_forward


@policy.fast_path(residual.backward)
def choose_backward(dy, cache: residual.Cache, sublayer_backward, out=None):
    """Post-LN: the LayerNorm's and the dropout's backward on the same blocks of rows, on NumPy
    (--kernels fused)."""
    if cache.pre_ln or not (rows.active(dy) or rows.compiled(dy)):
        return None
    return rows_backward if cache.ln.xhat.dtype == dy.dtype else None


# ---- fused: bias + dropout + residual add ------------------------------------------------------

SOURCE = philox.DEVICE + r"""
// f = x + dropout(f + b), in place over f (N, d), 8 elements a thread (a block of Philox)
extern "C" __global__ void bias_dropout_residual(float* f, const float* x, const float* b,
        bool* keep, long long n, int d, int has_bias, int drop, unsigned int threshold,
        float scale, unsigned int k0, unsigned int k1, unsigned long long first) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x, i = t * 8;
    if (i >= n) return;
    unsigned int u[8];
    if (drop) philox_draws16(first + t, k0, k1, u);
    for (int j = 0; j < 8 && i + j < n; ++j) {
        float v = has_bias ? f[i + j] + b[(i + j) % d] : f[i + j];
        if (drop) {
            bool kept = u[j] >= threshold;
            keep[i + j] = kept;
            v = kept ? v * scale : 0.0f;
        }
        f[i + j] = v + x[i + j];
    }
}
"""


def _twin(f, x, b, keep, n, d, has_bias, drop, threshold, scale, k0, k1, first):
    if has_bias:
        f += b
    if drop:
        fast_dropout.dropped_twin(f, f, keep, threshold, scale, k0, k1, first)
    f += x


KERNEL = fused.Kernel("bias_dropout_residual", SOURCE, _twin)


def fused_add_dropped(x, f, p_drop, rng, bias=None):
    xp = backend.xp
    x, f = xp.ascontiguousarray(x), xp.ascontiguousarray(f)
    drop = rng is not None and p_drop > 0.0
    keep, args, cache = fast_dropout.kernel_mask(rng, f, p_drop if drop else 0.0)
    KERNEL(fused.grid_for(f.size, philox.KEEP_PER_BLOCK),
           (f, x, f if bias is None else bias, keep, fused.i64(f.size), fused.i32(f.shape[-1]),
            fused.i32(bias is not None), fused.i32(cache is not None), *args))
    return f, cache


# ---- row passes (CPU) -------------------------------------------------------------------------

def _rows_apply(x, f) -> bool:
    """Whether the row passes take ``x + Dropout(f + b)``: chosen, and f's rows lie in order
    (the sub-layer's product), so that a block of rows is a view of f."""
    return ((rows.active(f) or rows.compiled(x, f)) and x.dtype == f.dtype
            and f.flags.c_contiguous and x.shape == f.shape)


def _rows_adder(x, f, p_drop, rng, bias):
    """``(add, dropout cache)``: the mask drawn whole from ``rng`` (the plain code's draw),
    ``add(rows)`` then computing ``add_dropped``'s lines on those rows of f, in place."""
    d = f.shape[-1]
    loop = rows.compiled(x, f, *(() if bias is None else (bias,)))
    x2, f2 = x.reshape(-1, d), f.reshape(-1, d)                     # (N, d)
    c_drop = None
    if rng is not None and p_drop > 0.0:
        keep, scale = dropout.keep_mask(rng, f.shape, p_drop)
        c_drop, keep2 = dropout.Cache(keep, scale), keep.reshape(-1, d)
    if loop:                            # the loop's arguments; no bias, no mask: stand-ins
        xp = backend.xp
        x2 = xp.ascontiguousarray(x2)
        b = xp.zeros(d, f.dtype) if bias is None else xp.ascontiguousarray(bias)
        no_mask = xp.ones((1, 1), bool)
        scale32 = compiled.float32(1.0 if c_drop is None else c_drop.scale)

    def add(part):
        if loop:
            add_dropped_loop(x2[part], f2[part], b, no_mask if c_drop is None else keep2[part],
                             scale32, bias is not None, c_drop is not None)
            return
        block = f2[part]
        if bias is not None:
            block += bias
        if c_drop is not None:
            dropout.apply(block, keep2[part], c_drop.scale, out=block)
        block += x2[part]

    return add, c_drop


def rows_add_dropped(x, f, p_drop, rng, bias=None):
    """``add_dropped`` on blocks of rows of f, in place."""
    add, c_drop = _rows_adder(x, f, p_drop, rng, bias)
    rows.map_rows(add, f.size // f.shape[-1], 3 * f.shape[-1] * f.itemsize)
    return f, c_drop


def rows_forward(x, sublayer, ln, p_drop, rng, pre_ln, bias=None):
    """Post-LN's ``forward`` with ``LN(x + Dropout(f + b))``, the add and the LayerNorm, on the
    same blocks (where f's rows allow it: ``_rows_apply``; else the plain lines)."""
    f, c_sub = sublayer(x)
    if _rows_apply(x, f):
        add, c_drop = _rows_adder(x, f, p_drop, rng, bias)
        y, c_ln = fast_layernorm.rows_forward(f, ln, before=add)
    else:
        f, c_drop = residual.add_dropped(x, f, p_drop, rng, bias)
        y, c_ln = layernorm.forward(f, ln)
    return y, residual.Cache(c_ln, c_sub, c_drop, False)


def rows_backward(dy, cache: residual.Cache, sublayer_backward, out=None):
    """Post-LN's ``backward`` with ``ds = LN'(dy)`` and ``df = Dropout'(ds)`` on the same
    blocks."""
    c_drop = cache.dropout
    if c_drop is None:
        ds, g_ln = fast_layernorm.rows_backward(dy, cache.ln, out)
        df = ds
    else:
        d = dy.shape[-1]
        keep2 = c_drop.keep.reshape(-1, d)
        df = backend.xp.empty(dy.shape, dtype=dy.dtype)
        df2 = df.reshape(-1, d)
        loop = rows.compiled(dy)
        scale32 = compiled.float32(c_drop.scale)

        def drop(part, ds):              # dropout.backward on these rows
            if loop:
                fast_dropout.apply_loop(ds, keep2[part], scale32, df2[part])
            else:
                dropout.apply(ds, keep2[part], c_drop.scale, out=df2[part])

        ds, g_ln = fast_layernorm.rows_backward(dy, cache.ln, out, after=drop)
    dx, *rest = sublayer_backward(df, cache.sublayer)
    dx += ds                                        # the identity path
    return (dx, *rest, g_ln)


@compiled.kernel
def add_dropped_loop(x, f, bias, keep, scale, has_bias, drop):
    """``add_dropped`` on rows (n, d) as a compiled loop: f = x + Dropout(f + bias), in place;
    ``has_bias``, ``drop``: whether bias (d,) and keep (n, d), with its scale, apply."""
    n, d = f.shape
    for r in range(n):
        for c in range(d):
            v = f[r, c]
            if has_bias:
                v = v + bias[c]
            if drop:
                v = v * compiled.float32(keep[r, c]) * scale
            f[r, c] = v + x[r, c]
