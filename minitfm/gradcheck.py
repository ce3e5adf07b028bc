"""Finite-difference gradient checks for every layer and for the whole model.

For a layer y = f(x, params) we check its backward pass on the scalar L = sum(G * y), with G a
fixed random array (so every output element matters, each with its own weight). The analytic
gradient is ``backward(G, cache)``; the numerical one perturbs each input element in turn:

    dL/dx_i ~ (-L(x_i + 2h) + 8 L(x_i + h) - 8 L(x_i - h) + L(x_i - 2h)) / (12 h)

five-point central differences in float64, error O(h^4), and the two are compared by the
relative error

    ||analytic - numeric|| / max(||analytic||, ||numeric||)

which must not exceed 1e-6 (typical values here are 1e-10 to 1e-8).

The step balances the two errors of a difference quotient: truncation, O(h^4) here, which strongly
curved functions make large (a LayerNorm over three features), and rounding, O(eps |L| / h),
which matters for gradients much smaller than L. h = 2e-5 keeps both near 1e-9 for almost every
array. Two kinds of input defeat any single step: a ReLU has a kink at 0, where a quotient whose
points straddle it is meaningless, so h must stay small; and an array whose gradient is ~1e-6 of
L (a LayerNorm shift deep in a stack, one attention head of one dimension) loses ~1e-6 to
rounding at that h, so h must be large. An array whose error exceeds the tolerance at h = 2e-5 is
therefore measured again at h = 1e-4 (against rounding), then at 4e-6 (against a kink within
2h), and its smallest error counts. A wrong backward pass fails at every step (the measurements
agree with each other wherever each is reliable); the checker's own tests hold it to that. Rounding is also why test inputs keep activations at unit
scale, and why attention is drawn with d_model >= 2: a saturated softmax, or one head of one
dimension, has gradients so small next to L that no h resolves them.

    python -m minitfm.gradcheck              # every layer and the whole models, as a table
    python -m minitfm.gradcheck layernorm    # the cases whose name contains "layernorm"

Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from typing import Callable

from minitfm import backend, lm, model
from minitfm.layers import (attention, decoder, dropout, embedding, encoder, feedforward,
                            layernorm, linear, loss, positional, residual)

TOLERANCE = 1e-6
STEP = 2e-5
STEPS = (STEP, 1e-4, 4e-6)     # measured in this order until one agrees: see above


# ---- the checker ----------------------------------------------------------------------------

def relative_error(analytic, numeric) -> float:
    """||a - n|| / max(||a||, ||n||); 0 when both are exactly zero."""
    xp = backend.xp
    a = analytic.astype(xp.float64).ravel()
    n = numeric.astype(xp.float64).ravel()
    scale = max(float(xp.linalg.norm(a)), float(xp.linalg.norm(n)))
    diff = float(xp.linalg.norm(a - n))
    return 0.0 if scale == 0.0 else diff / scale


def numerical_gradient(objective: Callable[[], float], x, step: float = STEP):
    """Finite differences of ``objective()`` with respect to every element of ``x`` (in place).

    The five-point central difference

        f'(x) = (-f(x + 2h) + 8 f(x + h) - 8 f(x - h) + f(x - 2h)) / 12h  +  O(h^4)

    Its truncation error falls as h^4, not h^2 as for (f(x + h) - f(x - h)) / 2h, so h can be
    large enough (1e-4) that float64 rounding in f, which grows as 1/h, stays near 1e-12 of |f|,
    while strongly curved objectives (a LayerNorm over three features, a near-one-hot softmax)
    are still differentiated to ~1e-9.
    """
    xp = backend.xp
    if not x.flags.c_contiguous:
        raise ValueError("numerical_gradient needs a contiguous array")
    flat = x.reshape(-1)                     # a view of x
    grad = xp.zeros(x.size, dtype=xp.float64)
    for i in range(x.size):
        old = float(flat[i])
        f = {}
        for k in (2, 1, -1, -2):
            flat[i] = old + k * step
            f[k] = objective()
        flat[i] = old
        grad[i] = (8.0 * (f[1] - f[-1]) - (f[2] - f[-2])) / (12.0 * step)
    return grad.reshape(x.shape)


def check_gradients(objective, analytic: dict, arrays: dict, steps=STEPS,
                    tolerance: float = TOLERANCE) -> dict:
    """Relative error of each analytic gradient against finite differences of ``objective``.

    ``objective()`` recomputes the scalar from the current contents of ``arrays`` (perturbed in
    place); ``analytic`` maps the same names to the gradients of the backward pass. Each array is
    measured at the first of ``steps``; one whose error exceeds ``tolerance`` is measured again at
    the next, and so on, and its smallest error counts (see the module docstring: each step is
    reliable where another is not).
    """
    steps = (steps,) if isinstance(steps, float) else tuple(steps)
    errors = {}
    for name, grad in analytic.items():
        for step in steps:
            error = relative_error(grad, numerical_gradient(objective, arrays[name], step))
            errors[name] = min(errors.get(name, error), error)
            if errors[name] <= tolerance:
                break
    return errors


@dataclass
class Case:
    """A gradient check: ``make(rng, sizes) -> arrays``, ``run(arrays, sizes) -> (out, backward)``.

    ``run`` calls a layer's forward pass and returns its output with a function mapping dout to
    the gradients of every float input (a dict keyed like ``arrays``).
    """

    name: str
    make: Callable
    run: Callable
    sizes: dict


def check_case(case: Case, seed: int = 0, sizes: dict | None = None) -> dict:
    """Run one case in float64; return the relative error of every checked input."""
    rng = backend.host_rng(seed)
    sizes = {**case.sizes, **(sizes or {})}
    arrays = case.make(rng, sizes)
    out, back = case.run(arrays, sizes)
    g = backend.to_device(rng.standard_normal(out.shape), dtype="float64")   # dL/dout = G

    def objective():
        y, _ = case.run(arrays, sizes)
        return float((y * g).sum())

    return check_gradients(objective, back(g), arrays)


# ---- the cases: one section per layer, in the order of minitfm/layers/ -----------------------

def _normal(rng, *shape):
    return backend.to_device(rng.standard_normal(shape), dtype="float64")


def _ids(rng, low, high, *shape):
    return backend.to_device(rng.integers(low, high, size=shape), dtype="int64")


def _params(rng, shapes: dict, scale: float = 1.0) -> dict:
    """Random values for a layer's ``param_shapes``: matrices times ``scale``; vectors N(0, 1)."""
    return {name: _normal(rng, *shape) * (scale if len(shape) == 2 else 1.0)
            for name, shape in shapes.items()}


