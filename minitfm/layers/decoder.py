"""Decoder layer and stack (paper, section 3.1).

Each of the N identical layers has three sub-layers, each wrapped in a residual connection with
layer normalization (see residual.py):
    x = Residual(x, SelfAttention(x, mask = future positions and padded target keys))
    x = Residual(x, CrossAttention(x, memory, mask = padded source keys))
    x = Residual(x, FeedForward(x))
With pre-LN a final layer normalization ("ln") follows the stack.

Parameter names, relative to the stack ("dec." in the model), declared by ``param_shapes``:
    {i}.self_attn.{w_qkv,b_qkv,w_o,b_o}                {i}.ln1.{gamma,beta}
    {i}.cross_attn.{w_q,b_q,w_kv,b_kv,w_o,b_o}         {i}.ln2.{gamma,beta}
    {i}.ff.{w1,b1,w2,b2}                               {i}.ln3.{gamma,beta}
    ln.{gamma,beta} (pre-LN only)

Backward: as the encoder's, plus the encoder output ("memory") feeds every layer's
cross-attention, so its gradient is the sum over the N layers.

Incremental decoding: ``layer_step`` and ``stack_step`` are ``layer_forward`` and
``stack_forward`` on one position t, x (R, d_model), over per-layer keys and values: the
self-attention's buffers (R, H, L, d_k), of which step t fills slot t, and the cross-attention's
keys and values of the encoder output (n, H, S, d_k), computed once by ``stack_cross_kv``, each
shared by R / n consecutive rows (the beams of one sentence).
"""

from __future__ import annotations

from typing import NamedTuple

from minitfm.layers import (attention, feedforward, layernorm, out_part, prefixed, residual,
                            stack_param_shapes, subdict)


class LayerCache(NamedTuple):
    self_attn: residual.Cache       # its .sublayer is an attention.SelfCache
    cross_attn: residual.Cache      # its .sublayer is an attention.CrossCache
    ff: residual.Cache              # its .sublayer is a feedforward.Cache


class StackCache(NamedTuple):
    layers: list                    # one LayerCache per layer
    ln: layernorm.Cache | None      # the final LayerNorm (pre-LN only)


def layer_param_shapes(d_model: int, d_ff: int) -> dict[str, tuple[int, ...]]:
    return {**prefixed(attention.self_param_shapes(d_model), "self_attn."),
            **prefixed(layernorm.param_shapes(d_model), "ln1."),
            **prefixed(attention.cross_param_shapes(d_model), "cross_attn."),
            **prefixed(layernorm.param_shapes(d_model), "ln2."),
            **prefixed(feedforward.param_shapes(d_model, d_ff), "ff."),
            **prefixed(layernorm.param_shapes(d_model), "ln3.")}


def param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """The stack's parameters: "{i}." + the layer's, for each layer, then "ln." (pre-LN only)."""
    return stack_param_shapes(layer_param_shapes(cfg.d_model, cfg.d_ff), cfg.n_layers,
                              layernorm.param_shapes(cfg.d_model) if cfg.pre_ln else None)


def layer_forward(x, memory, p, self_mask, cross_mask, cfg, rng):
    """x (B, T, d_model), memory (B, S, d_model)."""
    sa, ca, ff = subdict(p, "self_attn."), subdict(p, "cross_attn."), subdict(p, "ff.")
    x, c_sa = residual.forward(
        x, lambda h: attention.self_forward(h, sa, self_mask, cfg.n_heads,
                                            cfg.attention_dropout, rng),
        subdict(p, "ln1."), cfg.dropout, rng, cfg.pre_ln)
    x, c_ca = residual.forward(
        x, lambda h: attention.cross_forward(h, memory, ca, cross_mask, cfg.n_heads,
                                             cfg.attention_dropout, rng),
        subdict(p, "ln2."), cfg.dropout, rng, cfg.pre_ln)
    x, c_ff = residual.forward(
        x, lambda h: feedforward.forward(h, ff, cfg.relu_dropout, rng),
        subdict(p, "ln3."), cfg.dropout, rng, cfg.pre_ln)
    return x, LayerCache(c_sa, c_ca, c_ff)


