"""The exercises' named mistakes: for each exercise, the typical wrong lines of its code, each
given as an edit of the library's own code (the function, the text, its wrong replacement).

The diagnosis (:mod:`minitfm.learn.alternatives`, :mod:`minitfm.learn.diagnose`) runs the
library's code with each edit on the learner's inputs, and where the learner's results are the
ones an edit gives, it names the mistake. A term of a derivation (:func:`term`) is named left
out, and, from its share of the right result, with the wrong sign, counted twice or off by
another constant, alone or with a second term; two named mistakes made at once are tried where
nothing else fits. The tests plant these and other mistakes in the library's code and hold the
diagnosis to naming each; an edit whose text the library no longer has fails a test.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Mistake", "term", "MISTAKES"]


@dataclass(frozen=True)
class Mistake:
    """``label``: what the diagnosis says; in function ``function`` of the exercise's module the
    text ``old`` (found exactly once) becomes ``new``. ``term`` and ``about``: where the edit
    leaves out a term of the derivation (:func:`term`), its name and what it is."""
    label: str
    function: str
    old: str
    new: str
    term: str = ""
    about: str = ""


def term(name: str, about: str, function: str, old: str, new: str) -> Mistake:
    """Term ``name`` of the derivation ("term 2 of dx"), ``about`` what it is, left out by the
    edit: the diagnosis names it missing, and from its share of the right gradient also with the
    wrong sign, counted twice, or off by another constant, alone or with a second term."""
    return Mistake(f"{name} is missing: {about}", function, old, new, name, about)


# the encoder layer's two residual sub-layers, each taking the gradient {} (dy or dx)
FEED_FORWARD_BACK = (
    '    dx, g_ff, g_ln2 = residual.backward(\n'
    '        {}, cache.ff, lambda d, c: feedforward.backward(d, c, out_part(out, "ff.")),\n'
    '        out_part(out, "ln2."))\n')
SELF_ATTENTION_BACK = (
    '    dx, g_attn, g_ln1 = residual.backward(\n'
    '        {}, cache.self_attn, lambda d, c: attention.self_backward(d, c, out_part(out, '
    '"attn.")),\n'
    '        out_part(out, "ln1."))\n')
# every stack's (the encoder's and the decoder's; the decoder-only stack's is the encoder's)
STACK = (
    Mistake("the final LayerNorm's backward is skipped (pre-LN): dy must go through "
            "layernorm.backward first", "stack_backward",
            "dy, g = layernorm.backward(dy, cache.ln", "_, g = layernorm.backward(dy, cache.ln"),
    Mistake("the layers in the forward order: the backward pass visits them from the last to "
            "the first", "stack_backward", "for i in reversed(range(len(cache.layers))):",
            "for i in range(len(cache.layers)):"))

# exercise -> its named mistakes
MISTAKES = {
    "embedding": (
        Mistake("the rows are assigned, not added: a token that occurs several times must get the "
                "sum of its rows' gradients (a scatter-add)", "backward",
                "backend.scatter_add(dtable, cache.ids.reshape(-1), scaled)",
                "dtable[cache.ids.reshape(-1)] = scaled"),),
    "positional": (
        Mistake("the learned table's rows are not summed over the batch (one sequence's gradient "
                "only)", "learned_backward", "dy.reshape(-1, length, dy.shape[-1]).sum(axis=0)",
                "dy.reshape(-1, length, dy.shape[-1])[0]"),
        Mistake("the gradient lands on the wrong rows of the table: row offset + t was used by "
                "position t", "learned_backward", "dtable[cache.offset:cache.offset + length]",
                "dtable[:length]")),
    "dropout": (
        Mistake("the mask is not applied: only the scale 1/(1-p)", "backward",
                "apply(dy, cache.keep, cache.scale)", "dy * cache.scale"),
        Mistake("the mask is inverted: the gradient passes where the forward pass kept the "
                "element (keep), and is 0 where it dropped it", "backward",
                "apply(dy, cache.keep, cache.scale)", "apply(dy, ~cache.keep, cache.scale)")),
    "inputs": (
        Mistake("dropout's backward is skipped: dy must go through the dropout's mask and scale "
                "first", "backward", "dx, _ = dropout.backward(dy, cache.dropout)", "dx = dy"),
        Mistake("word dropout's mask is not applied to the embedding's gradient", "backward",
                "dx = dropout.apply(dx, cache.words.keep, cache.words.scale)", "pass"),
        Mistake("word dropout's mask is inverted: the embedding's gradient passes for the words "
                "kept (cache.words.keep), and is 0 for those dropped", "backward",
                "dropout.apply(dx, cache.words.keep,", "dropout.apply(dx, ~cache.words.keep,")),
    "layernorm": (
        term("term 1 of dx", "g, the direct path through xhat", "backward", "g *= rstd ",
             "g = (g - dy * gamma) * rstd "),
        term("term 2 of dx", "-mean(g), the path through the mean mu", "backward", "g -= mean_g ",
             "g -= 0.0 * mean_g "),
        term("term 3 of dx", "-xhat * mean(g * xhat), the path through the variance", "backward",
             "g -= xhat * mean_gx", "g -= 0.0 * xhat * mean_gx"),
        Mistake("the final scale rstd of dx is missing", "backward", "g *= rstd ", "g *= 1.0 "),
        Mistake("mean(g) is over the whole array: each row's mean is over its own d features (the "
                "last axis)", "backward", "g.mean(axis=-1, keepdims=True)", "g.mean()"),
        Mistake("gamma is missing from term 1: g = dy * gamma is the gradient of xhat", "backward",
                "g = dy * gamma ", "g = dy * 1.0 "),
        Mistake("dgamma sums dy alone: it is sum_rows dy * xhat", "backward",
                "dy.reshape(-1, d), xhat.reshape(-1, d))",
                "dy.reshape(-1, d), 0 * xhat.reshape(-1, d) + 1)")),
    "feedforward": (
        Mistake("the ReLU's mask lets every element through: the gradient passes only where h > 0 "
                "(a > 0, not a >= 0: a = max(0, h) is never negative)", "backward",
                "da *= cache.a > 0 ", "da *= 1.0 "),
        Mistake("the ReLU's mask is inverted: the gradient passes where h > 0 (a > 0), and is 0 "
                "where h <= 0", "backward", "da *= cache.a > 0 ", "da *= cache.a <= 0 "),
        Mistake("the ReLU dropout's backward is skipped: its mask and scale", "backward",
                "da, _ = dropout.backward(da, cache.dropout)", "pass")),
    "softmax": (
        term("the softmax Jacobian's first term", "P * dP", "backward", "dp -= backend.xp.einsum",
             "dp = 0 * dp - backend.xp.einsum"),
        term("the softmax Jacobian's second term", "-P * rowsum(dP * P)", "backward",
             "dp -= backend.xp.einsum", "dp -= 0.0 * backend.xp.einsum"),
        Mistake("the rowsum is over the wrong axis: each row sums over its keys (the last axis)",
                "backward", '"...ts,...ts->...t", dp, p)[..., None]',
                '"...ts,...ts->...s", dp, p)[..., None, :]')),
    "attention": (
        Mistake("dV uses P, the weights before dropout: O = P' V with P' = dropout(P) "
                "(cache.p_dropped)", "sdpa_backward", "cache.p_dropped.swapaxes(-1, -2)",
                "cache.p.swapaxes(-1, -2)"),
        Mistake("the attention dropout's backward is skipped on dP", "sdpa_backward",
                "dp, _ = dropout.backward(dp, cache.dropout)", "pass"),
        Mistake("dQ and dK in each other's places in dqkv: split_heads gives Q, K and V in that "
                "order", "self_backward", "cache.attention, dq, dk, dv)",
                "cache.attention, dk, dq, dv)")),
    "residual": (
        term("the identity path (pre-LN)", "dx = dy + the sub-layer path's", "backward",
             "dx += dy ", "dx += 0.0 * dy "),
        term("the identity path (post-LN)", "dx = ds + the sub-layer path's, ds = LN'(dy)",
             "backward", "dx += ds ", "dx += 0.0 * ds "),
        term("the sub-layer path (pre-LN)", "dx = dy + LN'(F'(Dropout'(dy)))", "backward",
             "dx += dy ", "dx = 0.0 * dx + dy "),
        term("the sub-layer path (post-LN)", "dx = ds + F'(Dropout'(ds)), ds = LN'(dy)", "backward",
             "dx += ds ", "dx = 0.0 * dx + ds "),
        Mistake("the identity path adds dy (post-LN): the sum s = x + F(x) is below the "
                "LayerNorm, so it adds ds = LN'(dy)", "backward", "dx += ds ", "dx += dy "),
        Mistake("the dropout's backward is skipped on the sub-layer's path", "backward",
                "df, _ = dropout.backward(ds, cache.dropout)", "df = ds")),
    "encoder": (
        *STACK,
        Mistake("the sub-layers in the forward order: a layer's backward pass takes the "
                "feed-forward network's residual first, then the self-attention's",
                "layer_backward",
                FEED_FORWARD_BACK.format("dy") + SELF_ATTENTION_BACK.format("dx"),
                SELF_ATTENTION_BACK.format("dy") + FEED_FORWARD_BACK.format("dx"))),
    "decoder": (
        *STACK,
        Mistake("dmemory is not summed over the layers: every layer's cross-attention reads the "
                "encoder output", "stack_backward", "dmemory += dm", "dmemory = dm")),
    "loss": (
        Mistake("label smoothing is ignored: the target q puts 1 - eps on y and eps/(V-1) on each "
                "other class", "backward", "off = smoothing / (v - 1)",
                "off, smoothing = 0.0, 0.0"),
        Mistake("eps/V where eps/(V-1) belongs: q spreads eps over the V - 1 classes other than y",
                "backward", "off = smoothing / (v - 1)", "off = smoothing / v"),
        Mistake("padding rows are not zeroed: a row whose target is padding has no loss and no "
                "gradient", "backward", "weight = dloss if keep is None else dloss * keep",
                "weight = dloss + 0 * keep"),
        Mistake("the padding mask is inverted: the padding rows (target = the padding id) get a "
                "gradient, and the other rows none", "backward",
                "dloss if keep is None else dloss * keep",
                "dloss if keep is None else dloss * (1 - keep)"),
        Mistake("p is not normalised: the cache holds exp(z - max), which inv_total turns into "
                "the softmax", "backward", "inv_total[:, None] * weight_col", "weight_col"),
        Mistake("the target's term is at the class before the target: q_y sits at column "
                "targets[i] of row i", "backward", "dz[xp.arange(n), targets]",
                "dz[xp.arange(n), targets - 1]"),
        term("the term p of dz = p - q", "the softmax, exp(z - max) * inv_total", "backward",
             "dz *= inv_total[:, None] * weight_col", "dz *= 0.0"),
        term("the smoothing's term of dz = p - q", "-eps/(V-1) on every class, q's share off the "
             "target", "backward", "dz -= off * weight_col", "dz -= 0.0 * off * weight_col"),
        term("the target's term of dz = p - q", "-(1 - eps - eps/(V-1)) on the target's class, "
             "the rest of q_y = 1 - eps", "backward", "-= (1.0 - smoothing - off) * weight",
             "-= 0.0 * weight")),
    "output": (
        Mistake("dE holds only the last chunk's share: every chunk's rows add their dz^T h to it "
                "(the first chunk writes it)", "forward_backward", 'dtable += g["w"].T',
                'dtable[...] = g["w"].T'),),
    "adam": (
        Mistake("no bias correction of m: divide lr by 1 - beta1^t", "coefficients",
                "float(lr) / (1.0 - beta1 ** step)", "float(lr)"),
        Mistake("no bias correction of v: v_hat = v / (1 - beta2^t)", "coefficients",
                "1.0 / math.sqrt(1.0 - beta2 ** step)", "1.0"),
        Mistake("v averages g, not g^2", "adam_step", "xp.multiply(g, g, out=buf)",
                "xp.multiply(g, 1.0, out=buf)"),
        Mistake("eps is inside the square root: the update divides by sqrt(v_hat) + eps",
                "adam_step", "xp.sqrt(v, out=buf)\n    buf *= v_scale\n    buf += eps",
                "xp.sqrt(v * v_scale ** 2 + eps, out=buf)"),
        Mistake("eps is left out: the update divides by sqrt(v_hat) + eps", "adam_step",
                "buf += eps", "buf += 0.0"),
        Mistake("the warm-up is wrong: step * warmup^-1.5 rises linearly to the peak",
                "LRSchedule.__call__", "step * self.warmup ** -1.5", "step * self.warmup ** -0.5"),
        Mistake("the larger of the two terms: the rate is the smaller, min(step^-0.5, step * "
                "warmup^-1.5), rising during the warm-up and decaying after it",
                "LRSchedule.__call__", "min(step ** -0.5,", "max(step ** -0.5,"),
        Mistake("the warm-up's rise goes on after the warm-up: past warmup steps the rate decays "
                "as step^-0.5", "LRSchedule.__call__",
                "min(step ** -0.5, step * self.warmup ** -1.5)", "step * self.warmup ** -1.5"),
        Mistake("no warm-up: for the first warmup steps the rate rises as step * warmup^-1.5",
                "LRSchedule.__call__", "min(step ** -0.5, step * self.warmup ** -1.5)",
                "step ** -0.5")),
    "model": (
        Mistake("the encoder gets no gradient: dmemory must go back through the encoder stack",
                "stacks_backward", "encoder.stack_backward(dmemory,",
                "encoder.stack_backward(0 * dmemory,"),
        Mistake("the source table is zeroed over the target's uses: with a shared table "
                "(share_embeddings) the uses add up", "stacks_backward", "if src_name != tgt_name:",
                "if True:"),
        Mistake("the target inputs' backward is skipped: dy, the decoder stack's dx, goes back "
                "into the target table", "stacks_backward",
                'inputs.backward(dy, c_tgt.embed, {"table": out[tgt_name]})', "None")),
    "kernel_dropout": (
        Mistake("the mask is inverted: dx = dy * scale where keep[i] is true, 0 where it is false",
                "dropout_backward", "keep[i] ?", "!keep[i] ?"),),
    "kernel_softmax": (
        Mistake("the row's sum of dP * P is not reduced over the block: each thread used its own "
                "share (block_sum adds the threads' shares)", "softmax_backward",
                "dot = block_sum(dot, scratch);", ""),
        Mistake("the second term is missing: dS = (dP - rowsum(dP * P)) * P * scale, the rowsum "
                "the dot", "softmax_backward", "(dp[row + j] - dot)", "(dp[row + j])"),
        Mistake("the second term has the wrong sign: dS = (dP - rowsum(dP * P)) * P * scale",
                "softmax_backward", "(dp[row + j] - dot)", "(dp[row + j] + dot)")),
    "kernel_layernorm": (
        Mistake("the mean is not reduced over the block: each thread used its own share of the "
                "row's sum (block_sum adds the threads' shares)", "layernorm_forward",
                "float mu = block_sum(s, scratch) / d;", "float mu = s / d;"),
        Mistake("the variance is not reduced over the block: each thread used its own share of "
                "the squares", "layernorm_forward",
                "sqrtf((float)d / (block_sum(ss, scratch) + d_eps))",
                "sqrtf((float)d / (ss + d_eps))"),
        Mistake("the variance is divided by d - 1: LayerNorm's variance is the mean of the "
                "squares of x - mu over the row's d elements", "layernorm_forward",
                "sqrtf((float)d /", "sqrtf((float)(d - 1) /")),
    "kernel_loss": (
        Mistake("the target's own term of the gradient is missing: dz_y also gets -(1 - eps - "
                "eps/(V-1)) * weight", "smoothed_loss",
                "if (j == y) d -= (1.0f - smoothing - off) * weight;", ""),
        Mistake("padding rows are not zeroed: keep is 0 on a row whose target is pad_id",
                "smoothed_loss", "float keep = (pad_id >= 0 && y == pad_id) ? 0.0f : 1.0f;",
                "float keep = 1.0f;"),
        Mistake("the padding mask is inverted: keep is 0 on a row whose target is pad_id, 1 on "
                "the others", "smoothed_loss", "(pad_id >= 0 && y == pad_id) ? 0.0f : 1.0f",
                "(pad_id >= 0 && y == pad_id) ? 1.0f : 0.0f")),
}