def _lengths_mask(rng, batch, length):
    """Additive key-padding mask (B, 1, 1, L) with at least one visible key per row."""
    xp = backend.xp
    lengths = rng.integers(1, length + 1, size=batch)
    pad = xp.arange(length)[None, :] >= backend.to_device(lengths)[:, None]      # (B, L)
    return xp.where(pad, attention.MASKED, 0.0)[:, None, None, :]


def _grads_of(result, *input_names):
    """A backward's ``(d_inputs..., grads)`` as one dict keyed like the case's arrays; an input
    named None (token ids) has no gradient to check."""
    *d_inputs, grads = result
    assert len(d_inputs) == len(input_names), "one name per gradient of an input"
    return {**{n: d for n, d in zip(input_names, d_inputs) if n is not None}, **grads}


def _x(rng, s):
    return {"x": _normal(rng, s["b"], s["t"], s["d"])}


# linear

def _linear(rng, s):
    return {**_x(rng, s), **_params(rng, linear.param_shapes(s["d"], s["f"]))}


def _run_linear(a, s):
    y, c = linear.forward(a["x"], a)
    return y, lambda dy: _grads_of(linear.backward(dy, c), "x")


# embedding

def _embedding(rng, s):
    return {"ids": _ids(rng, 0, s["v"], s["b"], s["t"]),
            **_params(rng, embedding.param_shapes(s["v"], s["d"]))}


def _run_embedding(a, s):
    y, c = embedding.forward(a["ids"], a)
    return y, lambda dy: _grads_of(embedding.backward(dy, c), None)     # no gradient for ids


# positional

def _run_positional(a, s):
    y, c = positional.forward(a["x"], offset=3)
    return y, lambda dy: _grads_of(positional.backward(dy, c), "x")


def _learned_positional(rng, s):
    """x and a table of t + 5 positions: with offset 2, rows outside the window get no gradient."""
    return {**_x(rng, s), **_params(rng, positional.learned_param_shapes(s["t"] + 5, s["d"]))}


def _run_learned_positional(a, s):
    y, c = positional.learned_forward(a["x"], a, offset=2)
    return y, lambda dy: _grads_of(positional.learned_backward(dy, c), "x")


