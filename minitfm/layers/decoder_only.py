"""Decoder-only stack: the language model's block, which *is* the encoder layer under a causal mask.

The paper's decoder layer has three sub-layers; "the decoder inserts a third sub-layer, which
performs multi-head attention over the output of the encoder stack" (section 3.1). Without an
encoder there is nothing to attend to, and what is left is the encoder layer (encoder.py): two
sub-layers, each wrapped in a residual connection with layer normalization (see residual.py),
    x = Residual(x, SelfAttention(x, mask = future positions))      causal: row t sees 0..t
    x = Residual(x, FeedForward(x))
with a final layer normalization ("ln") after the stack with pre-LN. Only the mask differs: the
encoder's hides padded source keys, this one hides the future (there is no padding: every
position of a block is text). So the forward pass here is the encoder stack's, given the causal
mask.

Backward: the encoder stack's. The mask is a constant of the forward pass, so the backward pass
does not see it.

Parameter names, relative to the stack ("layers." in the language model): the encoder stack's,
    {i}.attn.{w_qkv,b_qkv,w_o,b_o}   {i}.ln1.{gamma,beta}
    {i}.ff.{w1,b1,w2,b2}             {i}.ln2.{gamma,beta}       ln.{gamma,beta} (pre-LN only)

Incremental decoding is this block's own: ``layer_step`` and ``stack_step`` are the forward pass
on position t alone, x (R, d_model), over each layer's self-attention key and value buffers
(R, H, L, d_k), of which step t fills slot t (see attention.self_step). No mask is needed there:
the slots after t are not filled yet.
"""

from __future__ import annotations

from minitfm.layers import attention, encoder, feedforward, layernorm, residual, subdict


def param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """The stack's parameters: the encoder stack's (see above)."""
    return encoder.param_shapes(cfg)


def stack_forward(x, p, cfg, rng):
    """The encoder stack under the causal mask; x (B, T, d_model). Returns ``(y, cache)``, the
    cache an ``encoder.StackCache``."""
    mask = attention.causal_mask(x.shape[1], x.dtype)                    # (1, 1, T, T)
    return encoder.stack_forward(x, p, mask, cfg, rng)


def stack_backward(dy, cache: encoder.StackCache, out=None):
    """The encoder stack's backward pass; return ``(dx, grads)``."""
    return encoder.stack_backward(dy, cache, out)


def layer_step(x, p, k_buf, v_buf, t: int, cfg):
    """``encoder.layer_forward`` under the causal mask, on position t alone: x (R, d_model) ->
    (R, d_model); no dropout.

    Writes position t's self-attention key and value into slot t of ``k_buf`` and ``v_buf``
    (R, H, L, d_k), whose slots < t hold the earlier positions'.
    """
    attn, ff = subdict(p, "attn."), subdict(p, "ff.")
    x = residual.step(x, lambda h: attention.self_step(h, attn, k_buf, v_buf, t, cfg.n_heads),
                      subdict(p, "ln1."), cfg.pre_ln)
    x = residual.step(x, lambda h: feedforward.forward(h, ff)[0], subdict(p, "ln2."), cfg.pre_ln)
    return x


def stack_step(x, p, k_bufs, v_bufs, t: int, cfg):
    """``stack_forward`` on position t alone, x (R, d_model) -> (R, d_model); ``k_bufs`` and
    ``v_bufs`` hold one buffer per layer (see ``layer_step``)."""
    for i in range(cfg.n_layers):
        x = layer_step(x, subdict(p, f"{i}."), k_bufs[i], v_bufs[i], t, cfg)
    if cfg.pre_ln:
        x, _ = layernorm.forward(x, subdict(p, "ln."))
    return x
