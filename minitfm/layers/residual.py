"""The residual connection around a sub-layer, with layer normalization (paper, section 3.1).

Post-LN, as in the paper ("LayerNorm(x + Sublayer(x))", with dropout on the sub-layer output):
    s = x + Dropout(F(x));         y = LN(s)
    backward: ds = LN'(dy);        dx = ds + F'(Dropout'(ds))

Pre-LN (optional; trains more stably in deep stacks, and needs a final LN after the stack):
    y = x + Dropout(F(LN(x)))
    backward: dx = dy + LN'(F'(Dropout'(dy)))

Backward, in both: the residual branch adds the identity's gradient to the sub-layer's; the "+"
of the forward pass becomes a fan-out of the gradient in the backward pass.

Parameters: those of the LayerNorm, "gamma" and "beta". The sub-layer F is an input, a function
``sublayer(h) -> (out, cache)`` holding its own parameters; the backward pass takes the matching
``sublayer_backward(dout, cache) -> (dh, *rest)`` and returns the sub-layer's ``rest`` (the
gradients of its other inputs, then of its parameters) where the gradient of the input F goes.
Dropout and "+= x" work in place on the sub-layer's output: see the in-place rule in
``minitfm/layers/__init__.py``.

The sub-layer may leave its last bias b to the residual connection (``bias``; the stacks do:
``attention.self_forward(..., add_bias=False)``), which computes x + Dropout(F'(x) + b), the same
numbers. Fused (``--kernels fused``, on CuPy): the bias, the dropout and the residual add are one
kernel over F'(.) (its Philox mask drawn inside, as dropout.py's kernel draws it); its twin is
``_add_dropped``. The backward pass's dropout is dropout.py's fused kernel; b's gradient is the
sub-layer's (its linear layer's row sum).

Row passes (on NumPy, ``--kernels fused``, the default there: :mod:`minitfm.rows`): the bias,
the dropout (its mask drawn whole, as the plain code draws it) and the add run on blocks of rows
on the worker's threads, and post-LN's LayerNorm on each block right after, while it is in
cache; backward, the LayerNorm's and the dropout's passes share their blocks too. Bit for bit
the plain code, but for the LayerNorm's dgamma and dbeta (sums over the rows: layernorm.py);
where Numba is installed, the add is one compiled loop a block (``add_dropped_rows``, beside
LayerNorm's and the dropout's), equal to the plain code up to float32 rounding (a multiply and
an add may be one fused instruction).
"""

from __future__ import annotations

from typing import NamedTuple

from minitfm import backend, compiled, fused, paths, philox, rows
from minitfm.layers import dropout, layernorm


class Cache(NamedTuple):
    ln: layernorm.Cache
    sublayer: object        # the sub-layer's own cache
    dropout: dropout.Cache | None
    pre_ln: bool


@paths.fast
def forward(x, sublayer, ln, p_drop, rng, pre_ln, bias=None):
    """``sublayer(h) -> (out, cache)``; ``ln`` has "gamma" and "beta"; ``bias``: the sub-layer's
    last bias, when it leaves it to the residual connection."""
    if pre_ln:
        h, c_ln = layernorm.forward(x, ln)
        f, c_sub = sublayer(h)
        f, c_drop = _add_dropped(x, f, p_drop, rng, bias)
        return f, Cache(c_ln, c_sub, c_drop, pre_ln)
    f, c_sub = sublayer(x)
    f, c_drop = _add_dropped(x, f, p_drop, rng, bias)
    y, c_ln = layernorm.forward(f, ln)
    return y, Cache(c_ln, c_sub, c_drop, pre_ln)


def step(x, sublayer_step, ln, pre_ln):
    """``forward`` at inference, for one decoding step: no dropout, no cache;
    ``sublayer_step(h) -> out``."""
    if pre_ln:
        f = sublayer_step(layernorm.forward(x, ln)[0])
        f += x
        return f
    f = sublayer_step(x)
    f += x
    return layernorm.forward(f, ln)[0]


@paths.fast
def backward(dy, cache: Cache, sublayer_backward, out=None):
    """Return ``(dx, *rest, {"gamma", "beta"})``; ``sublayer_backward(df, c) -> (dh, *rest)``.

    ``out``: the LayerNorm's gradient arrays (the sub-layer's go to ``sublayer_backward``)."""
    if cache.pre_ln:
        df, _ = dropout.backward(dy, cache.dropout)
        dh, *rest = sublayer_backward(df, cache.sublayer)
        dx, g_ln = layernorm.backward(dh, cache.ln, out)
        dx += dy                                    # the identity path
        return (dx, *rest, g_ln)
    ds, g_ln = layernorm.backward(dy, cache.ln, out)
    df, _ = dropout.backward(ds, cache.dropout)
    dx, *rest = sublayer_backward(df, cache.sublayer)
    dx += ds                                        # the identity path
    return (dx, *rest, g_ln)