# dropout

def _run_dropout(a, s):
    y, c = dropout.forward(a["x"], 0.3, backend.rng(7))    # same seed: the same mask every call
    return y, lambda dy: _grads_of(dropout.backward(dy, c), "x")


# layernorm

def _layernorm(rng, s):
    return {**_x(rng, s), **_params(rng, layernorm.param_shapes(s["d"]))}


def _run_layernorm(a, s):
    y, c = layernorm.forward(a["x"], a)
    return y, lambda dy: _grads_of(layernorm.backward(dy, c), "x")


# feedforward

def _feedforward(rng, s):
    return {**_x(rng, s), **_params(rng, feedforward.param_shapes(s["d"], s["f"]))}


def _run_feedforward(a, s):
    """With ReLU dropout when ``s["p"]`` is set (a fixed mask: the same seed every call)."""
    y, c = feedforward.forward(a["x"], a, s.get("p", 0.0), backend.rng(7))
    return y, lambda dy: _grads_of(feedforward.backward(dy, c), "x")


# attention: scaled dot-product, multi-head self- and cross-attention

def _sdpa(rng, s):
    b, h, t, src, dk = s["b"], s["h"], s["t"], s["s"], s["dk"]
    return {"q": _normal(rng, b, h, t, dk), "k": _normal(rng, b, h, src, dk),
            "v": _normal(rng, b, h, src, dk), "mask": _lengths_mask(rng, b, src)}


def _run_sdpa(a, s, causal=False):
    """With attention dropout when ``s["p"]`` is set (a fixed mask, as for feedforward)."""
    mask = a["mask"]
    if causal:
        mask = mask + model.causal_mask(a["q"].shape[2], a["q"].dtype)
    o, c = attention.sdpa_forward(a["q"], a["k"], a["v"], mask, None, s.get("p", 0.0),
                                  backend.rng(7))
    return o, lambda do: _grads_of(attention.sdpa_backward(do, c), "q", "k", "v")


def _attention_params(rng, shapes, d):
    # half the unit scale: scores of order 1, no saturation
    return _params(rng, shapes, scale=0.5 * d ** -0.5)


def _self_attn(rng, s):
    d = s["h"] * s["dk"]
    return {"x": _normal(rng, s["b"], s["t"], d), "mask": _lengths_mask(rng, s["b"], s["t"]),
            **_attention_params(rng, attention.self_param_shapes(d), d)}


def _run_self_attn(a, s):
    y, c = attention.self_forward(a["x"], a, a["mask"], s["h"], s.get("p", 0.0), backend.rng(7))
    return y, lambda dy: _grads_of(attention.self_backward(dy, c), "x")


def _cross_attn(rng, s):
    d = s["h"] * s["dk"]
    return {"x": _normal(rng, s["b"], s["t"], d), "memory": _normal(rng, s["b"], s["s"], d),
            "mask": _lengths_mask(rng, s["b"], s["s"]),
            **_attention_params(rng, attention.cross_param_shapes(d), d)}


def _run_cross_attn(a, s):
    y, c = attention.cross_forward(a["x"], a["memory"], a, a["mask"], s["h"], s.get("p", 0.0),
                                   backend.rng(7))
    return y, lambda dy: _grads_of(attention.cross_backward(dy, c), "x", "memory")


# residual

def _residual(rng, s):
    return {**_x(rng, s), "w": _normal(rng, s["d"], s["d"]),
            **_params(rng, layernorm.param_shapes(s["d"]))}


def _run_residual(a, s, pre_ln):
    """Residual + LayerNorm around a linear sub-layer (no bias), with dropout (fixed mask)."""
    y, c = residual.forward(a["x"], lambda h: linear.forward(h, {"w": a["w"]}), a, 0.2,
                            backend.rng(3), pre_ln)

    def back(dy):
        dx, g_linear, g_ln = residual.backward(dy, c, linear.backward)
        return {"x": dx, **g_linear, **g_ln}
    return y, back


# encoder and decoder stacks

def _stack_params(rng, cfg: model.Config, prefix, shapes=None):
    """Random (not initial) values for the parameters of one stack, so LN gains etc. matter;
    ``shapes`` defaults to ``model.parameter_shapes(cfg)``."""
    p = {}
    for name, shape in (shapes or model.parameter_shapes(cfg)).items():
        if not name.startswith(prefix):
            continue
        if len(shape) == 1:                     # gains near 1, shifts and biases near 0
            value = _normal(rng, *shape) * 0.3 + (1.0 if name.endswith("gamma") else 0.0)
        else:                                   # unit-scale activations: no saturated softmax,
            value = _normal(rng, *shape) * cfg.d_model ** -0.5   # whose tiny gradients FD can't resolve
        p[name[len(prefix):]] = value
    return p


