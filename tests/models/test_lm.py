"""The decoder-only language model: gradients, causality, the cached step, generation, checks."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minitfm import backend, flat
from minitfm.decoding import generation, sampling
from minitfm.gradcheck.check import TOLERANCE, check_case, random_params
from minitfm.gradcheck.cases import MODEL_CASES
from minitfm.models import DROPOUTS, lm
from tests.models import every_run_but_dropout

TINY = lm.LMConfig.preset("tiny")
VARIANTS = {"pre-LN": TINY, "post-LN": TINY.replace(pre_ln=False),
            "learned positions": TINY.replace(learned_positions=True)}


@pytest.fixture(autouse=True)
def _numpy(numpy_backend):
    yield


def _params(cfg, seed=0):
    """Random (not initial) float64 parameters, so that LayerNorm gains and biases matter."""
    return random_params(backend.host_rng(seed), lm.parameter_shapes(cfg), cfg.d_model)


def _tokens(cfg, seed, batch, length):
    return np.random.default_rng(seed).integers(0, cfg.vocab, size=(batch, length))


# ---- gradients ----------------------------------------------------------------------------

LM_CASES = [c for c in MODEL_CASES if c.name.startswith("language model (")]
BLOCKS = dict(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 3), length=st.integers(1, 5))


RELU_MARGIN = 2e-3     # no ReLU unit this close to its kink: the difference quotient straddles it
KINK_SEED = 709        # a draw (1 block of 5) with a ReLU unit of layer 0 4.5e-6 from its kink


def relu_margin(case, seed, **sizes) -> float:
    """The smallest |pre-activation| of any ReLU unit of the case's draw. Within about 2 h |x|
    of 0 a difference quotient straddles the kink and means nothing: such a draw says nothing
    about the backward pass (the tests skip it)."""
    arrays = case.draw(backend.host_rng(seed), {**case.sizes, **sizes})
    params = {k: arrays[k] for k in lm.parameter_names(case.cfg)}
    dropout = backend.rng(2) if any(getattr(case.cfg, n) for n in DROPOUTS) else None
    _, cache = lm.forward(params, case.cfg, backend.to_device(arrays["a"]), dropout)
    margin = np.inf
    for i, layer in enumerate(cache.stack.layers):
        first = layer.ff.sublayer.first                   # the linear layer before the ReLU
        pre = first.x @ first.w + params[f"layers.{i}.ff.b1"]                  # (B, T, d_ff)
        margin = min(margin, float(np.abs(pre).min()))
    return margin


def check_lm(case, seed, batch, length, directions=None):
    assume(relu_margin(case, seed, batch=batch, length=length) > RELU_MARGIN)
    errors = check_case(case, seed, dict(batch=batch, length=length), directions=directions)
    assert set(errors) == set(lm.parameter_names(case.cfg))     # every parameter is checked
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOLERANCE, f"{case.name}: {worst} {errors[worst]:.2e}"


@pytest.mark.parametrize("case", every_run_but_dropout(LM_CASES))
@settings(max_examples=1)
@given(**BLOCKS)
def test_lm_gradients_match_finite_differences(case, seed, batch, length):
    """Every parameter along three random directions (element by element: the slow test)."""
    check_lm(case, seed, batch, length, directions=3)


@pytest.mark.slow
@pytest.mark.parametrize("case", LM_CASES, ids=lambda c: c.name)
@settings(max_examples=3)
@given(**BLOCKS)
def test_lm_gradients_many_batches(case, seed, batch, length):
    """Element by element on three batches a case; ten more along random directions below."""
    check_lm(case, seed, batch, length)


@pytest.mark.slow
@pytest.mark.parametrize("case", LM_CASES, ids=lambda c: c.name)
@settings(max_examples=10)
@given(**BLOCKS)
def test_lm_gradients_many_batches_along_directions(case, seed, batch, length):
    check_lm(case, seed, batch, length, directions=3)


def test_the_kink_check_finds_the_draw_that_straddles_a_relu():
    """A draw with a ReLU unit next to its kink (found by searching the seeds): the difference
    quotient of that layer's w1 misses the analytic gradient there (by 1.4e-3), and the margin
    says so. (The whole model at random seeds is the test above.)"""
    case = LM_CASES[0]
    assert relu_margin(case, KINK_SEED, batch=1, length=5) < RELU_MARGIN
    errors = check_case(case, KINK_SEED, dict(batch=1, length=5), ["layers.0.ff.w1"])
    assert errors["layers.0.ff.w1"] > TOLERANCE
    assert relu_margin(case, 2, batch=2, length=4) > RELU_MARGIN          # an ordinary draw


def test_gradient_accumulation_is_exact():
    """Two halves of a batch, each normalised by the whole batch's count, sum to the batch."""
    params = _params(TINY, 1)
    tokens = _tokens(TINY, 2, 4, 7)
    x, y = tokens[:, :-1], tokens[:, 1:]
    whole, g_whole = lm.loss_and_grads(params, TINY, x, y)
    total = lm.batch_tokens((x, y), TINY)
    assert total == whole["tokens"] == 24
    halves = [lm.loss_and_grads(params, TINY, x[i:i + 2], y[i:i + 2], normalizer=total)
              for i in (0, 2)]
    assert sum(s["loss"] for s, _ in halves) == pytest.approx(whole["loss"], rel=1e-12)
    for name in g_whole:
        np.testing.assert_allclose(halves[0][1][name] + halves[1][1][name], g_whole[name],
                                   rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradients_written_into_given_arrays_overwrite_them(variant):
    cfg = VARIANTS[variant]
    params = _params(cfg, 9)
    tokens = _tokens(cfg, 9, 2, 6)
    _, fresh = lm.loss_and_grads(params, cfg, tokens[:, :-1], tokens[:, 1:])
    out = flat.zeros_like(params)
    out.buffer[...] = 7.0                                   # stale values from an earlier step
    _, written = lm.loss_and_grads(params, cfg, tokens[:, :-1], tokens[:, 1:], out=out)
    assert written is out
    for name in fresh:
        np.testing.assert_array_equal(out[name], fresh[name])


def test_loss_is_the_mean_next_token_nll():
    cfg = lm.LMConfig(vocab=30, n_layers=2, d_model=32, d_ff=64, n_heads=4, max_len=16)
    params = lm.init_params(cfg, 0, dtype=np.float64)
    tokens = _tokens(cfg, 3, 3, 9)
    x, y = tokens[:, :-1], tokens[:, 1:]
    stats, _ = lm.loss_and_grads(params, cfg, x, y, grads=False)
    h, _ = lm.forward(params, cfg, x)
    z = lm.logits(params, cfg, h)                                         # (B, T, V)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, y[..., None], -1).mean()
    assert stats["loss"] == stats["nll"] == pytest.approx(nll, rel=1e-12)
    assert stats["tokens"] == 24


# ---- causality and the cached step --------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
@settings(max_examples=10)
@given(seed=st.integers(0, 2**31 - 1), t=st.integers(0, 6))
def test_future_tokens_never_change_earlier_outputs(variant, seed, t):
    cfg = VARIANTS[variant]
    params = _params(cfg, seed % 5)
    x = _tokens(cfg, seed, 2, 8)
    h, _ = lm.forward(params, cfg, x)
    changed = x.copy()
    changed[:, t + 1:] = (changed[:, t + 1:] + 1 + seed % 7) % cfg.vocab  # every later token
    h2, _ = lm.forward(params, cfg, changed)
    np.testing.assert_array_equal(h2[:, :t + 1], h[:, :t + 1])
    assert not np.allclose(h2[:, t + 1:], h[:, t + 1:])


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_step_equals_the_full_forward_pass(variant):
    cfg = VARIANTS[variant].replace(d_model=12, n_heads=3)
    params = _params(cfg, 4)
    x = _tokens(cfg, 5, 3, cfg.max_len)
    full = lm.logits(params, cfg, lm.forward(params, cfg, x)[0])         # (R, L, V)
    cache = lm.init_cache(cfg, 3, np.float64)
    for t in range(cfg.max_len):
        np.testing.assert_allclose(lm.step(params, cfg, cache, x[:, t], t), full[:, t],
                                   rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="outside the cache of 16 positions"):
        lm.step(params, cfg, cache, x[:, 0], cfg.max_len)


# ---- generation ---------------------------------------------------------------------------

def _recomputed(params, cfg, prompt, n, seed, greedy=False, **settings):
    """Reference generation: the whole window recomputed for every token, no cache."""
    generator = backend.rng(seed)
    context, out = np.asarray(prompt)[None, -cfg.max_len:], []
    for _ in range(n):
        z = lm.logits(params, cfg, lm.forward(params, cfg, context)[0][:, -1])   # (1, V)
        token = sampling.greedy(z) if greedy else sampling.sample(z, generator, **settings)
        out.append(int(token[0]))
        context = np.concatenate([context, token[:, None]], axis=1)
        if context.shape[1] > cfg.max_len:
            context = context[:, -(cfg.max_len // 2):]
    return out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("settings_", [dict(greedy=True), dict(temperature=0.8),
                                       dict(temperature=1.3, top_k=4, top_p=0.9)],
                         ids=["greedy", "temperature", "top-k-top-p"])
def test_cached_generation_equals_recomputing_the_prefix(variant, settings_):
    """40 tokens from a context of 16 positions: the cache is also rebuilt on the way."""
    cfg = VARIANTS[variant]
    params = _params(cfg, 6)
    prompt = [1, 5, 2]
    tokens = [int(t[0]) for t in generation.generate(params, cfg, prompt, 40, seed=3, **settings_)]
    assert tokens == _recomputed(params, cfg, prompt, 40, seed=3, **settings_)


def test_generation_is_reproducible_from_the_seed():
    params = _params(TINY, 7)

    def run(seed):
        return np.concatenate(list(generation.generate(params, TINY, [[1, 2], [3, 4]], 30, seed=seed,
                                               temperature=1.5)))

    assert np.array_equal(run(11), run(11))
    assert not np.array_equal(run(11), run(12))
    assert run(11).shape == (60,)        # two rows, 30 steps


def test_generation_checks_its_arguments_at_the_call():
    params = _params(TINY, 8)
    with pytest.raises(ValueError, match="temperature"):
        generation.generate(params, TINY, [1], 5, temperature=0.0)
    with pytest.raises(ValueError, match="top_k"):
        generation.generate(params, TINY, [1], 5, top_k=TINY.vocab + 1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generation.generate(params, TINY, [TINY.vocab], 5)
    with pytest.raises(ValueError, match="at least one"):
        generation.generate(params, TINY, np.zeros((1, 0), dtype=np.int64), 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generation.generate(params, TINY, [1], -1)
    assert list(generation.generate(params, TINY, [1], 0)) == []


# ---- configuration and input checks -------------------------------------------------------

def test_parameter_names_and_shapes():
    shapes = lm.parameter_shapes(TINY.replace(learned_positions=True))
    assert list(shapes)[:2] == ["emb", "pos_emb"]
    assert shapes["emb"] == (11, 8) and shapes["pos_emb"] == (16, 8)
    assert shapes["layers.1.attn.w_qkv"] == (8, 24) and shapes["layers.ln.gamma"] == (8,)
    assert "layers.ln.gamma" not in lm.parameter_shapes(TINY.replace(pre_ln=False))
    params = lm.init_params(TINY.replace(learned_positions=True), 0)
    assert float(np.abs(params["pos_emb"]).max()) < 0.2          # small at first
    assert params["emb"].dtype == backend.float_dtype()


@pytest.mark.parametrize("fields,message", [
    (dict(d_model=10, n_heads=4), "divisible"),
    (dict(vocab=0), "vocab"),
    (dict(max_len=True), "max_len"),
    (dict(dropout=1.0), "dropout"),
    (dict(attention_dropout=1.0), "attention_dropout"),
    (dict(relu_dropout=-0.5), "relu_dropout"),
    (dict(word_dropout=-0.2), "word_dropout"),
])
def test_bad_configs_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        TINY.replace(**fields)


def test_config_round_trip_and_presets():
    cfg = lm.LMConfig.preset("nanogpt-cpu", learned_positions=True)
    assert lm.LMConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown preset"):
        lm.LMConfig.preset("huge")
    with pytest.raises(ValueError, match="unknown language-model config fields"):
        lm.LMConfig.from_dict({**cfg.to_dict(), "src_vocab": 3})


def test_bad_batches_are_refused():
    params = _params(TINY)
    x = _tokens(TINY, 0, 2, 5)
    with pytest.raises(ValueError, match="next token"):
        lm.loss_and_grads(params, TINY, x, x[:, 1:])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        lm.loss_and_grads(params, TINY, x, x + TINY.vocab)
    with pytest.raises(ValueError, match="max_len"):
        long = _tokens(TINY, 0, 1, TINY.max_len + 1)
        lm.loss_and_grads(params, TINY, long, long)
    with pytest.raises(ValueError, match="missing"):
        lm.loss_and_grads(_params(TINY.replace(pre_ln=False)), TINY, x, x)
