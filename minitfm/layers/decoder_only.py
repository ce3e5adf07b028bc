"""Decoder-only layer and stack: the language model's block (a decoder without an encoder).

The paper's decoder layer has three sub-layers; "the decoder inserts a third sub-layer, which
performs multi-head attention over the output of the encoder stack" (section 3.1). Without an
encoder there is nothing to attend to, so each of the N layers keeps two sub-layers, each wrapped
in a residual connection with layer normalization (see residual.py):
    x = Residual(x, SelfAttention(x, mask = future positions))      causal: row t sees 0..t
    x = Residual(x, FeedForward(x))
With pre-LN a final layer normalization ("ln") follows the stack. The causal mask is the stack's
own: there is no padding (every position of a block is text).

Parameter names, relative to the stack ("layers." in the language model), declared by
``param_shapes``:
    {i}.attn.{w_qkv,b_qkv,w_o,b_o}   {i}.ln1.{gamma,beta}
    {i}.ff.{w1,b1,w2,b2}             {i}.ln2.{gamma,beta}       ln.{gamma,beta} (pre-LN only)

Backward: the layers in reverse order, each sub-layer's residual backward in reverse order.

Incremental decoding: ``layer_step`` and ``stack_step`` are ``layer_forward`` and
``stack_forward`` on position t alone, x (R, d_model), over each layer's self-attention key and
value buffers (R, H, L, d_k), of which step t fills slot t (see attention.self_step).
"""

from __future__ import annotations

from typing import NamedTuple

from minitfm.layers import (attention, feedforward, layernorm, out_part, prefixed, residual,
                            stack_param_shapes, subdict)


class LayerCache(NamedTuple):
    self_attn: residual.Cache       # its .sublayer is an attention.SelfCache
    ff: residual.Cache              # its .sublayer is a feedforward.Cache


class StackCache(NamedTuple):
    layers: list                    # one LayerCache per layer
    ln: layernorm.Cache | None      # the final LayerNorm (pre-LN only)


def layer_param_shapes(d_model: int, d_ff: int) -> dict[str, tuple[int, ...]]:
    return {**prefixed(attention.self_param_shapes(d_model), "attn."),
            **prefixed(layernorm.param_shapes(d_model), "ln1."),
            **prefixed(feedforward.param_shapes(d_model, d_ff), "ff."),
            **prefixed(layernorm.param_shapes(d_model), "ln2.")}


def param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """The stack's parameters: "{i}." + the layer's, for each layer, then "ln." (pre-LN only)."""
    return stack_param_shapes(layer_param_shapes(cfg.d_model, cfg.d_ff), cfg.n_layers,
                              layernorm.param_shapes(cfg.d_model) if cfg.pre_ln else None)


def layer_forward(x, p, mask, cfg, rng):
    """x (B, T, d_model), mask (1, 1, T, T) the causal mask; ``cfg`` supplies n_heads, dropout,
    attention_dropout, relu_dropout, pre_ln."""
    attn, ff = subdict(p, "attn."), subdict(p, "ff.")
    x, c_attn = residual.forward(
        x, lambda h: attention.self_forward(h, attn, mask, cfg.n_heads,
                                         cfg.attention_dropout, rng),
        subdict(p, "ln1."), cfg.dropout, rng, cfg.pre_ln)
    x, c_ff = residual.forward(
        x, lambda h: feedforward.forward(h, ff, cfg.relu_dropout, rng), subdict(p, "ln2."),
        cfg.dropout, rng, cfg.pre_ln)
    return x, LayerCache(c_attn, c_ff)


def layer_step(x, p, k_buf, v_buf, t: int, cfg):
    """``layer_forward`` on position t alone: x (R, d_model) -> (R, d_model); no dropout.

    Writes position t's self-attention key and value into slot t of ``k_buf`` and ``v_buf``
    (R, H, L, d_k), whose slots < t hold the earlier positions'.
    """
    attn, ff = subdict(p, "attn."), subdict(p, "ff.")
    x = residual.step(x, lambda h: attention.self_step(h, attn, k_buf, v_buf, t, cfg.n_heads),
                      subdict(p, "ln1."), cfg.pre_ln)
    x = residual.step(x, lambda h: feedforward.forward(h, ff)[0], subdict(p, "ln2."), cfg.pre_ln)
    return x


def layer_backward(dy, cache: LayerCache, out=None):
    """Return ``(dx, grads)``."""
    dx, g_ff, g_ln2 = residual.backward(
        dy, cache.ff, lambda d, c: feedforward.backward(d, c, out_part(out, "ff.")),
        out_part(out, "ln2."))
    dx, g_attn, g_ln1 = residual.backward(
        dx, cache.self_attn, lambda d, c: attention.self_backward(d, c, out_part(out, "attn.")),
        out_part(out, "ln1."))
    grads = {**prefixed(g_attn, "attn."), **prefixed(g_ln1, "ln1."),
             **prefixed(g_ff, "ff."), **prefixed(g_ln2, "ln2.")}
    return dx, grads


def stack_forward(x, p, cfg, rng):
    """Run ``cfg.n_layers`` layers under the causal mask; x (B, T, d_model)."""
    mask = attention.causal_mask(x.shape[1], x.dtype)                    # (1, 1, T, T)
    layers = []
    for i in range(cfg.n_layers):
        x, c = layer_forward(x, subdict(p, f"{i}."), mask, cfg, rng)
        layers.append(c)
    c_ln = None
    if cfg.pre_ln:
        x, c_ln = layernorm.forward(x, subdict(p, "ln."))
    return x, StackCache(layers, c_ln)


def stack_step(x, p, k_bufs, v_bufs, t: int, cfg):
    """``stack_forward`` on position t alone, x (R, d_model) -> (R, d_model); ``k_bufs`` and
    ``v_bufs`` hold one buffer per layer (see ``layer_step``)."""
    for i in range(cfg.n_layers):
        x = layer_step(x, subdict(p, f"{i}."), k_bufs[i], v_bufs[i], t, cfg)
    if cfg.pre_ln:
        x, _ = layernorm.forward(x, subdict(p, "ln."))
    return x


def stack_backward(dy, cache: StackCache, out=None):
    """Return ``(dx, grads)``."""
    grads = {}
    if cache.ln is not None:
        dy, g = layernorm.backward(dy, cache.ln, out_part(out, "ln."))
        grads.update(prefixed(g, "ln."))
    for i in reversed(range(len(cache.layers))):
        dy, g = layer_backward(dy, cache.layers[i], out_part(out, f"{i}."))
        grads.update(prefixed(g, f"{i}."))
    return dy, grads