def _cfg_from(s, pre_ln):
    """The stack's config: dropout ``s["p"]``, attention and ReLU dropout ``s["pa"]``."""
    d = s["h"] * s["dk"]
    return model.Config(src_vocab=s.get("v", 7), tgt_vocab=s.get("v", 7), n_layers=s["n"],
                        d_model=d, d_ff=s["f"], n_heads=s["h"], dropout=s.get("p", 0.0),
                        attention_dropout=s.get("pa", 0.0), relu_dropout=s.get("pa", 0.0),
                        pre_ln=pre_ln, max_len=64)


def _encoder(rng, s, pre_ln):
    cfg = _cfg_from(s, pre_ln)
    return {"x": _normal(rng, s["b"], s["s"], cfg.d_model), "mask": _lengths_mask(rng, s["b"], s["s"]),
            **_stack_params(rng, cfg, "enc.")}


def _run_encoder(a, s, pre_ln):
    cfg = _cfg_from(s, pre_ln)
    rng = backend.rng(5)                    # the same masks every call
    y, c = encoder.stack_forward(a["x"], a, a["mask"], cfg, rng)
    return y, lambda dy: _grads_of(encoder.stack_backward(dy, c), "x")


def _decoder(rng, s, pre_ln):
    cfg = _cfg_from(s, pre_ln)
    return {"x": _normal(rng, s["b"], s["t"], cfg.d_model),
            "memory": _normal(rng, s["b"], s["s"], cfg.d_model),
            "mask": _lengths_mask(rng, s["b"], s["s"]), **_stack_params(rng, cfg, "dec.")}


def _run_decoder(a, s, pre_ln):
    cfg = _cfg_from(s, pre_ln)
    rng = backend.rng(5)                    # the same masks every call
    self_mask = model.causal_mask(a["x"].shape[1], a["x"].dtype)
    y, c = decoder.stack_forward(a["x"], a["memory"], a, self_mask, a["mask"], cfg, rng)
    return y, lambda dy: _grads_of(decoder.stack_backward(dy, c), "x", "memory")


# loss

def _loss(rng, s):
    targets = _ids(rng, 0, s["v"], s["n"])
    targets[0] = 0 if s["n"] > 1 else targets[0]          # one padded row, when there are two
    return {"logits": _normal(rng, s["n"], s["v"]) * 3.0, "targets": targets}


def _run_loss(a, s, smoothing=0.1):
    (loss_sum, _), c = loss.forward(a["logits"].copy(), a["targets"], smoothing, pad_id=0)
    return loss_sum, lambda dl: _grads_of(loss.backward(dl, c), "logits")


ATTN_SIZES = dict(b=2, h=2, t=3, s=4, dk=3)
STACK_SIZES = dict(b=2, h=2, t=3, s=4, dk=2, f=5, n=2, p=0.0)

