"""The layer contract of minitfm/layers/__init__.py, held against the code: caches are named
tuples read by field name only, and every layer's gradients carry the names its param_shapes
declares."""

import re
import typing
from pathlib import Path

import numpy as np
import pytest

from minitfm.gradcheck.cases import CASES
from minitfm.layers import (attention, decoder, dropout, embedding, encoder,
                            feedforward, inputs, layernorm, linear, loss, positional, residual)

ROOT = Path(__file__).resolve().parents[2]

# a name that holds a cache: "cache", "c_ln", "cache2", "enc_cache", "c3"
_CACHE = r"(?:\w*cache\w*|c_\w+|c\d+)"
POSITIONAL_READS = [
    re.compile(rf"\b{_CACHE}\s*\[\s*-?\d"),                            # cache[1], c_sub[1]
    re.compile(rf"^\s*\*?\w+(?:\s*,\s*\*?\w+)+\s*,?\s*=\s*{_CACHE}\s*(?:#.*)?$"),  # a, b = cache
    re.compile(r"\b(?:backward|forward)\([^()]*(?:\([^()]*\)[^()]*)*\)\s*\[\s*[1-9]"),  # f(...)[1]
]


def positional_cache_reads(text: str) -> list[tuple[int, str]]:
    """The lines of ``text`` that read a cache by position: (line number, line)."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)
            if any(p.search(line) for p in POSITIONAL_READS)]


def test_no_cache_is_read_by_position():
    files = sorted([*ROOT.glob("minitfm/**/*.py"), *ROOT.glob("tests/**/*.py"),
                    *ROOT.glob("benchmarks/*.py"), *ROOT.glob("*.py")])
    assert len(files) > 40
    this = Path(__file__).resolve()
    found = [f"{path.relative_to(ROOT)}:{n}: {line}" for path in files if path.resolve() != this
             for n, line in positional_cache_reads(path.read_text(encoding="utf-8"))]
    assert not found, "caches read by position instead of by field name:\n" + "\n".join(found)


@pytest.mark.parametrize("line", [
    "    a = cache2[0]",
    "    c_att = c_sub[1] if sublayer == 'self' else c_sub[2]",
    "    return c_att[3]",
    "    q, k, v, p, scale = cache",
    "    c_ln, c_sub, c_drop, pre_ln = cache",
    "    c1, c2, c3 = cache",
    "    dy, dmemory, g_dec = decoder.stack_backward(dh.reshape(b, t, d), c_tgt[1])",
    '    return embedding.backward(dx, c_emb)[1]["table"]',
    "    caches, c_ln = cache",
])
def test_the_scan_catches_positional_reads(line):
    assert positional_cache_reads(line)


@pytest.mark.parametrize("line", [
    "    xhat, rstd, gamma = cache.xhat, cache.rstd, cache.gamma",
    "    dx, g_ff, g_ln3 = residual.backward(dy, cache.ff, feedforward.backward)",
    "    y, c = linear.forward(x, p)",
    "    x = residual.step(x, lambda h: feedforward.forward(h, ff)[0], ln, pre_ln)",
    "    dy, g = layer_backward(dy, cache.layers[i])",
])
def test_the_scan_passes_reads_by_name(line):
    assert not positional_cache_reads(line)


CACHE_TYPES = [linear.Cache, embedding.Cache, positional.LearnedCache, dropout.Cache,
               inputs.Cache, layernorm.Cache, feedforward.Cache, attention.SdpaCache,
               attention.SelfCache, attention.CrossCache, residual.Cache,
               encoder.LayerCache, encoder.StackCache, decoder.LayerCache, decoder.StackCache,
               loss.Cache]


@pytest.mark.parametrize("cache_type", CACHE_TYPES, ids=lambda t: f"{t.__module__}.{t.__name__}")
def test_caches_are_named_tuples(cache_type):
    assert issubclass(cache_type, tuple) and cache_type._fields
    assert set(typing.get_type_hints(cache_type)) == set(cache_type._fields)


def _random(shapes, rng):
    return {k: rng.standard_normal(s) for k, s in shapes.items()}


@pytest.mark.parametrize("layer,shapes,inputs", [
    (linear, linear.param_shapes(4, 3), 1),
    (layernorm, layernorm.param_shapes(4), 1),
    (feedforward, feedforward.param_shapes(4, 6), 1),
], ids=["linear", "layernorm", "feedforward"])
def test_backward_returns_inputs_then_grads_named_like_params(layer, shapes, inputs):
    rng = np.random.default_rng(0)
    p = _random(shapes, rng)
    x = rng.standard_normal((2, 3, 4))
    y, cache = layer.forward(x, p)
    *d_inputs, grads = layer.backward(np.ones_like(y), cache)
    assert len(d_inputs) == inputs and d_inputs[0].shape == x.shape
    assert list(grads) == list(shapes)
    assert all(grads[k].shape == shapes[k] for k in shapes)


def test_attention_grads_are_named_like_params():
    rng = np.random.default_rng(1)
    x, memory = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4))
    for shapes, run in [
        (attention.self_param_shapes(4), lambda p: attention.self_forward(x, p, None, 2)),
        (attention.cross_param_shapes(4), lambda p: attention.cross_forward(x, memory, p, None, 2)),
    ]:
        p = _random(shapes, rng)
        y, cache = run(p)
        back = attention.self_backward if len(shapes) == 4 else attention.cross_backward
        *d_inputs, grads = back(np.ones_like(y), cache)
        assert [d.shape for d in d_inputs] == [x.shape, memory.shape][:len(d_inputs)]
        assert list(grads) == list(shapes)
        assert all(grads[k].shape == shapes[k] for k in shapes)


STACK_CASES = [c for c in CASES if "stack" in c.name]


@pytest.mark.parametrize("case", STACK_CASES, ids=lambda c: c.name)
def test_stacks_return_a_gradient_for_every_declared_parameter(case):
    sizes = {**case.sizes, "p": 0.25}
    declared = case.params(sizes)
    arrays = case.draw(np.random.default_rng(2), sizes)
    out, cache = case.forward(arrays, sizes)
    grads = case.gradients(case.backward(np.ones_like(out), cache))
    assert set(grads) - {"x", "memory"} == set(declared)


# ---- the gradient rule: out= is overwritten, except by the embedding, which adds -------------

PARAMETER_CASES = [c for c in CASES if c.params is not None]
ACCUMULATING = ("embedding", "inputs")    # embedding.backward adds into out["table"], and
                                          # inputs.backward is it


def test_every_parameter_layer_is_checked_against_the_rule():
    names = " ".join(c.name for c in PARAMETER_CASES)
    for layer in ["linear", "embedding", "positional (learned)", "inputs", "layernorm",
                  "feedforward", "self-attention", "cross-attention", "residual", "encoder stack",
                  "decoder stack", "decoder-only stack"]:
        assert layer in names


@pytest.mark.parametrize("case", PARAMETER_CASES, ids=lambda c: c.name)
def test_backward_overwrites_out_and_returns_it(case):
    """With ``out`` (holding stale values), a parameter layer's backward writes its gradients
    into those very arrays and returns them: the values equal a fresh backward's. The embedding
    adds its gradient to what ``out["table"]`` holds."""
    sizes = dict(case.sizes)
    arrays = case.draw(np.random.default_rng(4), sizes)
    out, cache = case.forward(arrays, sizes)
    dout = np.random.default_rng(5).standard_normal(np.shape(out))
    fresh = case.gradients(case.backward(dout, cache))
    _, cache = case.forward(arrays, sizes)         # a new cache: backward may work in place
    shapes = case.params(sizes)
    buffers = {name: np.full(shape, 7.0) for name, shape in shapes.items()}
    written = case.gradients(case.backward(dout, cache, buffers))
    for name in shapes:
        assert written[name] is buffers[name] or np.shares_memory(written[name], buffers[name])
        adds = name == "table" and case.name.startswith(ACCUMULATING)
        expected = fresh[name] + 7.0 if adds else fresh[name]
        np.testing.assert_allclose(buffers[name], expected, rtol=1e-12, atol=1e-12, err_msg=name)


def test_sub_layers_do_not_cache_their_output():
    """The in-place rule: residual adds into the sub-layer's output, so no cache may hold it."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4))
    outputs = [
        linear.forward(x, _random(linear.param_shapes(4, 4), rng)),
        feedforward.forward(x, _random(feedforward.param_shapes(4, 5), rng)),
        layernorm.forward(x, _random(layernorm.param_shapes(4), rng)),
        attention.self_forward(x, _random(attention.self_param_shapes(4), rng), None, 2),
        attention.cross_forward(x, x, _random(attention.cross_param_shapes(4), rng), None, 2),
    ]

    def arrays(nest):
        if isinstance(nest, np.ndarray):
            yield nest
        elif isinstance(nest, (tuple, list)):
            for item in nest:
                yield from arrays(item)

    for y, cache in outputs:
        assert not any(np.shares_memory(y, a) for a in arrays(cache))
