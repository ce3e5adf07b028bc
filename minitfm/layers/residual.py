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

``bias``: a sub-layer may leave its last bias b to the residual connection, which then computes
x + Dropout(F'(x) + b), the same numbers (the fast path of the encoder's and decoder's layers
does: ``minitfm/speed/encoder.py``). Its fast paths: ``minitfm/speed/residual.py``.
"""

from __future__ import annotations

from typing import NamedTuple

from minitfm.layers import dropout, layernorm


class Cache(NamedTuple):
    ln: layernorm.Cache
    sublayer: object        # the sub-layer's own cache
    dropout: dropout.Cache | None
    pre_ln: bool


def forward(x, sublayer, ln, p_drop, rng, pre_ln, bias=None):
    """``sublayer(h) -> (out, cache)``; ``ln`` has "gamma" and "beta"; ``bias``: the sub-layer's
    last bias, when it leaves it to the residual connection."""
    if pre_ln:
        h, c_ln = layernorm.forward(x, ln)
        f, c_sub = sublayer(h)
        f, c_drop = add_dropped(x, f, p_drop, rng, bias)
        return f, Cache(c_ln, c_sub, c_drop, pre_ln)
    f, c_sub = sublayer(x)
    f, c_drop = add_dropped(x, f, p_drop, rng, bias)
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


def add_dropped(x, f, p_drop, rng, bias=None):
    """``x + Dropout(f + bias)``, in place on f (which is ours); ``(sum, dropout cache)``."""
    if bias is not None:
        f += bias
    f, c_drop = dropout.forward(f, p_drop, rng, inplace=True)
    f += x
    return f, c_drop