CASES = [
    Case("linear", _linear, _run_linear, dict(b=2, t=3, d=4, f=5)),
    Case("embedding", _embedding, _run_embedding, dict(b=2, t=6, v=5, d=4)),
    Case("positional", _x, _run_positional, dict(b=2, t=4, d=6)),
    Case("positional (learned)", _learned_positional, _run_learned_positional,
         dict(b=2, t=4, d=6)),
    Case("dropout", _x, _run_dropout, dict(b=2, t=4, d=5)),
    Case("layernorm", _layernorm, _run_layernorm, dict(b=2, t=3, d=5)),
    Case("feedforward", _feedforward, _run_feedforward, dict(b=2, t=3, d=4, f=6)),
    Case("feedforward (ReLU dropout)", _feedforward, _run_feedforward,
         dict(b=2, t=3, d=4, f=6, p=0.3)),
    Case("attention (padding mask)", _sdpa, _run_sdpa, ATTN_SIZES),
    Case("attention (causal mask)", lambda rng, s: _sdpa(rng, {**s, "s": s["t"]}),
         lambda a, s: _run_sdpa(a, s, causal=True), ATTN_SIZES),
    Case("attention (dropout)", _sdpa, _run_sdpa, {**ATTN_SIZES, "p": 0.3}),
    Case("multi-head self-attention", _self_attn, _run_self_attn, ATTN_SIZES),
    Case("multi-head self-attention (dropout)", _self_attn, _run_self_attn,
         {**ATTN_SIZES, "p": 0.3}),
    Case("multi-head cross-attention", _cross_attn, _run_cross_attn, ATTN_SIZES),
    Case("multi-head cross-attention (dropout)", _cross_attn, _run_cross_attn,
         {**ATTN_SIZES, "p": 0.3}),
    Case("residual + LN (post-LN)", _residual, lambda a, s: _run_residual(a, s, False),
         dict(b=2, t=3, d=4)),
    Case("residual + LN (pre-LN)", _residual, lambda a, s: _run_residual(a, s, True),
         dict(b=2, t=3, d=4)),
    Case("encoder stack (post-LN)", lambda r, s: _encoder(r, s, False),
         lambda a, s: _run_encoder(a, s, False), STACK_SIZES),
    Case("encoder stack (pre-LN)", lambda r, s: _encoder(r, s, True),
         lambda a, s: _run_encoder(a, s, True), STACK_SIZES),
    Case("decoder stack (post-LN)", lambda r, s: _decoder(r, s, False),
         lambda a, s: _run_decoder(a, s, False), STACK_SIZES),
    Case("decoder stack (pre-LN)", lambda r, s: _decoder(r, s, True),
         lambda a, s: _run_decoder(a, s, True), STACK_SIZES),
    Case("label-smoothed cross-entropy", _loss, _run_loss, dict(n=5, v=7)),
    Case("label-smoothed cross-entropy (no smoothing)", _loss,
         lambda a, s: _run_loss(a, s, 0.0), dict(n=5, v=7)),
]


# ---- the whole model ------------------------------------------------------------------------

def model_batch(rng, cfg: model.Config, batch: int, src_len: int, tgt_len: int):
    """Random (src, tgt) with padding on both sides; every sentence keeps at least one token."""
    xp = backend.xp
    first = max(cfg.pad_id, cfg.bos_id, cfg.eos_id) + 1
    src = rng.integers(first, cfg.src_vocab, size=(batch, src_len))
    tgt = rng.integers(first, cfg.tgt_vocab, size=(batch, tgt_len + 1))
    tgt[:, 0] = cfg.bos_id
    for b in range(batch):
        s, t = int(rng.integers(1, src_len + 1)), int(rng.integers(1, tgt_len + 1))
        src[b, s - 1], src[b, s:] = cfg.eos_id, cfg.pad_id
        tgt[b, t], tgt[b, t + 1:] = cfg.eos_id, cfg.pad_id
    src[0, -1], tgt[0, -1] = cfg.eos_id, cfg.eos_id     # one full-length row per side
    return backend.to_device(src, dtype=xp.int64), backend.to_device(tgt, dtype=xp.int64)


def check_model(cfg: model.Config, seed: int = 0, batch: int = 2, src_len: int = 4,
                tgt_len: int = 4) -> dict:
    """Gradient check of ``model.loss_and_grads`` over every parameter, in float64.

    With dropout (any of ``model.DROPOUTS``) the masks are fixed: every evaluation draws them
    from the same seed.
    """
    params = _stack_params(backend.host_rng(seed), cfg, "")
    src, tgt = model_batch(backend.host_rng(seed, 1), cfg, batch, src_len, tgt_len)

    def rng():
        return _dropout_rng(cfg, seed)

    _, grads = model.loss_and_grads(params, cfg, src, tgt, rng())

    def objective():
        return model.loss_and_grads(params, cfg, src, tgt, rng(), grads=False)[0]["loss"]

    return check_gradients(objective, grads, params)


def _dropout_rng(cfg, seed):
    """A new generator of the same masks every call when ``cfg`` has any dropout, else None."""
    return backend.rng(seed, 2) if any(getattr(cfg, name) for name in model.DROPOUTS) else None


def model_cases() -> list[tuple[str, model.Config]]:
    tiny = model.Config.preset("tiny")
    return [("model (post-LN)", tiny),
            ("model (pre-LN)", tiny.replace(pre_ln=True)),
            ("model (dropout, fixed mask)", tiny.replace(dropout=0.3)),
            ("model (attention and ReLU dropout, fixed masks)",
             tiny.replace(attention_dropout=0.3, relu_dropout=0.3)),
            ("model (separate embeddings)", tiny.replace(share_embeddings=False, tgt_vocab=9))]


