"""Every layer's backward pass against float64 central differences, on random shapes and values."""

import math
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minitfm import backend, layers
from minitfm.layers import feedforward
from minitfm.gradcheck.check import (STEP, TOLERANCE, check_case, check_directions,
                                     check_gradients)
from minitfm.gradcheck.cases import CASES
from minitfm.gradcheck.__main__ import main as gradcheck_main

# d >= 3: with two features LayerNorm's output is +-1 whatever its input, so every gradient
# upstream of it vanishes and finite differences only measure rounding noise.
RANGES = {"b": (1, 3), "t": (1, 4), "s": (1, 4), "d": (3, 6), "f": (1, 6), "v": (2, 8),
          "h": (1, 3), "dk": (1, 3), "n": (1, 4)}
STACK_RANGES = {**RANGES, "h": (1, 2), "dk": (2, 3), "f": (1, 4), "n": (1, 2), "b": (1, 2),
                "t": (1, 3), "s": (1, 3)}

LAYER_CASES = [c for c in CASES if "stack" not in c.name]
STACK_CASES = [c for c in CASES if "stack" in c.name]


def sizes_for(case, ranges):
    """A strategy for the case's size dict: every key it uses, drawn from its range."""
    return st.fixed_dictionaries({k: st.integers(*ranges[k]) for k in case.sizes if k in ranges})


RELU_MARGIN = 1e-3      # a ReLU input nearer 0 than this: finite differences straddle the kink


def relu_inputs_clear_of_zero(case, seed, sizes) -> bool:
    """Whether every ReLU input of the case's forward pass (as ``check_case`` draws it) lies at
    least :data:`RELU_MARGIN` from 0. Nearer, the perturbed objective is not smooth within the
    steps, and the finite differences, not the backward pass, are wrong (an input 8e-9 from 0
    made x's error 0.14 in a decoder-only stack)."""
    nearest = [math.inf]
    plain = feedforward.forward

    def watched(x, p, *args, **kwargs):
        h = x.reshape(-1, p["w1"].shape[0]) @ p["w1"] + p["b1"]         # the ReLU's input
        nearest[0] = min(nearest[0], float(abs(h).min()))
        return plain(x, p, *args, **kwargs)

    rng = backend.host_rng(seed)
    arrays = case.draw(rng, {**case.sizes, **sizes})
    feedforward.forward = watched
    try:
        case.forward(arrays, {**case.sizes, **sizes})
    finally:
        feedforward.forward = plain
    return nearest[0] >= RELU_MARGIN


def assert_close(errors, case):
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOLERANCE, f"{case.name}: {worst} relative error {errors[worst]:.2e}"


@pytest.mark.parametrize("case", LAYER_CASES, ids=lambda c: c.name)
@settings(max_examples=15)
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_layer_gradients(case, data, seed):
    sizes = data.draw(sizes_for(case, RANGES))
    if "multi-head" in case.name:
        # d_model >= 2, as for the stacks: with one head of one dimension the gradient through
        # the queries is often ~1e-6 of the objective, below what finite differences resolve
        assume(sizes["h"] * sizes["dk"] >= 2)
    assume(relu_inputs_clear_of_zero(case, seed, sizes))
    assert_close(check_case(case, seed, sizes), case)


@pytest.mark.parametrize("case", STACK_CASES, ids=lambda c: c.name)
@settings(max_examples=2)
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_stack_gradients(case, data, seed):
    check_stack(case, data, seed)


@pytest.mark.slow
@pytest.mark.parametrize("case", STACK_CASES, ids=lambda c: c.name)
@settings(max_examples=10)
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_stack_gradients_many_draws(case, data, seed):
    check_stack(case, data, seed)


def check_stack(case, data, seed):
    sizes = data.draw(sizes_for(case, STACK_RANGES))
    assume(sizes["h"] * sizes["dk"] >= 3)                      # d_model >= 3, as above
    sizes["p"] = data.draw(st.sampled_from([0.0, 0.25]))       # with fixed dropout masks too:
    sizes["pa"] = data.draw(st.sampled_from([0.0, 0.25]))      # residual, attention and ReLU
    assume(relu_inputs_clear_of_zero(case, seed, sizes))
    assert_close(check_case(case, seed, sizes), case)


def test_every_layer_file_has_a_case():
    names = " ".join(c.name for c in CASES)
    for layer in ["linear", "embedding", "positional", "dropout", "inputs", "layernorm",
                  "feedforward", "softmax", "attention", "self-attention", "cross-attention",
                  "residual", "encoder", "decoder", "decoder-only", "cross-entropy", "output"]:
        assert layer in names


