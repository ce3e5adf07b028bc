"""Finite-difference gradient checks for every layer and for the whole model.

For a layer y = f(x, params) we check its backward pass on the scalar L = sum(G * y), with G a
fixed random array (so every output element matters, each with its own weight). The analytic
gradient is ``backward(G, cache)``; the numerical one perturbs each input element in turn:

    dL/dx_i ~ (-L(x_i + 2h) + 8 L(x_i + h) - 8 L(x_i - h) + L(x_i - 2h)) / (12 h)

five-point central differences in float64, error O(h^4), and the two are compared by the
relative error

    ||analytic - numeric|| / max(||analytic||, ||numeric||)

which must not exceed 1e-6 (typical values here are 1e-10 to 1e-8).

The step balances truncation, O(h^4), large for strongly curved functions (a LayerNorm over
three features), against rounding, O(eps |L| / h), large for gradients much smaller than L:
h = 2e-5 keeps both near 1e-9 for almost every array. A ReLU's kink at 0 needs a small h (a
quotient whose points straddle it means nothing); an array whose gradient is ~1e-6 of L (a
LayerNorm shift deep in a stack) needs a large one. So an array whose error exceeds the tolerance
at 2e-5 is measured again at 1e-4 (against rounding), then at 4e-6 (against a kink), and its
smallest error counts; a wrong backward pass fails at every step (the checker's own tests hold it
to that). Rounding is also why inputs keep activations at unit scale, and why attention is drawn
with d_model >= 2: a saturated softmax has gradients so small next to L that no h resolves them.

    python -m minitfm.gradcheck              # every layer and the whole models, as a table
    python -m minitfm.gradcheck layernorm    # the cases whose name contains "layernorm"

The cases are rows of one table (:class:`Case`: sizes, inputs, forward, backward, tolerance):
``CASES`` for the layers, ``MODEL_CASES`` for the whole models. A new layer adds one row. Exit
status 1 if any check fails, 2 for a bad option (minitfm/exits.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import Callable

from minitfm import backend, exits
from minitfm.cli import UsageError, add_backend_option, report_errors, select_backend
from minitfm.options import integer, number
from minitfm.layers import (attention, decoder, decoder_only, dropout, embedding, encoder,
                            feedforward, inputs, layernorm, linear, loss, output, positional,
                            residual)
from minitfm.models import DROPOUTS, lm, translator

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
    return 0.0 if scale == 0.0 else float(xp.linalg.norm(a - n)) / scale


def numerical_gradient(objective: Callable[[], float], x, step: float = STEP):
    """Five-point central differences (module docstring) of ``objective()`` with respect to
    every element of ``x``, perturbed in place."""
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
    """Relative error of each of ``analytic`` against finite differences of ``objective()``,
    which reads ``arrays`` (perturbed in place), at each of ``steps`` until one is within
    ``tolerance`` (see the module docstring); the smallest counts."""
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
    """A row of the table. ``arrays``: the inputs by name, each drawn from a spec ("b t d":
    N(0, 1) of that shape, "hd" = h * dk, "kv" the keys; "ids v: b t": ids below v; "mask: b s":
    key padding) or by ``arrays(rng, sizes)``; ``params(sizes)``: parameter shapes, matrices times
    ``scale`` (a number, a function of the sizes, or "stack": ``random_params``); ``backward(dout,
    cache[, out])``, ``out`` as in the gradient rule of layers/__init__.py; ``d_inputs``: whose
    gradients backward returns first (None: token ids, which have none)."""

    name: str
    sizes: dict
    arrays: dict | Callable
    params: Callable | None
    forward: Callable
    backward: Callable
    d_inputs: tuple = ("x",)
    scale: float | str | Callable = 1.0
    tolerance: float = TOLERANCE
    cfg: object = None                  # a whole model's config (its rows' arrays: "a", "b")

    def draw(self, rng, sizes: dict) -> dict:      # in a fixed order: inputs, then parameters
        arrays = (self.arrays(rng, sizes) if callable(self.arrays)
                  else {name: _draw(rng, sizes, spec) for name, spec in self.arrays.items()})
        shapes = self.params(sizes) if self.params is not None else {}
        if self.scale == "stack":
            return {**arrays, **random_params(rng, shapes, sizes["h"] * sizes["dk"])}
        scale = self.scale(sizes) if callable(self.scale) else self.scale
        return {**arrays, **{name: _normal(rng, *shape) * (scale if len(shape) == 2 else 1.0)
                             for name, shape in shapes.items()}}

    def gradients(self, result) -> dict:          # backward's result, keyed like the arrays
        *d_inputs, grads = result
        assert len(d_inputs) == len(self.d_inputs), "one name per gradient of an input"
        return {**{n: d for n, d in zip(self.d_inputs, d_inputs) if n is not None}, **grads}


def check_case(case: Case, seed: int = 0, sizes: dict | None = None) -> dict:
    """Run one case in float64; return the relative error of every checked input."""
    rng = backend.host_rng(seed)
    sizes = {**case.sizes, **(sizes or {})}
    arrays = case.draw(rng, sizes)
    out, cache = case.forward(arrays, sizes)
    g = backend.to_device(rng.standard_normal(out.shape), dtype="float64")   # dL/dout = G

    def objective():
        y, _ = case.forward(arrays, sizes)
        return float((y * g).sum())

    return check_gradients(objective, case.gradients(case.backward(g, cache)), arrays,
                           tolerance=case.tolerance)


# ---- drawing inputs ---------------------------------------------------------------------------

def _normal(rng, *shape):
    return backend.to_device(rng.standard_normal(shape), dtype="float64")


def _draw(rng, s: dict, spec: str):
    kind, _, dims = spec.rpartition(":")
    alias = {"hd": ("h", "dk"), "kv": ("t" if s.get("causal") else "s",)}   # width; keys
    shape = [math.prod(s[n] for n in alias.get(k, (k,))) for k in dims.split()]
    if kind == "mask":                  # additive key padding, at least one visible key per row
        xp = backend.xp
        lengths = backend.to_device(rng.integers(1, shape[1] + 1, size=shape[0]))
        pad = xp.arange(shape[1])[None, :] >= lengths[:, None]                   # (B, L)
        return xp.where(pad, attention.MASKED, 0.0)[:, None, None, :]
    if kind:                            # "ids v"
        return backend.to_device(rng.integers(0, s[kind.split()[1]], size=shape), dtype="int64")
    return _normal(rng, *shape)


def random_params(rng, shapes: dict, d_model: int) -> dict:
    """Random values, gains near 1, shifts and biases near 0, unit-scale activations."""
    return {name: (_normal(rng, *shape) * 0.3 + name.endswith("gamma") if len(shape) == 1
                   else _normal(rng, *shape) * d_model ** -0.5) for name, shape in shapes.items()}


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
    targets = _draw(rng, s, "ids v: n")
    targets[0] = 0 if s["n"] > 1 else targets[0]          # one padded row, when there are two
    return {"logits": _normal(rng, s["n"], s["v"]) * 3.0, "targets": targets}


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


FEEDFORWARD = Case("feedforward", dict(b=2, t=3, d=4, f=6), {"x": "b t d"},
                   lambda s: feedforward.param_shapes(s["d"], s["f"]),
                   lambda a, s: feedforward.forward(a["x"], a, s.get("p", 0.0), _rng()),
                   feedforward.backward)
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
    Case("positional (learned)", dict(b=2, t=4, d=6), {"x": "b t d"},  # t + 5 rows, 2.. read
         lambda s: positional.learned_param_shapes(s["t"] + 5, s["d"]),
         lambda a, s: positional.learned_forward(a["x"], a, offset=2),
         positional.learned_backward),
    Case("dropout", dict(b=2, t=4, d=5), {"x": "b t d"}, None,
         lambda a, s: dropout.forward(a["x"], 0.3, _rng()), dropout.backward),
    Case("inputs (embedding, learned positions, dropout)", dict(b=2, t=4, v=6, d=4),
         {"ids": "ids v: b t"}, lambda s: inputs.param_shapes(s["v"], s["d"], s["t"] + 3),
         lambda a, s: inputs.forward(a["ids"], a, 0.3, _rng(), offset=1), inputs.backward,
         (None,)),
    Case("layernorm", dict(b=2, t=3, d=5), {"x": "b t d"},
         lambda s: layernorm.param_shapes(s["d"]),
         lambda a, s: layernorm.forward(a["x"], a), layernorm.backward),
    FEEDFORWARD, _also(FEEDFORWARD, "feedforward (ReLU dropout)", p=0.3),
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


def _model(name: str, model, cfg, draw_batch, **sizes) -> Case:
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
                                                              relu_dropout=0.3))]
MODEL_CASES = [
    *[_model(f"model ({name})", translator, translator.PRESETS["tiny"].replace(**change),
             translation_batch, batch=2, src_len=4, tgt_len=4)
      for name, change in [("post-LN", {}), ("pre-LN", dict(pre_ln=True)), *_DROPOUTS,
                           ("separate embeddings", dict(share_embeddings=False, tgt_vocab=9))]],
    *[_model(f"language model ({name})", lm, lm.PRESETS["tiny"].replace(**change), lm_batch,
             batch=2, length=4)
      for name, change in [("pre-LN", {}), ("post-LN", dict(pre_ln=False)),
                           ("learned positions", dict(learned_positions=True)), *_DROPOUTS]],
]


# ---- command line ---------------------------------------------------------------------------

def main(argv=None) -> int:
    args = parse_args(argv)
    return report_errors(lambda: run(args))


def parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m minitfm.gradcheck", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("only", nargs="?", default="", help="check only cases whose name contains this")
    parser.add_argument("--seed", type=integer(0), default=0, help="seeds the inputs (default 0)")
    parser.add_argument("--tolerance", type=number(0, low_open=True), default=TOLERANCE,
                        help=f"the largest relative error that passes (default {TOLERANCE:g})")
    add_backend_option(parser, "numpy")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    """The checks as ``args`` say: 0 when all pass, 1 (a run-time failure) when one fails."""
    select_backend(args.backend, "numpy")

    rows = [c for c in CASES + MODEL_CASES if args.only.lower() in c.name.lower()]
    if not rows:
        raise UsageError(f"no check matches {args.only!r}")
    width = max(len(c.name) for c in rows)
    print(f"backend {backend.name}, float64 five-point central differences (h={STEP:g}), "
          f"tolerance {args.tolerance:g}\n")
    print(f"{'layer':<{width}}  {'worst relative error':>20}  {'worst input':<14} result")
    failed = 0
    for case in rows:
        errors = check_case(case, args.seed)
        worst = max(errors, key=errors.get)
        ok = errors[worst] <= args.tolerance and all(math.isfinite(e) for e in errors.values())
        failed += not ok
        result = "pass" if ok else "FAIL"
        print(f"{case.name:<{width}}  {errors[worst]:>20.2e}  {worst:<14} {result}")
    print(f"\n{len(rows) - failed} passed, {failed} failed")
    return exits.FAILED if failed else exits.DONE


if __name__ == "__main__":
    sys.exit(main())
