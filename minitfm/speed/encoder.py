"""The fast path of the encoder layer (``minitfm/layers/encoder.py``), chosen per call by
:mod:`minitfm.speed.policy`; the plain ``layer_forward`` is its twin.

Each sub-layer leaves its last bias (the attention's b_o, the feed-forward's b2) to the residual
connection (``add_bias=False``, ``residual.forward(..., bias=b)``), whose fast paths add it with
the dropout and the residual add in one kernel or one pass over blocks of rows
(``speed/residual.py``): x + Dropout(F'(x) + b), the same numbers as the plain layer's
x + Dropout(F(x)). The decoder-only stack runs these layers too.
"""

from __future__ import annotations

from minitfm.layers import attention, encoder, feedforward, residual, subdict
from minitfm.speed import fused, policy, rows


@policy.fast_path(encoder.layer_forward)
def choose_layer_forward(x, p, mask, cfg, rng):
    """The bias to the residual connection's fast paths, where one may run: the fused kernels,
    or the row passes."""
    return layer_forward if fused.choice() == "fused" or rows.enabled() else None


def layer_forward(x, p, mask, cfg, rng):
    """``encoder.layer_forward`` with each sub-layer's last bias added by the residual
    connection."""
    attn, ff = subdict(p, "attn."), subdict(p, "ff.")
    x, c_attn = residual.forward(
        x, lambda h: attention.self_forward(h, attn, mask, cfg.n_heads,
                                            cfg.attention_dropout, rng, add_bias=False),
        subdict(p, "ln1."), cfg.dropout, rng, cfg.pre_ln, bias=attn["b_o"])
    x, c_ff = residual.forward(
        x, lambda h: feedforward.forward(h, ff, cfg.relu_dropout, rng, add_bias=False),
        subdict(p, "ln2."), cfg.dropout, rng, cfg.pre_ln, bias=ff["b2"])
    return x, encoder.LayerCache(c_attn, c_ff)
