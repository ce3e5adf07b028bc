"""Typical mistakes planted in the library's own code, one class after another, each named by the
diagnosis in the derivation's words (or, where no cause fits, located: which rows, positions,
steps, under which mask), and every failing report on a screen."""

import pytest

from minitfm.learn import check, report
from minitfm.learn.exercises import EXERCISES, by_name
from tests.learn.conftest import write_exercise

LAST = "return (loss_sum, nll_sum), dh, None"
SCALED = "if dh is not None:\n        dh *= {}\n    "       # every chunk's rows of dh
LAYER_NAMES = ('grads.update(prefixed(g, f"{i}."))',
               'grads.update(prefixed(g, f"{len(cache.layers) - 1 - i}."))')

# exercise -> planted mistakes: (class, function, [(the library's text, the mistake)], what the
# diagnosis must say: one string, or several that one diagnosis holds together)
PLANTED = {
    "linear": [
        ("transpose", "backward", [("xp.matmul(cache.x.reshape(-1, d_in).T, dy2,",
                                    "xp.matmul(dy2.T, cache.x.reshape(-1, d_in),")],
         "a transpose"),
        ("shape", "backward", [("dy2.sum(axis=0, out=None if out is None else out[\"b\"])",
                                "dy2")], "a sum missing over axis 0"),
        ("constant", "backward", [("dx = (dy2 @ cache.w.T)", "dx = 2 * (dy2 @ cache.w.T)")],
         ("a factor 2", "too many")),
        ("sign", "backward", [("dx = (dy2 @ cache.w.T)", "dx = -(dy2 @ cache.w.T)")],
         "the wrong sign"),
        ("constant", "backward", [("dy2.sum(axis=0, out=None if out is None else out[\"b\"])",
                                   "dy2.mean(axis=0)")], ("the rows b*t", "missing"))],
    "embedding": [
        ("constant", "backward", [("* cache.scale", "* 1.0")], ("sqrt(d_model)", "missing")),
        ("constant", "backward", [("* cache.scale", "* cache.scale * cache.scale")],
         ("sqrt(d_model)", "too many")),
        ("shift", "backward", [("cache.ids.reshape(-1), scaled", "cache.ids.reshape(-1) - 1, "
                                "scaled")], ("shifted by 1 along axis 0", "off by 1"))],
    "positional": [
        ("sign", "backward", [("return dy, {}", "return -dy, {}")], "the wrong sign"),
        ("shift", "learned_backward", [("dtable[cache.offset:cache.offset + length]",
                                        "dtable[cache.offset + 1:cache.offset + 1 + length]")],
         "shifted by 1 along axis 0")],
    "dropout": [
        ("constant", "backward", [("apply(dy, cache.keep, cache.scale)",
                                   "apply(dy, cache.keep, 1.0)")],
         ("1/(1-p), the dropout's scale", "missing")),
        ("constant", "backward", [("apply(dy, cache.keep, cache.scale)",
                                   "apply(dy, cache.keep, cache.scale ** 2)")],
         ("1/(1-p), the dropout's scale", "too many")),
        ("where", "backward", [("apply(dy, cache.keep, cache.scale)",
                                "apply(dy, cache.keep, cache.scale) + (~cache.keep) * dy")],
         ("elements are wrong", "wrong exactly where the dropout dropped the element"))],
    "inputs": [
        ("sign", "backward", [('grads["positions"] = g["table"]',
                               'grads["positions"] = -g["table"]')], "the wrong sign"),
        ("pair", "backward", [("dx, _ = dropout.backward(dy, cache.dropout)", "dx = dy"),
                              ("dx = dropout.apply(dx, cache.words.keep, cache.words.scale)",
                               "pass")],
         ("two mistakes at once", "dropout's backward is skipped", "word dropout's mask"))],
    "layernorm": [
        ("swap", "backward", [('return g, {"gamma": dgamma, "beta": dbeta}',
                               'return g, {"gamma": dbeta, "beta": dgamma}')],
         "the right gradient of"),
        ("sign", "backward", [("g *= rstd ", "g = (g - 2 * dy * gamma) * rstd ")],
         "term 1 of dx has the wrong sign: g, the direct path through xhat"),
        ("sign", "backward", [("g -= mean_g ", "g += mean_g ")],
         "term 2 of dx has the wrong sign: -mean(g), the path through the mean mu"),
        ("sign", "backward", [("g -= xhat * mean_gx", "g += xhat * mean_gx")],
         "term 3 of dx has the wrong sign"),
        ("constant", "backward", [("[..., None] / d", "[..., None] / (d - 1)")],
         ("term 3 of dx is 1.2 times the right one", "d/(d - 1)", "too many")),
        ("pair", "backward", [("g -= mean_g ", "g -= 0.0 * mean_g "),
                              ("g -= xhat * mean_gx", "g += xhat * mean_gx")],
         ("two terms are off: term 2 of dx is missing, and term 3 of dx has the wrong sign",)),
        ("pair", "backward", [("g = dy * gamma ", "g = dy * 1.0 "), ("g *= rstd ", "g *= 1.0 ")],
         ("two mistakes at once", "gamma is missing from term 1", "the final scale rstd"))],
    "feedforward": [
        ("swap", "backward", [('return dx, {"w1": g1["w"], "b1": g1["b"], "w2": g2["w"], '
                               '"b2": g2["b"]}', 'return dx, {"w1": g2["w"], "b1": g1["b"], '
                               '"w2": g1["w"], "b2": g2["b"]}')],
         ("it is the right gradient of w2", "two gradients swapped")),
        ("mask", "backward", [("da *= cache.a > 0 ", "da *= cache.a >= 0 ")],
         "the ReLU's mask lets every element through")],
    "softmax": [
        ("constant", "backward", [("ds *= scale ", "ds *= 1.0 ")],
         ("the scale c = 0.7", "missing")),
        ("sign", "backward", [("dp -= backend.xp.einsum", "dp = -dp - backend.xp.einsum")],
         "the softmax Jacobian's first term has the wrong sign: P * dP"),
        ("sign", "backward", [("dp -= backend.xp.einsum", "dp += backend.xp.einsum")],
         "the softmax Jacobian's second term has the wrong sign: -P * rowsum(dP * P)"),
        ("where", "backward", [("ds *= p ", "ds *= p + (p == 0) ")],
         ("40 of 360 elements are wrong", "wrong exactly where the padding mask hides keys"))],
    "attention": [
        ("constant", "sdpa_backward", [("softmax.backward(dp, p, cache.scale)",
                                        "softmax.backward(dp, p, 1.0)")],
         ("sqrt(d_k)", "too many")),
        ("field", "sdpa_backward", [("cache.q, cache.k, cache.v, cache.p",
                                     "cache.q, cache.k, cache.k, cache.p")],
         "reads cache.k where cache.v belongs"),
        ("pair", "sdpa_backward", [("dp, _ = dropout.backward(dp, cache.dropout)", "pass"),
                                   ("cache.p_dropped.swapaxes(-1, -2)",
                                    "cache.p.swapaxes(-1, -2)")],
         ("two mistakes at once", "dV uses P", "the attention dropout's backward is skipped"))],
    "residual": [
        ("sign", "backward", [("return (dx, *rest, g_ln)\n    ds",
                               "return (-dx, *rest, g_ln)\n    ds")], "the wrong sign"),
        ("sign", "backward", [("dx += dy ", "dx -= dy ")],
         "the identity path (pre-LN) has the wrong sign"),
        ("sign", "backward", [("dx += ds ", "dx = ds - dx ")],
         "the sub-layer path (post-LN) has the wrong sign")],
    "encoder": [
        ("swap", "layer_backward",
         [('grads = {**prefixed(g_attn, "attn."), **prefixed(g_ln1, "ln1."),',
           'grads = {**prefixed(g_attn, "attn."), **prefixed(g_ln2, "ln1."),')],
         ("gradients under other names", "*.ln1.* holds the gradients of *.ln2.*")),
        ("layers", "stack_backward", [LAYER_NAMES],
         ("gradients under other names, each right for the name it came from",
          "0.* holds the gradients of 2.*"))],
    "decoder": [
        ("layers", "stack_backward", [LAYER_NAMES],
         ("gradients under other names, each right for the name it came from",
          "2.* holds the gradients of 0.*"))],
    "decoder_only": [
        ("sign", "stack_backward", [("encoder.stack_backward(dy,", "encoder.stack_backward(-dy,")],
         "the wrong sign"),
        ("constant", "stack_backward", [("encoder.stack_backward(dy,",
                                         "encoder.stack_backward(2 * dy,")],
         ("factor 2", "too many")),
        ("zero", "stack_backward", [("encoder.stack_backward(dy,",
                                     "encoder.stack_backward(0 * dy,")], "all zero"),
        ("constant", "stack_backward", [("encoder.stack_backward(dy,",
                                         "encoder.stack_backward(3 * dy,")],
         ("a factor 3 (= the number of layers n) too many",)),
        ("passed", "stack_backward", [("return encoder.stack_backward(dy, cache, out)",
                                       "return dy, encoder.stack_backward(dy, cache, out)[1]")],
         "it is dy, the gradient your backward was given, passed through unchanged")],
    "loss": [
        ("sign", "backward", [("return dz, {}", "return -dz, {}")], "the wrong sign"),
        ("sign", "backward", [("dz -= off * weight_col", "dz += off * weight_col")],
         "the smoothing's term of dz = p - q has the wrong sign"),
        ("sign", "backward", [("dz[xp.arange(n), targets] -=", "dz[xp.arange(n), targets] +=")],
         "the target's term of dz = p - q has the wrong sign"),
        ("constant", "backward", [("dz -= off * weight_col", "dz -= smoothing / v * weight_col")],
         ("the smoothing's term of dz = p - q is 0.857143 times the right one",
          "V/(V - 1)", "missing")),
        ("constant", "backward", [("off = smoothing / (v - 1)", "off = smoothing / v")],
         "eps/V where eps/(V-1) belongs"),
        ("where", "backward", [("dz -= off * weight_col", "dz -= off * dloss")],
         ("elements are wrong", "wrong exactly on the padding rows (where cache.keep is 0)")),
        ("where", "backward", [("return dz, {}", "dz[2] *= 2\n    return dz, {}")],
         ("7 of 35 elements are wrong", "only in row 2", "yours is 2 times the right value "
          "there (a factor 2 too many)"))],
    "output": [
        ("sign", "forward_backward", [(LAST, SCALED.format(-1) + LAST)], "the wrong sign"),
        ("constant", "forward_backward", [(LAST, SCALED.format(2) + LAST)],
         ("factor 2", "too many")),
        ("zero", "forward_backward", [(LAST, SCALED.format(0) + LAST)], "all zero"),
        ("where", "forward_backward", [("dh[part], g = linear.backward(dz, c_out)",
                                        "_, g = linear.backward(dz, c_out)"),
                                       ("dh = xp.empty_like(h)", "dh = xp.zeros_like(h)")],
         ("elements are wrong", "only in rows 4 to 10 (n)"))],
    "adam": [
        ("pair", "coefficients", [("float(lr) / (1.0 - beta1 ** step)", "float(lr)"),
                                  ("1.0 / math.sqrt(1.0 - beta2 ** step)", "1.0")],
         ("two mistakes at once", "no bias correction of m", "no bias correction of v")),
        ("where", "LRSchedule.__call__", [("min(step ** -0.5,", "min(step ** -0.4,")],
         ("3 of 9 elements are wrong", "wrong exactly after the warm-up (steps above 4000)")),
        ("constant", "LRSchedule.__call__", [("self.d_model ** -0.5", "self.d_model ** 0.5")],
         "sqrt(d_model) squared")],
    "model": [
        ("constant", "stacks_backward", [("encoder.stack_backward(dmemory,",
                                    "encoder.stack_backward(2 * dmemory,")],
         ("factor 2", "too many")),
        ("sign", "stacks_backward", [("decoder.stack_backward(dh,", "decoder.stack_backward(-dh,")],
         "the wrong sign")],
    "kernel_dropout": [
        ("bounds", "dropout_backward", [("if (i < n)", "if (i <= n)")],
         "outside its 300 elements"),
        ("constant", "dropout_backward", [("dy[i] * scale", "dy[i]")],
         ("1/(1-p), the dropout's scale", "missing")),
        ("where", "dropout_backward", [("keep[i] ?", "true ?")],
         ("elements are wrong", "wrong exactly where keep is false"))],
    "kernel_softmax": [
        ("constant", "softmax_backward", [("* p[row + j] * scale", "* p[row + j]")],
         ("the scale c", "missing")),
        ("race", "softmax_backward", [("j < cols; j += blockDim.x) dot",
                                       "j <= cols; j += blockDim.x) dot")],
         "a race between blocks"),
        ("deadlock", "softmax_backward", [("dot = block_sum(dot, scratch);",
                                           "if (threadIdx.x < 32) dot = block_sum(dot, "
                                           "scratch);")], ("deadlock", ".cu, line "))],
    "kernel_layernorm": [
        ("race", "layernorm_forward", [("if (threadIdx.x == 0) rstd", "rstd")], "a race"),
        ("bounds", "layernorm_forward", [("c < d; c += blockDim.x) s +=",
                                          "c <= d; c += blockDim.x) s +=")], "outside its"),
        ("constant", "layernorm_forward", [("float v = xhat[row + c] * r;",
                                            "float v = xhat[row + c] * r * 2;")],
         ("a factor 2", "too many"))],
    "kernel_loss": [
        ("race", "smoothed_loss", [("    __syncthreads();\n    float total", "    float total")],
         "a race"),
        ("where", "smoothed_loss", [("if (j == y) d -=", "if (j == y + 1) d -=")],
         ("6 of 1200 elements are wrong", "only in rows 0, 2 and 3"))],
}
# the classes of mistake each exercise must have planted (its own or named) at least once
CLASSES = {"layernorm": {"sign", "constant", "pair"}, "softmax": {"sign"},
           "loss": {"sign", "constant", "where"}, "residual": {"sign"},
           "encoder": {"layers"}, "decoder": {"layers"}, "adam": {"pair", "where"},
           "feedforward": {"mask"}}


