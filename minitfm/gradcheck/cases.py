"""The table of gradient checks: one row (:class:`~minitfm.gradcheck.check.Case`) per layer, in
the order of minitfm/layers/, then one per whole model and config."""

from __future__ import annotations

import dataclasses

from minitfm import backend
from minitfm.gradcheck.check import Case, draw, normal, random_params
from minitfm.layers import (attention, decoder, decoder_only, dropout, embedding, encoder,
                            feedforward, inputs, layernorm, linear, loss, output, positional,
                            residual, softmax)
from minitfm.models import DROPOUTS, lm, translator


def stack_config(s: dict) -> translator.Config:
    """A stack's config: pre-LN if ``s["pre"]``, dropout ``s["p"]``, the others ``s["pa"]``."""
    return translator.Config(src_vocab=7, tgt_vocab=7, n_layers=s["n"], d_model=s["h"] * s["dk"],
                             d_ff=s["f"], n_heads=s["h"], dropout=s.get("p", 0.0),
                             attention_dropout=s.get("pa", 0.0), relu_dropout=s.get("pa", 0.0),
                             pre_ln=bool(s.get("pre")), max_len=64)


def _rng():
    return backend.rng(7)          # every dropout mask of a layer case: the same one every call


def _residual_backward(dy, cache, out=None):     # the linear sub-layer's "w", then LN's
    dx, g_linear, g_ln = residual.backward(
        dy, cache, lambda d, c: linear.backward(d, c, None if out is None else {"w": out["w"]}),
        None if out is None else {"gamma": out["gamma"], "beta": out["beta"]})
    return dx, {**g_linear, **g_ln}


def _loss(rng, s):
    targets = draw(rng, s, "ids v: n")
    targets[0] = 0 if s["n"] > 1 else targets[0]          # one padded row, when there are two
    return {"logits": normal(rng, s["n"], s["v"]) * 3.0, "targets": targets}


def _loss_forward(a, s):          # the output (loss_sum, nll_sum): backward takes dloss_sum
    (loss_sum, _), cache = loss.forward(a["logits"].copy(), a["targets"], s["smoothing"], 0)
    return loss_sum, cache


def _output_backward(dloss, a, out=None):     # its one call again, with dloss: (dh, grads)
    _, dh, grads = output.forward_backward(a["h"], a, a["targets"], 0.1, dloss, out)
    return dh, grads


# ---- the table: one row per case, in the order of minitfm/layers/ ----------------------------

def _also(case: Case, name: str, **sizes) -> Case:       # a variant: other sizes or settings
    return dataclasses.replace(case, name=name, sizes={**case.sizes, **sizes})


ATTN = dict(b=2, h=2, t=3, s=4, dk=3)
STACK = dict(b=2, h=2, t=3, s=4, dk=2, f=5, n=2, p=0.0)
HALF = 0.5        # attention weights at half the unit scale: scores of order 1, no saturation
QKV = {"q": "b h t dk", "k": "b h kv dk", "v": "b h kv dk", "mask": "mask: b kv"}


SCORE_SCALE = 0.7                 # the softmax's scale c (1 / sqrt(d_k) in attention)


def _softmax_forward(scores, mask):   # on a copy: the layer overwrites its scores with P
    p = softmax.forward(scores.copy(), SCORE_SCALE, mask)
    return p, p                       # P is its own cache


FEEDFORWARD = Case("feedforward", dict(b=2, t=3, d=4, f=6), {"x": "b t d"},
                   lambda s: feedforward.param_shapes(s["d"], s["f"]),
                   lambda a, s: feedforward.forward(a["x"], a, s.get("p", 0.0), _rng()),
                   feedforward.backward)
# 5 keys: seed 0 leaves 3 of them visible in each row (with 4, one: a constant P, no gradient)
SOFTMAX = Case("softmax (scaled, padding mask)", {**ATTN, "s": 5},
               {"s": "b h t kv", "mask": "mask: b kv"},
               None, lambda a, s: _softmax_forward(a["s"], None if s.get("nomask") else a["mask"]),
               lambda dp, p: (softmax.backward(dp.copy(), p, SCORE_SCALE), {}), ("s",))
SDPA = Case("attention (padding mask)", ATTN, QKV, None,
            lambda a, s: attention.sdpa_forward(
                a["q"], a["k"], a["v"], a["mask"] + (attention.causal_mask(s["t"], a["q"].dtype)
                                                     if s.get("causal") else 0.0),
                None, s.get("p", 0.0), _rng()),
            attention.sdpa_backward, ("q", "k", "v"))
SELF = Case("multi-head self-attention", ATTN, {"x": "b t hd", "mask": "mask: b t"},
            lambda s: attention.self_param_shapes(s["h"] * s["dk"]),
            lambda a, s: attention.self_forward(a["x"], a, a["mask"], s["h"], s.get("p", 0.0),
                                                _rng()),
            attention.self_backward, scale=lambda s: HALF * (s["h"] * s["dk"]) ** -0.5)
