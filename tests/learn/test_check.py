"""Checking exercises: the library's own code passes every exercise; typical mistakes planted in
it fail, each with the diagnosis that names it; an untouched exercise is not written; a syntax
error or an exception is shown at its line of the learner's file."""

import dataclasses

import pytest

from minitfm.learn import check, report, source
from minitfm.learn.exercises import EXERCISES, by_name
from minitfm.learn.workshop import Workshop, make
from tests.learn.conftest import write_exercise

LAST = "return (loss_sum, nll_sum), dh, None"
SCALED = "if dh is not None:\n        dh *= {}\n    "       # every chunk's rows of dh
# exercise -> typical mistakes, each (function, the library's text, the mistake, what the
# diagnosis must say); the exercise's named mistakes are planted too (test_named_mistakes)
PLANTED = {
    "linear": [
        ("backward", "xp.matmul(cache.x.reshape(-1, d_in).T, dy2,",
         "xp.matmul(dy2.T, cache.x.reshape(-1, d_in),", "a transpose"),
        ("backward", "dy2.sum(axis=0, out=None if out is None else out[\"b\"])", "dy2",
         "a sum missing over axis 0"),
        ("backward", "dx = (dy2 @ cache.w.T)", "dx = 2 * (dy2 @ cache.w.T)",
         ("a factor 2", "too many")),
        ("backward", "dx = (dy2 @ cache.w.T)", "dx = -(dy2 @ cache.w.T)", "the wrong sign")],
    "embedding": [
        ("backward", "* cache.scale", "* 1.0", ("sqrt(d_model)", "missing")),
        ("backward", "* cache.scale", "* cache.scale * cache.scale",
         ("sqrt(d_model)", "too many"))],
    "positional": [
        ("backward", "return dy, {}", "return -dy, {}", "the wrong sign")],
    "dropout": [
        ("backward", "apply(dy, cache.keep, cache.scale)", "apply(dy, cache.keep, 1.0)",
         ("1/(1-p), the dropout's scale", "missing")),
        ("backward", "apply(dy, cache.keep, cache.scale)",
         "apply(dy, cache.keep, cache.scale ** 2)", ("1/(1-p), the dropout's scale", "too many"))],
    "inputs": [
        ("backward", 'grads["positions"] = g["table"]', 'grads["positions"] = -g["table"]',
         "the wrong sign")],
    "layernorm": [
        ("backward", 'return g, {"gamma": dgamma, "beta": dbeta}',
         'return g, {"gamma": dbeta, "beta": dgamma}', "the right gradient of")],
    "feedforward": [
        ("backward", 'return dx, {"w1": g1["w"], "b1": g1["b"], "w2": g2["w"], "b2": g2["b"]}',
         'return dx, {"w1": g2["w"], "b1": g1["b"], "w2": g1["w"], "b2": g2["b"]}',
         "transposed")],
    "softmax": [
        ("backward", "ds *= scale ", "ds *= 1.0 ", ("the scale c = 0.7", "missing"))],
    "attention": [
        ("sdpa_backward", "softmax.backward(dp, p, cache.scale)", "softmax.backward(dp, p, 1.0)",
         ("sqrt(d_k)", "too many")),
        ("sdpa_backward", "cache.q, cache.k, cache.v, cache.p",
         "cache.q, cache.k, cache.k, cache.p", "reads cache.k where cache.v belongs")],
    "residual": [
        ("backward", "return (dx, *rest, g_ln)\n    ds", "return (-dx, *rest, g_ln)\n    ds",
         "the wrong sign")],
    "encoder": [
        ("layer_backward", 'grads = {**prefixed(g_attn, "attn."), **prefixed(g_ln1, "ln1."),',
         'grads = {**prefixed(g_attn, "attn."), **prefixed(g_ln2, "ln1."),',
         "the right gradient of")],
    "decoder_only": [
        ("stack_backward", "encoder.stack_backward(dy,", "encoder.stack_backward(-dy,",
         "the wrong sign"),
        ("stack_backward", "encoder.stack_backward(dy,", "encoder.stack_backward(2 * dy,",
         ("factor 2", "too many")),
        ("stack_backward", "encoder.stack_backward(dy,", "encoder.stack_backward(0 * dy,",
         "all zero")],
    "loss": [
        ("backward", "return dz, {}", "return -dz, {}", "the wrong sign")],
    "output": [
        ("forward_backward", LAST, SCALED.format(-1) + LAST, "the wrong sign"),
        ("forward_backward", LAST, SCALED.format(2) + LAST, ("factor 2", "too many")),
        ("forward_backward", LAST, SCALED.format(0) + LAST, "all zero")],
    "model": [
        ("_backward", "encoder.stack_backward(dmemory,", "encoder.stack_backward(2 * dmemory,",
         ("factor 2", "too many"))],
    "kernel_dropout": [
        ("dropout_backward", "if (i < n)", "if (i <= n)", "outside its 300 elements"),
        ("dropout_backward", "dy[i] * scale", "dy[i]", ("1/(1-p), the dropout's scale",
                                                        "missing")),
        ("dropout_backward", "keep[i] ?", "true ?", "elements are wrong")],
    "kernel_softmax": [
        ("softmax_backward", "* p[row + j] * scale", "* p[row + j]", ("the scale c", "missing")),
        ("softmax_backward", "j < cols; j += blockDim.x) dot", "j <= cols; j += blockDim.x) dot",
         "a race between blocks"),
        ("softmax_backward", "dot = block_sum(dot, scratch);",
         "if (threadIdx.x < 32) dot = block_sum(dot, scratch);", ("deadlock", ".cu, line "))],
    "kernel_layernorm": [
        ("layernorm_forward", "if (threadIdx.x == 0) rstd", "rstd", "a race"),
        ("layernorm_forward", "c < d; c += blockDim.x) s +=", "c <= d; c += blockDim.x) s +=",
         "outside its")],
    "kernel_loss": [
        ("smoothed_loss", "    __syncthreads();\n    float total", "    float total", "a race")],
}