def diagnoses(result: report.Report) -> list[str]:
    found = [a.diagnosis or "" for case in result.cases for a in case.arrays if not a.ok]
    return found + [case.problem for case in result.cases if case.problem]


def _planted():
    for ex in EXERCISES:
        for kind, function, edits, words in PLANTED.get(ex.name, []):
            words = (words,) if isinstance(words, str) else words
            yield pytest.param(ex, function, edits, words, id=f"{ex.name}: {kind}: {words[0]}")


def fails_naming(ex, edits: dict, words, folder) -> str:
    """Check ``ex`` with ``edits`` planted: it fails, one diagnosis holds all of ``words``, and
    the report is at most :data:`report.LINES` lines. The report."""
    path = write_exercise(folder, ex, edits)
    result = check.run_check(ex, path)
    text = report.describe(result)
    assert result.status == "fail", text
    assert any(all(w in d for w in words) for d in diagnoses(result)), text
    assert len(text.splitlines()) <= report.LINES, text
    return text


@pytest.mark.parametrize("ex, function, edits, words", list(_planted()))
def test_planted_mistakes_are_named(ex, function, edits, words, folder):
    fails_naming(ex, {function: edits}, words, folder)


def _named():
    for ex in EXERCISES:
        for mistake in ex.mistakes:
            yield pytest.param(ex, mistake, id=f"{ex.name}: {mistake.label[:40]}")


@pytest.mark.parametrize("ex, mistake", list(_named()))
def test_named_mistakes_are_named(ex, mistake, folder):
    fails_naming(ex, {mistake.function: [(mistake.old, mistake.new)]}, (mistake.label,), folder)


def test_every_exercise_has_mistakes_of_its_classes_planted():
    for ex in EXERCISES:
        planted = PLANTED.get(ex.name, [])
        assert len(planted) + len(ex.mistakes) >= 3, ex.name
        assert CLASSES.get(ex.name, set()) <= {kind for kind, *_ in planted}, ex.name


def test_a_mistake_in_a_stack_prints_once_with_a_count(folder):
    ex = by_name("model")
    mistake = ex.mistakes[0]                # the encoder gets no gradient: 37 of them at once
    text = fails_naming(ex, {mistake.function: [(mistake.old, mistake.new)]},
                        (mistake.label,), folder)
    flat = " ".join(text.split())
    assert flat.count(mistake.label[:30]) == 1, text        # once, the other cases as above
    assert flat.count("d(enc.*) (39 in all) wrong, as above") == 1, text
    assert "demb and d(enc.*) (37 in all): WRONG, relative errors" in flat, text