def test_cases_follow_the_order_of_the_layer_files():
    """One section per file of minitfm/layers/, in the order its __init__ lists them."""
    files = [p.stem for p in Path(layers.__file__).parent.glob("*.py") if p.stem != "__init__"]
    order = layers.__doc__.split(":", 1)[1].split(".", 1)[0].replace("\n", " ")
    order = [name.strip() for name in order.replace(" and ", ",").split(",")]
    assert sorted(order) == sorted(files)
    case_name = {"loss": "cross-entropy", "decoder_only": "decoder-only"}   # what its cases
                                                                            # are called
    first = [min(i for i, c in enumerate(CASES) if case_name.get(f, f) in c.name)
             for f in order]
    assert first == sorted(first)


def drawn(case, sizes: dict, seed: int):
    """A case's arrays at ``sizes`` as the checks draw them, its backward pass's gradients of
    L = sum(G * y), and L as a function of the arrays (perturbed in place)."""
    rng = backend.host_rng(seed)
    arrays = case.draw(rng, sizes)
    out, cache = case.forward(arrays, sizes)
    g = backend.to_device(rng.standard_normal(out.shape))
    grads = case.gradients(case.backward(g, cache))

    def objective():
        return float((case.forward(arrays, sizes)[0] * g).sum())

    return arrays, grads, objective


def test_checker_catches_a_wrong_backward():
    """The checker itself must fail a gradient that is off by a little."""
    case = CASES[0]                       # linear
    arrays, grads, objective = drawn(case, case.sizes, 0)
    grads["w"] = grads["w"] * 1.001
    errors = check_gradients(objective, grads, arrays)
    assert errors["w"] > TOLERANCE
    assert errors["x"] <= TOLERANCE


def test_the_second_step_does_not_hide_a_small_error():
    """An array measured again at a wider step (its gradient is ~1e-6 of the objective, so the
    first step loses ~1e-6 to rounding) passes as computed, and fails once off by 1e-4."""
    case = next(c for c in CASES if c.name == "encoder stack (pre-LN)")
    sizes = {**case.sizes, "b": 1, "h": 2, "t": 1, "s": 3, "dk": 2, "f": 3, "n": 2, "p": 0.25}
    arrays, grads, objective = drawn(case, sizes, 365345190)
    name = "1.ln2.beta"
    narrow = check_gradients(objective, {name: grads[name]}, arrays, STEP)
    assert narrow[name] > TOLERANCE                    # rounding at h = 2e-5 ...
    assert check_gradients(objective, {name: grads[name]}, arrays)[name] \
        <= TOLERANCE                                   # ... not at h = 1e-4
    wrong = {name: grads[name] * 1.0001}
    assert check_gradients(objective, wrong, arrays)[name] > TOLERANCE


def test_the_directional_check_fails_what_the_element_wise_one_fails():
    """Along three random directions a right gradient passes, and one wrong in one element of
    1,024 (by a thousandth of the array's norm), scaled by 1.0001, or transposed fails, as
    element by element."""
    case = next(c for c in CASES if c.name == "linear")
    arrays, grads, objective = drawn(case, {**case.sizes, "b": 4, "t": 8, "d": 32, "f": 32}, 7)
    w = grads["w"]
    assert w.size == 1024
    one = w.copy()
    one[3, 5] += 1e-3 * float(backend.xp.linalg.norm(w))
    wrongs = {"one element": one, "scaled": w * 1.0001, "transposed": w.T.copy()}
    assert check_directions(objective, {"w": w}, arrays, 3)["w"] <= TOLERANCE
    for what, wrong in wrongs.items():
        assert check_directions(objective, {"w": wrong}, arrays, 3)["w"] > TOLERANCE, what
        assert check_gradients(objective, {"w": wrong}, arrays)["w"] > TOLERANCE, what


def test_cli_reports_a_table_and_exit_status(capsys):
    assert gradcheck_main(["layernorm"]) == 0
    out = capsys.readouterr().out
    assert "layernorm" in out and "pass" in out and "1 passed, 0 failed" in out
    assert gradcheck_main(["no such layer"]) == 2
    assert gradcheck_main(["layernorm", "--directions", "2"]) == 0
    out = capsys.readouterr().out
    assert "along 2 random directions of each array" in out and "1 passed, 0 failed" in out
    assert gradcheck_main(["layernorm", "--directions", "2", "--tolerance", "1e-30"]) == 1


def test_a_relu_input_at_its_kink_is_recognised():
    """The draw whose ReLU input lay 8e-9 from 0 is set aside; another seed of it is checked."""
    case = next(c for c in CASES if c.name == "decoder-only stack (pre-LN)")
    sizes = {"b": 2, "h": 1, "t": 2, "s": 1, "dk": 3, "f": 4, "n": 1, "p": 0.25, "pa": 0.0}
    assert not relu_inputs_clear_of_zero(case, 431, sizes)
    assert relu_inputs_clear_of_zero(case, 432, sizes)
    assert_close(check_case(case, 432, sizes), case)