def diagnoses(result: report.Report) -> list[str]:
    found = [a.diagnosis or "" for case in result.cases for a in case.arrays if not a.ok]
    return found + [case.problem for case in result.cases if case.problem]


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.name)
def test_the_library_code_passes_every_exercise(ex, folder):
    path = write_exercise(folder, ex)
    result = check.run_check(ex, path)
    assert result.status == "pass", report.describe(result)
    assert result.cases and all(case.ok for case in result.cases)


def _one_case(ex, label):
    """A stack's exercise with one of its two cases, one the mistake shows in (the final
    LayerNorm's in the pre-LN case, the others in the post-LN one): the other's cost spared."""
    if ex.name in ("encoder", "decoder", "decoder_only"):
        return dataclasses.replace(ex, cases=ex.cases[1:] if "final LayerNorm" in label
                                   else ex.cases[:1])
    return ex


def _planted():
    for ex in EXERCISES:
        for function, old, new, words in PLANTED.get(ex.name, []):
            yield pytest.param(ex, function, old, new, words, id=f"{ex.name}: {words}")


@pytest.mark.parametrize("ex, function, old, new, words", list(_planted()))
def test_typical_mistakes_are_named(ex, function, old, new, words, folder):
    path = write_exercise(folder, ex, {function: [(old, new)]})
    ex = _one_case(ex, "")
    result = check.run_check(ex, path)
    assert result.status == "fail", report.describe(result)
    words = (words,) if isinstance(words, str) else words
    assert any(all(w in d for w in words) for d in diagnoses(result)), report.describe(result)


def _named():
    for ex in EXERCISES:
        for mistake in ex.mistakes:
            yield pytest.param(ex, mistake, id=f"{ex.name}: {mistake.label[:40]}")