CROSS = Case("multi-head cross-attention", ATTN,
             {"x": "b t hd", "memory": "b s hd", "mask": "mask: b s"},
             lambda s: attention.cross_param_shapes(s["h"] * s["dk"]),
             lambda a, s: attention.cross_forward(a["x"], a["memory"], a, a["mask"], s["h"],
                                                  s.get("p", 0.0), _rng()),
             attention.cross_backward, ("x", "memory"), scale=SELF.scale)
RESIDUAL = Case("residual + LN (post-LN)", dict(b=2, t=3, d=4), {"x": "b t d"},
                lambda s: {"w": (s["d"], s["d"]), **layernorm.param_shapes(s["d"])},
                lambda a, s: residual.forward(a["x"], lambda h: linear.forward(h, {"w": a["w"]}),
                                              a, 0.2, backend.rng(3), bool(s.get("pre"))),
                _residual_backward)
ENCODER = Case("encoder stack (post-LN)", STACK, {"x": "b s hd", "mask": "mask: b s"},
               lambda s: encoder.param_shapes(stack_config(s)),
               lambda a, s: encoder.stack_forward(a["x"], a, a["mask"], stack_config(s),
                                                  backend.rng(5)),
               encoder.stack_backward, scale="stack")
DECODER = Case("decoder stack (post-LN)", STACK,
               {"x": "b t hd", "memory": "b s hd", "mask": "mask: b s"},
               lambda s: decoder.param_shapes(stack_config(s)),
               lambda a, s: decoder.stack_forward(
                   a["x"], a["memory"], a, attention.causal_mask(s["t"], a["x"].dtype),
                   a["mask"], stack_config(s), backend.rng(5)),
               decoder.stack_backward, ("x", "memory"), scale="stack")
DECODER_ONLY = Case("decoder-only stack (post-LN)", STACK, {"x": "b t hd"},
                    lambda s: decoder_only.param_shapes(stack_config(s)),
                    lambda a, s: decoder_only.stack_forward(a["x"], a, stack_config(s),
                                                            backend.rng(5)),
                    decoder_only.stack_backward, scale="stack")
LOSS = Case("label-smoothed cross-entropy", dict(n=5, v=7, smoothing=0.1), _loss, None,
            _loss_forward, loss.backward, ("logits",))

CASES = [
    Case("linear", dict(b=2, t=3, d=4, f=5), {"x": "b t d"},
         lambda s: linear.param_shapes(s["d"], s["f"]),
         lambda a, s: linear.forward(a["x"], a), linear.backward),
    Case("embedding", dict(b=2, t=6, v=5, d=4), {"ids": "ids v: b t"},
         lambda s: embedding.param_shapes(s["v"], s["d"]),
         lambda a, s: embedding.forward(a["ids"], a), embedding.backward, (None,)),
    Case("positional", dict(b=2, t=4, d=6), {"x": "b t d"}, None,
         lambda a, s: positional.forward(a["x"], offset=3), positional.backward),
    Case("positional (learned)", dict(b=2, t=4, d=6), {"x": "b t d"},  # t + 5 rows, 4.. read
         lambda s: positional.learned_param_shapes(s["t"] + 5, s["d"]),
         lambda a, s: positional.learned_forward(a["x"], a, offset=4),
         positional.learned_backward),
    Case("dropout", dict(b=2, t=4, d=5), {"x": "b t d"}, None,
         lambda a, s: dropout.forward(a["x"], 0.3, _rng()), dropout.backward),
    Case("inputs (embedding, learned positions, dropout)", dict(b=2, t=4, v=6, d=4),
         {"ids": "ids v: b t"}, lambda s: inputs.param_shapes(s["v"], s["d"], s["t"] + 6),
         lambda a, s: inputs.forward(a["ids"], a, 0.3, _rng(), offset=4), inputs.backward,
         (None,)),
    Case("inputs (word dropout, sinusoids, dropout)", dict(b=2, t=5, v=6, d=4),
         {"ids": "ids v: b t"}, lambda s: inputs.param_shapes(s["v"], s["d"]),
         lambda a, s: inputs.forward(a["ids"], a, 0.3, _rng(), offset=1, p_word=0.4),
         inputs.backward, (None,)),
    Case("layernorm", dict(b=2, t=3, d=5), {"x": "b t d"},
         lambda s: layernorm.param_shapes(s["d"]),
         lambda a, s: layernorm.forward(a["x"], a), layernorm.backward),
    FEEDFORWARD, _also(FEEDFORWARD, "feedforward (ReLU dropout)", p=0.3),
    SOFTMAX, _also(SOFTMAX, "softmax (scaled, no mask)", nomask=1),
    SDPA,
    _also(SDPA, "attention (causal mask)", causal=1),
    _also(SDPA, "attention (dropout)", p=0.3),
    SELF, _also(SELF, "multi-head self-attention (dropout)", p=0.3),
    CROSS, _also(CROSS, "multi-head cross-attention (dropout)", p=0.3),
    RESIDUAL, _also(RESIDUAL, "residual + LN (pre-LN)", pre=1),
    ENCODER, _also(ENCODER, "encoder stack (pre-LN)", pre=1),
    DECODER, _also(DECODER, "decoder stack (pre-LN)", pre=1),
    DECODER_ONLY, _also(DECODER_ONLY, "decoder-only stack (pre-LN)", pre=1),
    LOSS, _also(LOSS, "label-smoothed cross-entropy (no smoothing)", smoothing=0.0),
    Case("output (tied projection, label-smoothed loss)", dict(n=5, d=4, v=7),
         {"h": "n d", "table": "v d", "targets": "ids v: n"}, None,
         lambda a, s: (output.forward_backward(a["h"], a, a["targets"], 0.1)[0][0], a),
         _output_backward, ("h",)),
]


