"""The layer contract of minitfm/layers/__init__.py, held against the code: caches are named
tuples read by field name only, every layer's gradients carry the names its param_shapes
declares, and a layer's plain forward and backward hold the textbook's code alone (the choice
of a fast path made beside them, by minitfm.speed.policy), which is what float64 and ``--kernels
plain`` run."""

import ast
import importlib
import inspect
import re
import typing
from pathlib import Path

import numpy as np
import pytest

from minitfm.speed import fused, rows
from minitfm.gradcheck.cases import CASES
from minitfm.layers import (attention, decoder, dropout, embedding, encoder,
                            feedforward, inputs, layernorm, linear, loss, positional, residual)
from minitfm.speed import layernorm as fast_layernorm

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


# ---- the plain code: the textbook's alone, its fast paths chosen beside it -------------------

LAYER_MODULES = sorted(p.stem for p in (ROOT / "minitfm" / "layers").glob("*.py")
                       if p.stem != "__init__")
# what a plain pass must not read: the modules of the fast paths and of their choice (the choice
# is its chooser's: minitfm.speed.policy), a fast path itself, named for its kind ("_" aside), or the
# helpers that chose one inside the passes before
FAST_MODULES = ("fused", "rows", "mixed", "compiled")
FAST = re.compile(r"_?(fused|rows|loops|compiled|half)_")
CHOICES = ("_row_blocks", "_softmax_passes", "passes_for")
PASS = re.compile(r"(forward|backward|\w+_forward|\w+_backward)")


def choices_in(source: str) -> dict[str, list[str]]:
    """What chooses or runs a fast path in the body of each module-level function of ``source``
    named as a forward or backward pass and not as a fast path, its decorators aside:
    {function name: those names, in order}."""
    found = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.FunctionDef) and PASS.fullmatch(node.name)
                and not FAST.match(node.name)):
            continue
        names = []
        for sub in (n for statement in node.body for n in ast.walk(statement)):
            if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
                    and sub.value.id in FAST_MODULES):
                names.append(f"{sub.value.id}.{sub.attr}")
            name = sub.attr if isinstance(sub, ast.Attribute) else getattr(sub, "id", None)
            if isinstance(name, str) and (name in CHOICES or FAST.match(name)):
                names.append(name)
        found[node.name] = names
    return found


def fast_functions(module) -> dict:
    """The functions of a layer module that have fast paths beside them (their routes, put in
    their place by minitfm.speed.policy)."""
    return {name: f for name, f in vars(module).items()
            if callable(f) and hasattr(f, "plain") and hasattr(f, "chooser")
            and f.__module__ == module.__name__}


@pytest.mark.parametrize("name", LAYER_MODULES)
def test_plain_passes_hold_no_choice_of_path(name):
    source = (ROOT / "minitfm" / "layers" / f"{name}.py").read_text(encoding="utf-8")
    passes = choices_in(source)
    assert passes, f"layers/{name}.py has no forward or backward pass"
    chosen = {f: c for f, c in passes.items() if c}
    assert not chosen, (f"layers/{name}.py: {', '.join(chosen)} choose a path in their body "
                        f"({', '.join(sorted({c for cs in chosen.values() for c in cs}))}): move "
                        "the choice to a chooser (minitfm.speed.policy) beside the fast paths")
    module = importlib.import_module(f"minitfm.layers.{name}")
    for function in passes:             # the same function, read from the object: its body
        plain = getattr(module, function)
        plain = getattr(plain, "plain", plain)
        assert choices_in(inspect.getsource(plain).strip()) == {function: []}


def test_the_scan_reads_the_passes_and_skips_the_fast_paths():
    found = {name: choices_in((ROOT / "minitfm" / "layers" / f"{name}.py").read_text())
             for name in LAYER_MODULES}
    for name, function in [("layernorm", "forward"), ("attention", "sdpa_backward"),
                           ("loss", "forward_backward"), ("embedding", "backward"),
                           ("residual", "backward"), ("feedforward", "backward"),
                           ("linear", "forward"), ("dropout", "backward")]:
        assert function in found[name]
    assert "rows_forward" not in found["layernorm"] and "_fused_forward" not in found["dropout"]


