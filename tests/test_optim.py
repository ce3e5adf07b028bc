"""Tests of minitfm.optim: the schedule of equation (3) and the warm-up/decay schedules, Adam(W)
against a float64 hand computation, dtype and in-place guarantees, which parameters decay,
gradient clipping, and the errors for mismatched dicts."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minitfm import backend, flat
from minitfm.gradscale import clip_grad_norm
from minitfm.optim import Adam, Cooldown, LRSchedule, WarmupDecaySchedule, decays_by_default


# --- learning-rate schedule --------------------------------------------------------------------

def test_schedule_known_values():
    s = LRSchedule(d_model=512, warmup=4000)
    assert s(1) == pytest.approx(512 ** -0.5 * 4000 ** -1.5)
    assert s(4000) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)   # the peak, ~7.0e-4
    assert s(4000) == pytest.approx(6.9877e-4, rel=1e-4)
    assert s(16000) == pytest.approx(s(4000) / 2)      # step^-0.5: 4x the steps, half the rate
    assert LRSchedule(d_model=512, warmup=4000, factor=2.0)(123) == pytest.approx(2 * s(123))


def test_schedule_defaults_are_the_papers():
    s = LRSchedule(d_model=512)
    assert (s.warmup, s.factor) == (4000, 1.0)


@settings(max_examples=30, deadline=None)
@given(d_model=st.integers(1, 4096), warmup=st.integers(1, 20000))
def test_schedule_rises_to_peak_at_warmup_then_falls(d_model, warmup):
    s = LRSchedule(d_model=d_model, warmup=warmup)
    peak = s(warmup)
    assert peak == pytest.approx((d_model * warmup) ** -0.5)
    up = [s(k) for k in range(1, warmup + 1, max(1, warmup // 50))]
    down = [s(k) for k in range(warmup, 5 * warmup, max(1, warmup // 10))]
    assert all(a < b for a, b in zip(up, up[1:]))
    assert all(a > b for a, b in zip(down, down[1:]))
    assert max(up + down) == peak


@pytest.mark.parametrize("kwargs", [dict(d_model=0), dict(d_model=8, warmup=0),
                                    dict(d_model=8, factor=0.0)])
def test_schedule_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError, match="schedule needs"):
        LRSchedule(**kwargs)


def test_schedule_counts_from_one():
    with pytest.raises(ValueError, match="count from 1"):
        LRSchedule(d_model=8)(0)


# --- Adam --------------------------------------------------------------------------------------

def adam_reference(p, grads, lrs, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0):
    """Kingma & Ba, Algorithm 1, written out in float64 (with AdamW's decoupled weight decay)."""
    p = np.array(p, dtype=np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        g = np.asarray(g, dtype=np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1 ** t)
        v_hat = v / (1 - b2 ** t)
        p = p - lr * weight_decay * p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p, m, v


def test_two_adam_steps_by_hand_float64():
    w = np.array([[0.5, -1.0], [2.0, 0.0]])
    b = np.array([0.1, -0.2, 0.3])
    g1 = {"w": np.array([[0.1, -0.2], [0.3, 0.0]]), "b": np.array([1.0, -1e-3, 0.0])}
    g2 = {"w": np.array([[-0.4, 0.2], [0.1, 5.0]]), "b": np.array([0.5, 2.0, -3.0])}
    params = {"w": w.copy(), "b": b.copy()}
    opt = Adam(params)
    opt.update(params, g1, lr=1e-3)
    opt.update(params, g2, lr=2e-3)
    assert opt.step == 2

    # step 1 by hand: m = 0.1 g1, v = 0.02 g1^2, m_hat = g1, v_hat = g1^2
    w1 = w - 1e-3 * g1["w"] / (np.abs(g1["w"]) + 1e-9)
    # step 2 by hand
    m2 = 0.9 * 0.1 * g1["w"] + 0.1 * g2["w"]
    v2 = 0.98 * 0.02 * g1["w"] ** 2 + 0.02 * g2["w"] ** 2
    w2 = w1 - 2e-3 * (m2 / (1 - 0.9 ** 2)) / (np.sqrt(v2 / (1 - 0.98 ** 2)) + 1e-9)
    np.testing.assert_allclose(params["w"], w2, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(opt.m["w"], m2, rtol=1e-12)
    np.testing.assert_allclose(opt.v["w"], v2, rtol=1e-12)

    ref_b, ref_m, ref_v = adam_reference(b, [g1["b"], g2["b"]], [1e-3, 2e-3])
    np.testing.assert_allclose(params["b"], ref_b, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(opt.m["b"], ref_m, rtol=1e-12)
    np.testing.assert_allclose(opt.v["b"], ref_v, rtol=1e-12)


finite = st.floats(-10, 10, allow_nan=False, width=32)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), shape=hnp.array_shapes(max_dims=3, max_side=4), steps=st.integers(1, 4))
def test_adam_float32_matches_float64_reference_in_place(data, shape, steps):
    p0 = data.draw(hnp.arrays(np.float32, shape, elements=finite))
    grads = [data.draw(hnp.arrays(np.float32, shape, elements=finite)) for _ in range(steps)]
    lrs = [data.draw(st.floats(1e-5, 1e-2)) for _ in range(steps)]
    params = {"p": p0.copy()}
    array = params["p"]
    opt = Adam(params)
    for g, lr in zip(grads, lrs):
        opt.update(params, {"p": g}, lr)
    assert params["p"] is array                      # updated in place, never reallocated
    assert params["p"].dtype == np.float32
    assert opt.m["p"].dtype == opt.v["p"].dtype == np.float32
    ref, _, _ = adam_reference(p0, grads, lrs)
    # each step moves a parameter by at most about lr; float32 rounding of that is ~1e-7 relative
    np.testing.assert_allclose(params["p"], ref, rtol=1e-5, atol=1e-5 * sum(lrs) + 1e-6)


@settings(max_examples=25, deadline=None)
@given(g=hnp.arrays(np.float64, 5, elements=st.floats(1e-3, 1e3) | st.floats(-1e3, -1e-3)),
       lr=st.floats(1e-5, 1.0))
def test_first_adam_step_moves_each_weight_by_lr(g, lr):
    params = {"p": np.zeros(5)}
    Adam(params).update(params, {"p": g}, lr)
    np.testing.assert_allclose(params["p"], -lr * np.sign(g), rtol=1e-6)


def test_mismatched_grad_keys_are_named():
    params = {"a": np.zeros(2), "b": np.zeros(3)}
    opt = Adam(params)
    with pytest.raises(ValueError, match=r"missing \['b'\], extra \['c'\]"):
        opt.update(params, {"a": np.zeros(2), "c": np.zeros(3)}, 1e-3)
    assert opt.step == 0


def test_mismatched_grad_shape_or_dtype_is_refused():
    params = {"a": np.zeros((2, 3), dtype=np.float32)}
    opt = Adam(params)
    with pytest.raises(ValueError, match=r"gradient 'a' has shape \(3, 2\)"):
        opt.update(params, {"a": np.zeros((3, 2), dtype=np.float32)}, 1e-3)
    with pytest.raises(ValueError, match="float64"):
        opt.update(params, {"a": np.zeros((2, 3), dtype=np.float64)}, 1e-3)


def test_state_dict_round_trip_resumes_identically():
    rng = np.random.default_rng(0)
    grads = [{"w": rng.standard_normal(4).astype(np.float32)} for _ in range(4)]
    straight = {"w": np.ones(4, dtype=np.float32)}
    opt = Adam(straight)
    for g in grads:
        opt.update(straight, g, 1e-2)

    resumed = {"w": np.ones(4, dtype=np.float32)}
    first = Adam(resumed)
    for g in grads[:2]:
        first.update(resumed, g, 1e-2)
    state = {k: v if k == "step" else {n: a.copy() for n, a in v.items()}
             for k, v in first.state_dict().items()}
    second = Adam(resumed)
    second.load_state_dict(state)
    assert second.step == 2
    for g in grads[2:]:
        second.update(resumed, g, 1e-2)
    np.testing.assert_array_equal(resumed["w"], straight["w"])


def test_load_state_dict_refuses_other_models_state():
    opt = Adam({"w": np.zeros(3)})
    with pytest.raises(ValueError, match="different set of parameters"):
        opt.load_state_dict({"step": 1, "m": {"x": np.zeros(3)}, "v": {"x": np.zeros(3)}})
    with pytest.raises(ValueError, match="different model"):
        opt.load_state_dict({"step": 1, "m": {"w": np.zeros(4)}, "v": {"w": np.zeros(4)}})
    with pytest.raises(ValueError, match=r"missing \['v'\]"):
        opt.load_state_dict({"step": 1, "m": {"w": np.zeros(3)}})


# --- gradient clipping -------------------------------------------------------------------------

def test_clip_grad_norm_scales_to_max_norm():
    grads = {"a": np.array([3.0, 0.0], dtype=np.float32), "b": np.array([[4.0]], dtype=np.float32)}
    a = grads["a"]
    norm = clip_grad_norm(grads, 1.0)
    assert isinstance(norm, np.ndarray) and norm.shape == ()     # on the device: no sync
    assert float(norm) == pytest.approx(5.0)
    assert grads["a"] is a and grads["a"].dtype == np.float32
    np.testing.assert_allclose(grads["a"], [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(grads["b"], [[0.8]], rtol=1e-6)


@settings(max_examples=30, deadline=None)
@given(g=hnp.arrays(np.float64, hnp.array_shapes(max_dims=2, max_side=5),
                    elements=st.floats(-100, 100)),
       max_norm=st.floats(0.1, 50))
def test_clip_grad_norm_properties(g, max_norm):
    grads = {"g": g.copy()}
    norm = float(clip_grad_norm(grads, max_norm))
    assert norm == pytest.approx(np.linalg.norm(g))
    if norm <= max_norm:
        np.testing.assert_array_equal(grads["g"], g)           # untouched below the threshold
    else:
        assert np.linalg.norm(grads["g"]) == pytest.approx(max_norm)
        np.testing.assert_allclose(grads["g"] * norm / max_norm, g, rtol=1e-9, atol=1e-12)


def test_clip_grad_norm_leaves_non_finite_gradients_alone():
    grads = {"g": np.array([1.0, np.inf])}
    assert math.isinf(float(clip_grad_norm(grads, 1.0)))
    np.testing.assert_array_equal(grads["g"], [1.0, np.inf])


def test_clip_grad_norm_rejects_non_positive_max_norm():
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm({"g": np.ones(2)}, 0.0)


# --- flat buffers ------------------------------------------------------------------------------

def _model_like(rng, dtype=np.float32):
    shapes = {"emb": (5, 3), "enc.0.attn.w_qkv": (3, 9), "enc.0.attn.b_qkv": (9,),
              "enc.0.ln1.gamma": (3,)}
    return {name: rng.standard_normal(shape).astype(dtype) for name, shape in shapes.items()}


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adam_on_flat_buffers_equals_adam_per_array(weight_decay):
    """Three steps over one flat buffer give bit for bit the per-array result."""
    rng = np.random.default_rng(0)
    start = _model_like(rng)
    grads = [_model_like(rng) for _ in range(3)]
    plain = {k: v.copy() for k, v in start.items()}
    packed = flat.flatten(start)
    views = dict(packed)
    opt_plain = Adam(plain, weight_decay=weight_decay)
    opt_flat = Adam(packed, weight_decay=weight_decay)
    assert isinstance(opt_flat.m, flat.FlatDict)
    for step, g in enumerate(grads, 1):
        opt_plain.update(plain, g, 1e-2 * step)
        opt_flat.update(packed, flat.flatten(g), 1e-2 * step)
    for name in start:
        assert packed[name] is views[name]                      # updated in place, as views
        np.testing.assert_array_equal(packed[name], plain[name])
        np.testing.assert_array_equal(opt_flat.m[name], opt_plain.m[name])
        np.testing.assert_array_equal(opt_flat.v[name], opt_plain.v[name])


def test_clip_grad_norm_on_a_flat_buffer_equals_per_array():
    rng = np.random.default_rng(1)
    grads = _model_like(rng, np.float64)
    packed = flat.flatten(grads)
    norm_plain, norm_flat = clip_grad_norm(grads, 0.5), clip_grad_norm(packed, 0.5)
    assert float(norm_flat) == pytest.approx(float(norm_plain), rel=1e-12)
    for name in grads:
        np.testing.assert_allclose(packed[name], grads[name], rtol=1e-12)
    assert float(np.linalg.norm(packed.buffer)) == pytest.approx(0.5)


# --- on the GPU --------------------------------------------------------------------------------

@pytest.mark.gpu
def test_adam_on_cupy_matches_numpy(cupy_backend):
    rng = np.random.default_rng(1)
    p0 = rng.standard_normal((8, 8)).astype(np.float32)
    grads = [rng.standard_normal((8, 8)).astype(np.float32) for _ in range(3)]
    host = {"w": p0.copy()}
    backend.use("numpy")
    opt = Adam(host)
    for g in grads:
        opt.update(host, {"w": g}, 1e-2)
    backend.use("cupy")
    device = {"w": backend.to_device(p0)}
    array = device["w"]
    opt = Adam(device)
    for g in grads:
        opt.update(device, {"w": backend.to_device(g)}, 1e-2)
    assert device["w"] is array and device["w"].dtype == np.float32
    np.testing.assert_allclose(backend.to_host(device["w"]), host["w"], rtol=1e-5, atol=1e-6)
    grads_dev = {"w": backend.to_device(grads[0])}
    norm = clip_grad_norm(grads_dev, 1.0)
    assert float(norm) == pytest.approx(float(np.linalg.norm(grads[0])), rel=1e-5)


# --- warm-up then cosine or linear decay -------------------------------------------------------

def test_warmup_decay_known_values():
    cosine = WarmupDecaySchedule(peak_lr=1e-3, warmup=10, total_steps=110, min_lr=1e-4)
    linear = WarmupDecaySchedule(peak_lr=1e-3, warmup=10, total_steps=110, min_lr=1e-4,
                                 decay="linear")
    for s in (cosine, linear):
        assert s(1) == pytest.approx(1e-4)
        assert s(5) == pytest.approx(5e-4)
        assert s(10) == pytest.approx(1e-3)                     # the peak
        assert s(60) == pytest.approx(5.5e-4)                   # half way: half way down
        assert s(110) == s(111) == s(10_000) == 1e-4            # the floor, and it stays
    assert cosine(35) == pytest.approx(1e-4 + 9e-4 * (1 + math.cos(math.pi / 4)) / 2)  # 8.682e-4
    assert cosine(35) == pytest.approx(8.6820e-4, rel=1e-4)
    assert linear(35) == pytest.approx(1e-4 + 9e-4 * 0.75)
    assert cosine(85) == pytest.approx(1e-4 + 9e-4 * (1 - math.cos(math.pi / 4)) / 2)


def test_warmup_decay_without_warmup_starts_at_the_peak():
    s = WarmupDecaySchedule(peak_lr=2.0, warmup=0, total_steps=4, decay="linear")
    assert [s(k) for k in range(1, 6)] == [1.5, 1.0, 0.5, 0.0, 0.0]
    assert WarmupDecaySchedule(peak_lr=2.0, warmup=0, total_steps=4)(2) == pytest.approx(1.0)


@settings(max_examples=30, deadline=None)
@given(warmup=st.integers(0, 300), length=st.integers(1, 3000), decay=st.sampled_from(
    ["cosine", "linear"]), floor=st.floats(0.0, 1.0))
def test_warmup_decay_rises_to_the_peak_then_falls_to_the_floor(warmup, length, decay, floor):
    s = WarmupDecaySchedule(peak_lr=3e-3, warmup=warmup, total_steps=warmup + length,
                            min_lr=3e-3 * floor, decay=decay)
    rates = [s(k) for k in range(1, warmup + length + 3)]
    up, down = rates[:warmup], rates[warmup:]
    assert all(a < b for a, b in zip(up, up[1:]))
    assert all(a >= b for a, b in zip(down, down[1:]))
    assert max(rates) <= 3e-3 and (warmup == 0 or s(warmup) == 3e-3)
    assert rates[-1] == rates[-2] == s.min_lr


def test_warmup_decay_follows_the_clock_when_it_ends_the_run_first():
    s = WarmupDecaySchedule(peak_lr=1e-3, warmup=10, total_steps=110, min_lr=1e-4, decay="linear")
    assert s(60, time_fraction=0.2) == s(60)                 # the steps are further along
    assert s(60, time_fraction=0.0) == s(60)
    # w = 10/110: time fraction 0.5 is s = (0.5 - w) / (1 - w) = 0.45 of the decay
    assert s(30, time_fraction=0.5) == pytest.approx(1e-4 + 9e-4 * 0.55)
    assert s(30, time_fraction=1.0) == s(31, time_fraction=1.3) == pytest.approx(1e-4)
    # in the warm-up: the smaller of the warm-up's rate and the decayed one
    assert s(5, time_fraction=0.5) == pytest.approx(5e-4)
    assert s(9, time_fraction=0.5) == pytest.approx(1e-4 + 9e-4 * 0.55)


@settings(max_examples=30, deadline=None)
@given(warmup=st.integers(0, 50), steps=st.integers(100, 1000), ends=st.integers(60, 99),
       decay=st.sampled_from(["cosine", "linear"]))
def test_warmup_decay_on_a_clock_never_jumps_and_ends_at_the_floor(warmup, steps, ends, decay):
    """A clock that ends the run at step ``ends`` (time fraction ``k / ends``)."""
    s = WarmupDecaySchedule(peak_lr=1.0, warmup=warmup, total_steps=steps, min_lr=0.1,
                            decay=decay)
    rates = [s(k, time_fraction=k / ends) for k in range(1, ends + 1)]
    assert rates[-1] == pytest.approx(0.1) and max(rates) <= 1.0
    peak = rates.index(max(rates))
    assert all(a <= b for a, b in zip(rates[:peak], rates[1:peak + 1]))
    assert all(a >= b for a, b in zip(rates[peak:], rates[peak + 1:]))
    largest_step = max(abs(a - b) for a, b in zip(rates, rates[1:]))
    assert largest_step <= max(1.0 / max(warmup, 1), math.pi / (ends - warmup)) + 1e-12


def test_cooldown_brings_the_last_part_of_a_run_down_to_zero():
    paper = LRSchedule(64, warmup=10)
    s = Cooldown(paper, total_steps=100, fraction=0.2)
    assert [s(k) for k in (1, 50, 80)] == [paper(1), paper(50), paper(80)]   # p < 0.8: as is
    assert s(91) == pytest.approx(paper(91) * 0.5)                         # p = 0.9: half
    assert s(100) == pytest.approx(paper(100) * 0.05) and s(101) == 0.0    # the last step > 0
    assert s(30, time_fraction=0.9) == pytest.approx(paper(30) * 0.5)      # on the clock
    assert s(30, time_fraction=1.0) == 0.0
    rates = [s(k) for k in range(1, 102)]
    assert all(a > b for a, b in zip(rates[80:], rates[81:]))
    with pytest.raises(ValueError, match="cool-down needs"):
        Cooldown(paper, total_steps=100, fraction=0.0)


def test_cooldown_passes_the_clock_to_the_schedule_it_wraps():
    decay = WarmupDecaySchedule(peak_lr=1e-3, warmup=10, total_steps=110, decay="linear")
    s = Cooldown(decay, total_steps=110, fraction=0.2)
    assert s(30, time_fraction=0.5) == decay(30, time_fraction=0.5) != decay(30)
    assert s(30, time_fraction=0.9) == pytest.approx(decay(30, time_fraction=0.9) * 0.5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(peak_lr=0.0, warmup=1, total_steps=2), "peak_lr > 0"),
    (dict(peak_lr=1.0, warmup=1, total_steps=2, min_lr=2.0), "min_lr <= peak_lr"),
    (dict(peak_lr=1.0, warmup=1, total_steps=2, min_lr=-1.0), "min_lr <= peak_lr"),
    (dict(peak_lr=1.0, warmup=5, total_steps=5), "warmup < total_steps"),
    (dict(peak_lr=1.0, warmup=-1, total_steps=5), "0 <= warmup"),
    (dict(peak_lr=1.0, warmup=1, total_steps=5, decay="step"), "'cosine' or 'linear'"),
])
def test_warmup_decay_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WarmupDecaySchedule(**kwargs)
    with pytest.raises(ValueError, match="count from 1"):
        WarmupDecaySchedule(peak_lr=1.0, warmup=1, total_steps=5)(0)


# --- decoupled weight decay (AdamW) ------------------------------------------------------------

MODEL_NAMES = {  # a slice of the model's parameter names, and whether they decay by default
    "emb": True, "src_emb": True, "pos_emb": True,
    "dec.0.self_attn.w_qkv": True, "dec.0.self_attn.b_qkv": False,
    "dec.0.self_attn.w_o": True, "dec.0.self_attn.b_o": False,
    "dec.0.cross_attn.w_q": True, "dec.0.cross_attn.w_kv": True, "dec.0.cross_attn.b_kv": False,
    "dec.0.ff.w1": True, "dec.0.ff.b1": False, "dec.0.ff.w2": True, "dec.0.ff.b2": False,
    "dec.0.ln1.gamma": False, "dec.0.ln1.beta": False, "dec.ln.gamma": False,
    "dec.ln.beta": False,
}


def test_decays_by_default_matrices_and_embeddings_not_biases_or_layernorm():
    for name, decays in MODEL_NAMES.items():
        assert decays_by_default(name) is decays, name


def test_default_decay_covers_every_matrix_of_the_model():
    from minitfm.models import translator
    cfg = translator.Config.preset("tiny")
    for name, shape in translator.parameter_shapes(cfg).items():
        assert decays_by_default(name) is (len(shape) == 2), name


def random_model(seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    params = {name: rng.standard_normal((3, 2) if decays else 2).astype(dtype)
              for name, decays in MODEL_NAMES.items()}
    grads = [{name: rng.standard_normal(p.shape).astype(dtype) for name, p in params.items()}
             for _ in range(3)]
    return params, grads


def test_weight_decay_zero_is_plain_adam_bit_for_bit():
    params, grads = random_model(0, np.float32)
    plain = {k: v.copy() for k, v in params.items()}
    zero = {k: v.copy() for k, v in params.items()}
    a, b = Adam(plain), Adam(zero, weight_decay=0.0)
    for g in grads:
        a.update(plain, g, 1e-2)
        b.update(zero, g, 1e-2)
    for name in params:
        np.testing.assert_array_equal(zero[name], plain[name])
        np.testing.assert_array_equal(b.m[name], a.m[name])
        np.testing.assert_array_equal(b.v[name], a.v[name])


def test_weight_decay_applies_to_the_chosen_names_only():
    params, grads = random_model(1)
    plain = {k: v.copy() for k, v in params.items()}
    decayed = {k: v.copy() for k, v in params.items()}
    a, b = Adam(plain), Adam(decayed, weight_decay=0.1)
    assert b.decayed == {name for name, decays in MODEL_NAMES.items() if decays}
    lrs = [1e-2, 2e-2, 5e-3]
    for g, lr in zip(grads, lrs):
        a.update(plain, g, lr)
        b.update(decayed, g, lr)
    for name, decays in MODEL_NAMES.items():
        if not decays:
            np.testing.assert_array_equal(decayed[name], plain[name])
            continue
        assert not np.allclose(decayed[name], plain[name])
        ref, ref_m, ref_v = adam_reference(params[name], [g[name] for g in grads], lrs,
                                           weight_decay=0.1)
        np.testing.assert_allclose(decayed[name], ref, rtol=1e-12, atol=1e-15)
        np.testing.assert_array_equal(b.m[name], a.m[name])    # the moments never see the decay


def test_weight_decay_alone_shrinks_by_one_minus_lr_times_decay_per_step():
    params = {"w": np.array([[2.0, -4.0]]), "b": np.array([3.0])}
    opt = Adam(params, weight_decay=0.5)
    zero = {"w": np.zeros((1, 2)), "b": np.zeros(1)}           # Adam's own step is then 0
    opt.update(params, zero, 0.1)
    opt.update(params, zero, 0.2)
    np.testing.assert_allclose(params["w"], [[2.0 * 0.95 * 0.9, -4.0 * 0.95 * 0.9]], rtol=1e-15)
    np.testing.assert_array_equal(params["b"], [3.0])


def test_first_adamw_step_by_hand():
    w = np.array([[0.5, -1.0]])
    params = {"w": w.copy()}
    g = np.array([[0.3, -2.0]])
    Adam(params, weight_decay=0.01).update(params, {"w": g}, 1e-2)
    # p - lr wd p - lr m_hat / (sqrt(v_hat) + eps), m_hat = g, v_hat = g^2
    np.testing.assert_allclose(params["w"], w - 1e-4 * w - 1e-2 * g / (np.abs(g) + 1e-9),
                               rtol=1e-14)


def test_weight_decay_takes_any_name_predicate():
    params, grads = random_model(2)
    no_embeddings = lambda name: decays_by_default(name) and not name.endswith("emb")
    opt = Adam({k: v.copy() for k, v in params.items()}, weight_decay=0.1, decay=no_embeddings)
    assert opt.decayed == {n for n, d in MODEL_NAMES.items() if d} - {"emb", "src_emb", "pos_emb"}
    everything = Adam(params, weight_decay=0.1, decay=lambda name: True)
    assert everything.decayed == set(MODEL_NAMES)


@pytest.mark.parametrize("weight_decay", [-0.1, math.nan, math.inf])
def test_bad_weight_decay_is_refused(weight_decay):
    with pytest.raises(ValueError, match="weight_decay must be finite and >= 0"):
        Adam({"w": np.zeros((2, 2))}, weight_decay=weight_decay)


def test_decay_must_be_a_predicate():
    with pytest.raises(TypeError, match="decay must be a function of a parameter name"):
        Adam({"w": np.zeros((2, 2))}, weight_decay=0.1, decay={"w"})