# ---- the language model (lm.py) -------------------------------------------------------------

def lm_inputs(cfg: lm.LMConfig, seed: int = 0, batch: int = 2, length: int = 4):
    """``(params, x, y, rng)`` of :func:`check_lm`: random parameters, random blocks ``x`` and
    their next tokens ``y``, and a function giving the same dropout generator every call."""
    params = _stack_params(backend.host_rng(seed), cfg, "", lm.parameter_shapes(cfg))
    tokens = backend.host_rng(seed, 1).integers(0, cfg.vocab, size=(batch, length + 1))

    def rng():
        return _dropout_rng(cfg, seed)

    return params, tokens[:, :-1], tokens[:, 1:], rng


def lm_relu_margin(cfg: lm.LMConfig, seed: int = 0, batch: int = 2, length: int = 4) -> float:
    """The smallest |pre-activation| of any ReLU unit of :func:`check_lm`'s draw. Within about
    2 h |x| of 0 a difference quotient straddles the kink and means nothing: such a draw says
    nothing about the backward pass (tests skip it)."""
    params, x, _, rng = lm_inputs(cfg, seed, batch, length)
    _, cache = lm.forward(params, cfg, backend.to_device(x), rng())
    margin = math.inf
    for i, layer in enumerate(cache.stack.layers):
        first = layer.ff.sublayer.first                   # the linear layer before the ReLU
        pre = first.x @ first.w + params[f"layers.{i}.ff.b1"]                  # (B, T, d_ff)
        margin = min(margin, float(backend.xp.abs(pre).min()))
    return margin


def check_lm(cfg: lm.LMConfig, seed: int = 0, batch: int = 2, length: int = 4) -> dict:
    """Gradient check of ``lm.loss_and_grads`` over every parameter, in float64, on random
    blocks ``x`` and their next tokens ``y``; dropout masks fixed by the seed."""
    params, x, y, rng = lm_inputs(cfg, seed, batch, length)
    _, grads = lm.loss_and_grads(params, cfg, x, y, rng())

    def objective():
        return lm.loss_and_grads(params, cfg, x, y, rng(), grads=False)[0]["loss"]

    return check_gradients(objective, grads, params)


def lm_cases() -> list[tuple[str, lm.LMConfig]]:
    tiny = lm.LMConfig.preset("tiny")
    return [("language model (pre-LN)", tiny),
            ("language model (post-LN)", tiny.replace(pre_ln=False)),
            ("language model (learned positions)", tiny.replace(learned_positions=True)),
            ("language model (dropout, fixed mask)", tiny.replace(dropout=0.3)),
            ("language model (attention and ReLU dropout, fixed masks)",
             tiny.replace(attention_dropout=0.3, relu_dropout=0.3))]


# ---- command line ---------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minitfm.gradcheck", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("only", nargs="?", default="", help="check only cases whose name contains this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=TOLERANCE)
    parser.add_argument("--backend", default=None, help="numpy, cupy or auto (default: MINITFM_BACKEND)")
    args = parser.parse_args(argv)
    if args.backend:
        backend.use(args.backend)

    rows = [(c.name, lambda c=c: check_case(c, args.seed)) for c in CASES]
    rows += [(name, lambda cfg=cfg: check_model(cfg, args.seed)) for name, cfg in model_cases()]
    rows += [(name, lambda cfg=cfg: check_lm(cfg, args.seed)) for name, cfg in lm_cases()]
    rows = [r for r in rows if args.only.lower() in r[0].lower()]
    if not rows:
        print(f"no check matches {args.only!r}", file=sys.stderr)
        return 2
    width = max(len(name) for name, _ in rows)
    print(f"backend {backend.name}, float64 five-point central differences (h={STEP:g}), "
          f"tolerance {args.tolerance:g}\n")
    print(f"{'layer':<{width}}  {'worst relative error':>20}  {'worst input':<14} result")
    failed = 0
    for name, run in rows:
        errors = run()
        worst = max(errors, key=errors.get)
        ok = errors[worst] <= args.tolerance and all(math.isfinite(e) for e in errors.values())
        failed += not ok
        print(f"{name:<{width}}  {errors[worst]:>20.2e}  {worst:<14} {'pass' if ok else 'FAIL'}")
    print(f"\n{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