def layer_step(x, p, self_k, self_v, cross_k, cross_v, cross_mask, t: int, cfg):
    """``layer_forward`` on position t alone, x (R, d_model) -> (R, d_model); no dropout.

    self_k, self_v (R, H, L, d_k): this layer's self-attention buffers, slot t written here;
    cross_k, cross_v (n, H, S, d_k): its cross-attention keys and values, and cross_mask
    (n, 1, 1, S), each row shared by R / n consecutive rows of x (``attention.cross_step``). The
    rows stay 2-D so that every projection is one plain matrix product.
    """
    sa, ca, ff = subdict(p, "self_attn."), subdict(p, "cross_attn."), subdict(p, "ff.")
    x = residual.step(x, lambda h: attention.self_step(h, sa, self_k, self_v, t, cfg.n_heads),
                      subdict(p, "ln1."), cfg.pre_ln)
    x = residual.step(
        x, lambda h: attention.cross_step(h, ca, cross_k, cross_v, cross_mask, cfg.n_heads),
        subdict(p, "ln2."), cfg.pre_ln)
    x = residual.step(x, lambda h: feedforward.forward(h, ff)[0], subdict(p, "ln3."), cfg.pre_ln)
    return x


def layer_backward(dy, cache: LayerCache, out=None):
    """Return ``(dx, dmemory, grads)``."""
    dx, g_ff, g_ln3 = residual.backward(
        dy, cache.ff, lambda d, c: feedforward.backward(d, c, out_part(out, "ff.")),
        out_part(out, "ln3."))
    dx, dmemory, g_ca, g_ln2 = residual.backward(
        dx, cache.cross_attn,
        lambda d, c: attention.cross_backward(d, c, out_part(out, "cross_attn.")),
        out_part(out, "ln2."))
    dx, g_sa, g_ln1 = residual.backward(
        dx, cache.self_attn,
        lambda d, c: attention.self_backward(d, c, out_part(out, "self_attn.")),
        out_part(out, "ln1."))
    grads = {**prefixed(g_sa, "self_attn."), **prefixed(g_ln1, "ln1."),
             **prefixed(g_ca, "cross_attn."), **prefixed(g_ln2, "ln2."),
             **prefixed(g_ff, "ff."), **prefixed(g_ln3, "ln3.")}
    return dx, dmemory, grads


def stack_forward(x, memory, p, self_mask, cross_mask, cfg, rng):
    """x (B, T, d_model), memory (B, S, d_model); ``p`` holds the stack's parameters."""
    layers = []
    for i in range(cfg.n_layers):
        x, c = layer_forward(x, memory, subdict(p, f"{i}."), self_mask, cross_mask, cfg, rng)
        layers.append(c)
    c_ln = None
    if cfg.pre_ln:
        x, c_ln = layernorm.forward(x, subdict(p, "ln."))
    return x, StackCache(layers, c_ln)


def stack_cross_kv(memory, p, cfg):
    """Every layer's cross-attention keys and values of memory (B, S, d_model): two lists of
    ``cfg.n_layers`` arrays (B, H, S, d_k), for ``stack_step``."""
    kv = [attention.cross_kv(memory, subdict(p, f"{i}.cross_attn."), cfg.n_heads)
          for i in range(cfg.n_layers)]
    return [k for k, _ in kv], [v for _, v in kv]


def stack_step(x, p, self_k, self_v, cross_k, cross_v, cross_mask, t: int, cfg):
    """``stack_forward`` on position t alone, x (R, d_model) -> (R, d_model); the key/value
    arguments are lists with one array per layer (see ``layer_step``)."""
    for i in range(cfg.n_layers):
        x = layer_step(x, subdict(p, f"{i}."), self_k[i], self_v[i], cross_k[i], cross_v[i],
                       cross_mask, t, cfg)
    if cfg.pre_ln:
        x, _ = layernorm.forward(x, subdict(p, "ln."))
    return x


def stack_backward(dy, cache: StackCache, out=None):
    """Return ``(dx, dmemory, grads)``; dmemory sums the cross-attention gradients of all layers."""
    grads = {}
    if cache.ln is not None:
        dy, g = layernorm.backward(dy, cache.ln, out_part(out, "ln."))
        grads.update(prefixed(g, "ln."))
    dmemory = None
    for i in reversed(range(len(cache.layers))):
        dy, dm, g = layer_backward(dy, cache.layers[i], out_part(out, f"{i}."))
        if dmemory is None:
            dmemory = dm
        else:
            dmemory += dm
        grads.update(prefixed(g, f"{i}."))
    return dy, dmemory, grads