# ---- the whole models: one row per model and config ------------------------------------------

def translation_batch(rng, cfg: translator.Config, batch=2, src_len=4, tgt_len=4):
    """Random (src, tgt) with padding on both sides; every sentence keeps at least one token."""
    first = max(cfg.pad_id, cfg.bos_id, cfg.eos_id) + 1
    src = rng.integers(first, cfg.src_vocab, size=(batch, src_len))
    tgt = rng.integers(first, cfg.tgt_vocab, size=(batch, tgt_len + 1))
    tgt[:, 0] = cfg.bos_id
    for b in range(batch):
        s, t = int(rng.integers(1, src_len + 1)), int(rng.integers(1, tgt_len + 1))
        src[b, s - 1], src[b, s:] = cfg.eos_id, cfg.pad_id
        tgt[b, t], tgt[b, t + 1:] = cfg.eos_id, cfg.pad_id
    src[0, -1], tgt[0, -1] = cfg.eos_id, cfg.eos_id     # one full-length row per side
    return backend.to_device(src, dtype="int64"), backend.to_device(tgt, dtype="int64")


def lm_batch(rng, cfg: lm.LMConfig, batch: int = 2, length: int = 4):
    """Random blocks ``x`` (B, T) and their next tokens ``y``, host arrays."""
    tokens = rng.integers(0, cfg.vocab, size=(batch, length + 1))
    return tokens[:, :-1], tokens[:, 1:]


def model_case(name: str, model, cfg, draw_batch, **sizes) -> Case:
    """A whole model as a row: random parameters, then a random batch ("a", "b"); its output
    the loss. With dropout the masks are fixed (drawn from one seed)."""
    shapes = model.parameter_shapes(cfg)
    rng = (lambda: backend.rng(2)) if any(getattr(cfg, n, 0) for n in DROPOUTS) else lambda: None

    def run(a, grads):
        return model.loss_and_grads({k: a[k] for k in shapes}, cfg, a["a"], a["b"], rng(),
                                    grads=grads)

    return Case(name, sizes, lambda r, s: {**random_params(r, shapes, cfg.d_model),
                                           **dict(zip("ab", draw_batch(r, cfg, **s)))}, None,
                lambda a, s: (run(a, False)[0]["loss"], a),
                lambda g, a: ({k: v * g for k, v in run(a, True)[1].items()},), (), cfg=cfg)


_DROPOUTS = [("dropout, fixed mask", dict(dropout=0.3)),
             ("attention and ReLU dropout, fixed masks", dict(attention_dropout=0.3,
                                                              relu_dropout=0.3)),
             ("word dropout, fixed mask", dict(word_dropout=0.3))]
# The "tiny" presets narrowed for the checks, every size still its own (d_model 6, two heads of
# 3, d_ff 10, vocabularies of 11 and 9), so that a transposed or misshaped product still fails:
# a whole-model check perturbs each parameter in turn, here 1,738 of them instead of 2,824.
NARROW = dict(d_model=6, d_ff=10)
MODEL_CASES = [
    *[model_case(f"model ({name})", translator, translator.PRESETS["tiny"].replace(**NARROW, **change),
             translation_batch, batch=2, src_len=4, tgt_len=4)
      for name, change in [("post-LN", {}), ("pre-LN", dict(pre_ln=True)), *_DROPOUTS,
                           ("separate embeddings", dict(share_embeddings=False, tgt_vocab=9))]],
    *[model_case(f"language model ({name})", lm, lm.PRESETS["tiny"].replace(**NARROW, **change),
             lm_batch, batch=2, length=4)
      for name, change in [("pre-LN", {}), ("post-LN", dict(pre_ln=False)),
                           ("learned positions", dict(learned_positions=True)), *_DROPOUTS]],
]