@paths.fast
def _add_dropped(x, f, p_drop, rng, bias=None):
    """``x + Dropout(f + bias)``, in place on f (which is ours); ``(sum, dropout cache)``."""
    if bias is not None:
        f += bias
    f, c_drop = dropout.forward(f, p_drop, rng, inplace=True)
    f += x
    return f, c_drop


# ---- the fast paths' choice -------------------------------------------------------------------

@_add_dropped.chooser
def _add_dropped_path(x, f, p_drop, rng, bias=None):
    drop = rng is not None and p_drop > 0.0
    if fused.active(x, f) and (bias is not None or drop) and (
            not drop or isinstance(rng, philox.Philox)):
        return _fused_add_dropped
    return _rows_add_dropped if _rows_apply(x, f) else None


@forward.chooser
def _forward_path(x, sublayer, ln, p_drop, rng, pre_ln, bias=None):
    # post-LN's add and LayerNorm on the same blocks: chosen on x, as the sub-layer's output
    # is not made yet (the pass then asks _rows_apply of both)
    return None if pre_ln or not (rows.active(x) or rows.compiled(x)) else _rows_forward


@backward.chooser
def _backward_path(dy, cache: Cache, sublayer_backward, out=None):
    if cache.pre_ln or not (rows.active(dy) or rows.compiled(dy)):
        return None
    return _rows_backward if cache.ln.xhat.dtype == dy.dtype else None


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
        dropout.dropped_twin(f, f, keep, threshold, scale, k0, k1, first)
    f += x


KERNEL = fused.Kernel("bias_dropout_residual", SOURCE, _twin)


def _fused_add_dropped(x, f, p_drop, rng, bias=None):
    xp = backend.xp
    x, f = xp.ascontiguousarray(x), xp.ascontiguousarray(f)
    drop = rng is not None and p_drop > 0.0
    keep, args, cache = dropout.kernel_mask(rng, f, p_drop if drop else 0.0)
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
    ``add(rows)`` then computing ``_add_dropped``'s lines on those rows of f, in place."""
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
            add_dropped_rows(x2[part], f2[part], b, no_mask if c_drop is None else keep2[part],
                             scale32, bias is not None, c_drop is not None)
            return
        block = f2[part]
        if bias is not None:
            block += bias
        if c_drop is not None:
            dropout.apply(block, keep2[part], c_drop.scale, out=block)
        block += x2[part]

    return add, c_drop


def _rows_add_dropped(x, f, p_drop, rng, bias=None):
    """``_add_dropped`` on blocks of rows of f, in place."""
    add, c_drop = _rows_adder(x, f, p_drop, rng, bias)
    rows.map_rows(add, f.size // f.shape[-1], 3 * f.shape[-1] * f.itemsize)
    return f, c_drop


def _rows_forward(x, sublayer, ln, p_drop, rng, pre_ln, bias=None):
    """Post-LN's ``forward`` with ``LN(x + Dropout(f + b))``, the add and the LayerNorm, on the
    same blocks (where f's rows allow it: ``_rows_apply``; else the plain lines)."""
    f, c_sub = sublayer(x)
    if _rows_apply(x, f):
        add, c_drop = _rows_adder(x, f, p_drop, rng, bias)
        y, c_ln = layernorm.rows_forward(f, ln, before=add)
    else:
        f, c_drop = _add_dropped(x, f, p_drop, rng, bias)
        y, c_ln = layernorm.forward(f, ln)
    return y, Cache(c_ln, c_sub, c_drop, False)


def _rows_backward(dy, cache: Cache, sublayer_backward, out=None):
    """Post-LN's ``backward`` with ``ds = LN'(dy)`` and ``df = Dropout'(ds)`` on the same
    blocks."""
    c_drop = cache.dropout
    if c_drop is None:
        ds, g_ln = layernorm.rows_backward(dy, cache.ln, out)
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
                dropout.apply_rows(ds, keep2[part], scale32, df2[part])
            else:
                dropout.apply(ds, keep2[part], c_drop.scale, out=df2[part])

        ds, g_ln = layernorm.rows_backward(dy, cache.ln, out, after=drop)
    dx, *rest = sublayer_backward(df, cache.sublayer)
    dx += ds                                        # the identity path
    return (dx, *rest, g_ln)


@compiled.kernel
def add_dropped_rows(x, f, bias, keep, scale, has_bias, drop):
    """``_add_dropped`` on rows (n, d) as a compiled loop: f = x + Dropout(f + bias), in place;
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
