"""The residual connection around a sub-layer, with layer normalization (paper, section 3.1).

Post-LN, as in the paper ("LayerNorm(x + Sublayer(x))", with dropout on the sub-layer output):
    s = x + Dropout(F(x));         y = LN(s)
    backward: ds = LN'(dy);        dx = ds + F'(Dropout'(ds))

Pre-LN (optional; trains more stably in deep stacks, and needs a final LN after the stack):
    y = x + Dropout(F(LN(x)))
    backward: dx = dy + LN'(F'(Dropout'(dy)))

In both the residual branch adds the identity's gradient to the sub-layer's: the "+" of the
forward pass becomes a fan-out of the gradient in the backward pass.
"""

from __future__ import annotations

from minitfm.layers import dropout, layernorm


def forward(x, sublayer, ln, p_drop, rng, pre_ln):
    """``sublayer(h) -> (out, cache)``; ``ln`` has "gamma" and "beta"."""
    if pre_ln:
        h, c_ln = layernorm.forward(x, ln["gamma"], ln["beta"])
        f, c_sub = sublayer(h)
        f, c_drop = dropout.forward(f, p_drop, rng, inplace=True)   # f is ours
        f += x
        return f, (c_ln, c_sub, c_drop, pre_ln)
    f, c_sub = sublayer(x)
    f, c_drop = dropout.forward(f, p_drop, rng, inplace=True)   # f is ours
    f += x
    y, c_ln = layernorm.forward(f, ln["gamma"], ln["beta"])
    return y, (c_ln, c_sub, c_drop, pre_ln)


def backward(dy, cache, sublayer_backward):
    """Return ``(dx, ln_grads, *rest)`` where ``sublayer_backward(df, cache) -> (dh, *rest)``."""
    c_ln, c_sub, c_drop, pre_ln = cache
    if pre_ln:
        df, _ = dropout.backward(dy, c_drop)
        dh, *rest = sublayer_backward(df, c_sub)
        dx, g_ln = layernorm.backward(dh, c_ln)
        dx += dy                                    # the identity path
        return (dx, g_ln, *rest)
    ds, g_ln = layernorm.backward(dy, c_ln)
    df, _ = dropout.backward(ds, c_drop)
    dx, *rest = sublayer_backward(df, c_sub)
    dx += ds                                        # the identity path
    return (dx, g_ln, *rest)