@pytest.mark.parametrize("source, choices", [
    ("def forward(x):\n    if fused.active(x):\n        return x\n    return x",
     {"forward": ["fused.active"]}),
    ("def sdpa_backward(q):\n    if blocks := _row_blocks(q):\n        pass",
     {"sdpa_backward": ["_row_blocks"]}),
    ("def backward(s):\n    return softmax.passes_for(s)[1](s)", {"backward": ["passes_for"]}),
    ("def backward(dy, c):\n    if c.x.dtype == mixed.HALF:\n        return _half_backward(dy)",
     {"backward": ["mixed.HALF", "_half_backward"]}),
    ("def forward(x, f):\n    return fast_layernorm.rows_forward(f) if _rows_apply(x, f) else f",
     {"forward": ["_rows_apply", "rows_forward"]}),
    ("@paths.fast\ndef forward(x):\n    return x\n\ndef _forward_path(x):\n"
     "    return f if rows.active(x) else None", {"forward": []}),
    ("def rows_forward(x):\n    return rows.compiled(x)", {}),
    ("def _half_backward(x):\n    return mixed.enabled(x)", {}),
], ids=["fused.active", "_row_blocks", "passes_for", "mixed.HALF", "a row pass", "a chooser",
        "a row pass's own", "a float16 variant's own"])
def test_the_scan_finds_choices_in_plain_passes_alone(source, choices):
    assert choices_in(source) == choices


@pytest.mark.parametrize("name", LAYER_MODULES)
def test_every_fast_path_has_a_chooser_of_the_plain_arguments(name):
    module = importlib.import_module(f"minitfm.layers.{name}")
    for function, wrapper in fast_functions(module).items():
        assert wrapper.chooser is not None, f"{name}.{function}: no chooser registered"
        assert (inspect.signature(wrapper.chooser).parameters.keys()
                == inspect.signature(wrapper.plain).parameters.keys()), f"{name}.{function}"


@pytest.fixture
def choices_seen():
    """Every path the layers' choosers pick from now on: (module.function, the fast function or
    None), in call order; the choosers put back afterwards."""
    seen, real = [], {}
    for name in LAYER_MODULES:
        for function, wrapper in fast_functions(importlib.import_module(
                f"minitfm.layers.{name}")).items():
            real[wrapper] = choose = wrapper.chooser

            def spy(*args, _choose=choose, _name=f"{name}.{function}", **kwargs):
                seen.append((_name, _choose(*args, **kwargs)))
                return seen[-1][1]
            wrapper.chooser = spy
    yield seen
    for wrapper, choose in real.items():
        wrapper.chooser = choose


@pytest.mark.parametrize("dtype, kernels", [(np.float64, "fused"), (np.float32, "plain")],
                         ids=["float64 with the row passes on", "float32, --kernels plain"])
def test_float64_and_plain_kernels_run_the_plain_code(numpy_backend, choices_seen, dtype,
                                                      kernels):
    """Every layer case of the gradient checks, forward and backward: each layer call runs its
    plain code, in float64 whatever ``--kernels`` says (the row passes on for every size, their
    compiled loops too), and in float32 under ``--kernels plain``."""
    fused.use("plain")
    rows.use(kernels == "fused", 2, min_bytes=0, compiled=True)
    for case in CASES:
        arrays = {k: a.astype(dtype) if a.dtype.kind == "f" else a
                  for k, a in case.draw(np.random.default_rng(4), case.sizes).items()}
        out, cache = case.forward(arrays, case.sizes)
        case.backward(np.ones_like(out), cache)
    if dtype == np.float64:         # the policy answers before any chooser is asked, but for
        # the dropout mask's numbers (no array to read a type from), which its compiled loop
        # draws as the plain code does
        assert {name for name, _ in choices_seen} <= {"dropout.keep_mask"}
        choices_seen[:] = []
    else:
        assert {name for name, _ in choices_seen} >= {
            "layernorm.forward", "layernorm.backward", "linear.forward", "linear.backward",
            "attention.sdpa_forward", "softmax.backward", "residual.backward",
            "dropout.forward", "loss.forward_backward", "embedding.backward",
            "feedforward.backward"}
    fast = sorted({name for name, path in choices_seen if path is not None})
    assert not fast, f"fast paths chosen: {fast}"


def test_the_spy_sees_fast_paths_where_they_run(numpy_backend, choices_seen):
    rows.use(True, 1, min_bytes=0, compiled=False)
    x = np.random.default_rng(5).standard_normal((4, 8, 16)).astype(np.float32)
    p = {"gamma": np.ones(16, np.float32), "beta": np.zeros(16, np.float32)}
    y, cache = layernorm.forward(x, p)
    layernorm.backward(y, cache)
    # its one block runs the plain code, the policy answering without a chooser
    assert choices_seen == [("layernorm.forward", fast_layernorm.rows_forward),
                            ("layernorm.backward", fast_layernorm.rows_backward)]