@pytest.mark.parametrize("ex, mistake", list(_named()))
def test_named_mistakes_are_named(ex, mistake, folder):
    path = write_exercise(folder, ex, {mistake.function: [(mistake.old, mistake.new)]})
    ex = _one_case(ex, mistake.label)
    result = check.run_check(ex, path)
    assert result.status == "fail", report.describe(result)
    assert any(mistake.label in d for d in diagnoses(result)), report.describe(result)


def test_every_exercise_has_three_planted_mistakes_at_least():
    for ex in EXERCISES:
        assert len(PLANTED.get(ex.name, [])) + len(ex.mistakes) >= 3, ex.name


def test_an_untouched_exercise_is_not_written(folder):
    workshop = Workshop(folder)
    for ex in (by_name("layernorm"), by_name("attention"), by_name("kernel_softmax")):
        result = check.run_check(ex, workshop.start(ex))
        assert result.status == "not written"
        assert "not written yet" in report.describe(result)


def test_one_function_left_of_several_is_named(folder):
    ex = by_name("attention")
    path = Workshop(folder).start(ex)
    path.write_text(source.filled(make(ex), ex.module, ("sdpa_backward", "self_backward")))
    result = check.run_check(ex, path)
    assert result.status == "fail"
    problems = [c.problem for c in result.cases if c.problem]
    assert len(problems) == 2 and all("not written yet: cross_backward" in p for p in problems)
    assert all(c.ok for c in result.cases if "cross" not in c.name)


def test_a_syntax_error_is_shown_at_its_line(folder):
    ex = by_name("linear")
    path = write_exercise(folder, ex)
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "dx = (dy2 @ cache.w.T)" in line)
    lines[at] = lines[at].replace("dx = (dy2", "dx = ((dy2")
    path.write_text("\n".join(lines) + "\n")
    result = check.run_check(ex, path)
    assert result.status == "error"
    assert f"{path.name}, line " in result.message
    assert "minitfm/" not in result.message


def test_an_exception_is_shown_at_the_learners_line(folder):
    ex = by_name("layernorm")
    path = write_exercise(folder, ex, {"backward": [("g *= rstd ", "g *= cache.rstdd ")]})
    result = check.run_check(ex, path)
    text = report.describe(result)
    line = next(n for n, s in enumerate(path.read_text().splitlines(), 1) if "cache.rstdd" in s)
    assert result.status == "fail"
    assert f"{path.name}, line {line}, in backward" in text
    assert "AttributeError" in text and "rstdd" in text
    assert "Traceback" not in text and "minitfm/layers" not in text


def test_an_exception_inside_the_library_is_shown_at_the_learners_call(folder):
    ex = by_name("feedforward")           # linear.backward gets an array of the wrong width
    path = write_exercise(folder, ex, {"backward": [("dx, g1 = linear.backward(da,",
                                                     "dx, g1 = linear.backward(da[..., 1:],")]})
    result = check.run_check(ex, path)
    text = report.describe(result)
    assert f"{path.name}, line " in text and "linear.backward(da[..., 1:]" in text
    assert "ValueError" in text and "minitfm/layers" not in text


def test_a_changed_forward_pass_is_said(folder):
    ex = by_name("linear")
    path = write_exercise(folder, ex)
    path.write_text(path.read_text().replace("y += b\n", "y += 2 * b\n"))
    result = check.run_check(ex, path)
    notes = [case.note for case in result.cases if case.note]
    assert notes and "your forward pass gives other outputs" in notes[0]


def test_the_first_wrong_element_is_reported(folder):
    ex = by_name("layernorm")
    path = write_exercise(folder, ex, {"backward": [("g -= mean_g ", "g -= 0.0 * mean_g ")]})
    result = check.run_check(ex, path)
    (dx,) = [a for a in result.cases[0].arrays if not a.ok]
    index, yours, numeric = dx.first
    assert dx.name == "x" and len(index) == 3 and yours != pytest.approx(numeric)
    assert "first wrong element" in report.describe(result)
