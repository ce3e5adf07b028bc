"""The fast path of the decoder layer (``minitfm/layers/decoder.py``), chosen per call by
:mod:`minitfm.speed.policy`; the plain ``layer_forward`` is its twin.

As the encoder layer's (``speed/encoder.py``): each sub-layer leaves its last bias to the
residual connection's fast paths, which add it with the dropout and the residual add.
"""

from __future__ import annotations

from minitfm.layers import attention, decoder, feedforward, residual, subdict
from minitfm.speed import fused, policy, rows


@policy.fast_path(decoder.layer_forward)
def choose_layer_forward(x, memory, p, self_mask, cross_mask, cfg, rng):
    """The bias to the residual connection's fast paths, where one may run: the fused kernels,
    or the row passes."""
    return layer_forward if fused.choice() == "fused" or rows.enabled() else None


def layer_forward(x, memory, p, self_mask, cross_mask, cfg, rng):
    """``decoder.layer_forward`` with each sub-layer's last bias added by the residual
    connection."""
    sa, ca, ff = subdict(p, "self_attn."), subdict(p, "cross_attn."), subdict(p, "ff.")
    x, c_sa = residual.forward(
        x, lambda h: attention.self_forward(h, sa, self_mask, cfg.n_heads,
                                            cfg.attention_dropout, rng, add_bias=False),
        subdict(p, "ln1."), cfg.dropout, rng, cfg.pre_ln, bias=sa["b_o"])
    x, c_ca = residual.forward(
        x, lambda h: attention.cross_forward(h, memory, ca, cross_mask, cfg.n_heads,
                                             cfg.attention_dropout, rng, add_bias=False),
        subdict(p, "ln2."), cfg.dropout, rng, cfg.pre_ln, bias=ca["b_o"])
    x, c_ff = residual.forward(
        x, lambda h: feedforward.forward(h, ff, cfg.relu_dropout, rng, add_bias=False),
        subdict(p, "ln3."), cfg.dropout, rng, cfg.pre_ln, bias=ff["b2"])
    return x, decoder.LayerCache(c_sa, c_ca, c_ff)
