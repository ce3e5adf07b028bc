"""The workshop's exercises, one row each, in reading order: every layer of ``minitfm/layers/``
that has a backward pass, Adam with the paper's schedule, the whole encoder-decoder backward,
then four CUDA kernels. Each row (:class:`~minitfm.learn.exercise.Exercise`) names the library's
module, the functions the learner writes (their bodies blanked), the functions kept beside them
(the forward pass), the gradient checks that judge it (``minitfm.gradcheck``'s cases, by name),
its kind, its hints, the sizes its check runs at, and a kernel's launch; its named mistakes,
typical wrong lines the diagnosis names, are in ``mistakes.py``, by the exercise's name.
"""

from __future__ import annotations

import dataclasses

import numpy

from minitfm.backend import philox
from minitfm.learn.exercise import Exercise
from minitfm.learn.kinds import KERNEL, LAYER, MODEL, OPTIM
from minitfm.learn.mistakes import MISTAKES
from minitfm.speed import fused

__all__ = ["EXERCISES", "by_name", "ORDER", "make", "dropout_scale"]


def dropout_scale(p: float) -> float:
    """The scale 1 / (1 - p') of a dropout of probability p, as the masks draw it (p rounded to
    a multiple of 2^-16: backend.dropout_keep)."""
    return float(philox.dropout_threshold(p)[1])


KEEP_P = {"1/(1-p), the dropout's scale": dropout_scale(0.3)}
LAYERS = {"n": "the number of layers n"}        # a stack's n (a loss's n is its rows)
ATTENTION_CASES = ("attention (padding mask)", "attention (causal mask)", "attention (dropout)",
                   "multi-head self-attention", "multi-head self-attention (dropout)",
                   "multi-head cross-attention", "multi-head cross-attention (dropout)")


def _stack(name: str, title: str, cases: tuple[str, ...]):
    """An exercise of a stack of layers (encoder, decoder, decoder-only)."""
    return Exercise(
        name, title, f"minitfm.layers.{name}", ("layer_backward", "stack_backward"),
        ("LayerCache", "StackCache", "layer_forward", "stack_forward", "param_shapes"), cases,
        ("Run the forward pass backwards: the final LayerNorm first (pre-LN), then the layers "
         "from the last to the first, and in each layer its sub-layers from the last to the "
         "first, each residual.backward taking the gradient the one after it gave.",),
        quantities=LAYERS, sizes=STACKS, kind=LAYER)


# The sizes the exercises' checks run at (Exercise.sizes; a case takes those it has): every size
# its own, none 2, none the square of another, and d_model not 4 (whose root is 2), so that a
# size written in place of another, or a constant such as 2.0 in place of sqrt(d_model), fails.
ROWS = dict(b=3, t=5, d=6, f=7, v=7)            # f and v never in one case
HEADS = dict(b=3, h=4, t=5, s=6, dk=7)          # d_model = 28
STACKS = dict(b=6, h=4, t=7, s=8, dk=5, f=10, n=3)   # d_model = 20, three layers


def unwritten_array(shape, dtype) -> numpy.ndarray:
    """An output array as a launch finds it: NaN, the same in every process (an element the
    kernel should write and does not is NaN, where the twin's is a number)."""
    return numpy.full(shape, numpy.nan, dtype=dtype)


# The kernels' launches (Exercise.launch): (grid, args, words), the arrays drawn from ``rng``.
F32 = numpy.float32


def dropout_launch(rng):
    n = 300                                     # two blocks, the second part-full
    dy = rng.standard_normal(n).astype(F32)
    keep = rng.random(n) >= 0.3
    args = (dy, keep, unwritten_array(n, F32), fused.i64(n), fused.f32(dropout_scale(0.3)))
    return fused.grid_for(n), args, f"n = {n}: two blocks of {fused.THREADS} threads"


def softmax_launch(rng):
    rows, cols = 5, 300                         # a row longer than a block
    p = rng.random((rows, cols)).astype(F32)
    p /= p.sum(axis=1, keepdims=True)
    dp = rng.standard_normal((rows, cols)).astype(F32)
    return (rows,), (dp, p, fused.i32(cols), fused.f32(0.5)), \
        f"{rows} rows of {cols}: a block of {fused.THREADS} threads per row"


def layernorm_launch(rng):
    rows, d = 4, 300
    x = (rng.standard_normal((rows, d)) * 2 + 1).astype(F32)
    gamma, beta = (rng.standard_normal(d).astype(F32) for _ in range(2))
    y, xhat = unwritten_array((rows, d), F32), unwritten_array((rows, d), F32)
    rstd = unwritten_array((rows, 1), F32)
    y16 = unwritten_array((rows, d), numpy.float16)
    args = (x, gamma, beta, y, xhat, rstd, fused.i32(d), fused.f32(d * 1e-5), y16, fused.i32(0))
    return (rows,), args, (f"{rows} rows of {d}: a block of {fused.THREADS} threads per row "
                           f"(half_out 0: y16 is not written)")


def loss_launch(rng):
    n, v = 4, 300
    z = (rng.standard_normal((n, v)) * 3).astype(F32)
    targets = rng.integers(1, v, size=n).astype(numpy.int64)
    targets[1] = 0                              # a padding row (pad_id 0)
    sums = unwritten_array(2 * n, F32)
    args = (z, targets, sums, fused.i64(n), fused.i32(v), fused.f32(0.1),
            fused.f32(0.1 / (v - 1)), fused.i64(0), fused.f32(0.25), fused.i32(1), sums,
            fused.i32(0))
    return (n,), args, (f"{n} rows of {v} logits, row 1 padding: a block of {fused.THREADS} "
                        f"threads per row, the gradient over z (grad 1)")


EXERCISES = [
    Exercise(
        "linear", "linear layer: y = x W + b", "minitfm.layers.linear", ("backward",),
        ("Cache", "param_shapes", "forward"), ("linear",),
        ("Flatten x and dy to rows; each y_nj = sum_i x_ni W_ij + b_j, so dx takes dy back "
         "through W, dW sums x_ni dy_nj over the rows n, and db sums dy over the rows.",),
        quantities={},
        sizes=ROWS, kind=LAYER),
    Exercise(
        "embedding", "token embedding, scaled by sqrt(d_model)", "minitfm.layers.embedding",
        ("backward",), ("Cache", "param_shapes", "forward"), ("embedding",),
        ("Row n of y is row ids[n] of the table times the scale: each table row gets the sum of "
         "the scaled dy rows of the tokens that chose it (a token may occur several times).",),
        sizes=ROWS, kind=LAYER),
    Exercise(
        "positional", "positions: the sinusoids, and a learned table", "minitfm.layers.positional",
        ("backward", "learned_backward"),
        ("forward", "learned_forward", "LearnedCache", "learned_param_shapes"),
        ("positional", "positional (learned)"),
        ("y = x + P: the sum passes dy through to x unchanged; the learned table's row offset+t "
         "gets dy[:, t] summed over the batch, and every other row 0.",),
        sizes=ROWS, kind=LAYER),
    Exercise(
        "dropout", "inverted dropout", "minitfm.layers.dropout", ("backward",),
        ("Cache", "forward", "apply"), ("dropout",),
        ("y = x * m / (1 - p) element by element, m and 1/(1-p) constants: dx = dy * m / (1 - p), "
         "the same mask and scale as the forward pass.",),
        quantities=KEEP_P,
        sizes=ROWS, kind=LAYER),
    Exercise(
        "inputs", "the input layer: embedding, positions, dropout", "minitfm.layers.inputs",
        ("backward",), ("Cache", "param_shapes", "forward"),
        ("inputs (embedding, learned positions, dropout)",
         "inputs (word dropout, sinusoids, dropout)"),
        ("Undo the forward pass's steps in reverse order: dropout's backward, then the "
         "positions' (the learned table's gradient), then word dropout's mask on the "
         "embedding's share only, then the embedding's scatter-add.",),
        quantities={**KEEP_P, "1/(1-p_w), word dropout's scale": dropout_scale(0.4)},
        sizes=ROWS, kind=LAYER),
    Exercise(
        "layernorm", "layer normalization", "minitfm.layers.layernorm", ("backward",),
        ("Cache", "param_shapes", "forward"), ("layernorm",),
        ("With g = dy * gamma the gradient of xhat, dx follows xhat = (x - mu) * rstd through "
         "three paths: xhat itself, the mean mu, and the variance inside rstd.",),
        sizes=ROWS, kind=LAYER),
    Exercise(
        "feedforward", "position-wise feed-forward network", "minitfm.layers.feedforward",
        ("backward",), ("Cache", "param_shapes", "forward"),
        ("feedforward", "feedforward (ReLU dropout)"),
        ("Back through the second linear layer, the ReLU dropout's mask, the ReLU (the gradient "
         "passes where h > 0), then the first linear layer.",),
        quantities=KEEP_P,
        sizes=ROWS, kind=LAYER),
    Exercise(
        "softmax", "the scaled, masked softmax of attention's scores", "minitfm.layers.softmax",
        ("backward",), ("forward",),
        ("softmax (scaled, padding mask)", "softmax (scaled, no mask)"),
        ("dP_j/dz_i = P_j (1[i = j] - P_i): contract it with dP over j, then the chain rule "
         "through z = s * c + m gives the factor c.",),
        quantities={"the scale c = 0.7": 0.7},
        sizes=HEADS, kind=LAYER),
    Exercise(
        "attention", "scaled dot-product and multi-head attention", "minitfm.layers.attention",
        ("sdpa_backward", "self_backward", "cross_backward"),
        ("SdpaCache", "SelfCache", "CrossCache", "sdpa_forward", "self_forward", "cross_forward",
         "self_param_shapes", "cross_param_shapes"), ATTENTION_CASES,
        ("Back through O = P' V (dV and dP'), the attention dropout, the softmax "
         "(softmax.backward folds in 1/sqrt(d_k)), then S = Q K^T: dQ = dS K, dK = dS^T Q; the "
         "multi-head layers wrap this between their projections' linear backward passes.",),
        quantities=KEEP_P,
        sizes=HEADS, kind=LAYER),
    Exercise(
        "residual", "the residual connection with LayerNorm", "minitfm.layers.residual",
        ("backward",), ("Cache", "forward", "add_dropped"),
        ("residual + LN (post-LN)", "residual + LN (pre-LN)"),
        ("The \"+\" of the forward pass is a fan-out backwards: x reaches the output along the "
         "identity and through the sub-layer, so dx is the sum of both paths' gradients.",
         "post-LN: ds = LN'(dy); dx = ds + F'(Dropout'(ds)); pre-LN: dx = dy + "
         "LN'(F'(Dropout'(dy)))"),
        quantities={"1/(1-p), the dropout's scale": dropout_scale(0.2)},
        sizes=ROWS, kind=LAYER),
    _stack("encoder", "the encoder layer and stack",
           ("encoder stack (post-LN)", "encoder stack (pre-LN)")),
    _stack("decoder", "the decoder layer and stack",
           ("decoder stack (post-LN)", "decoder stack (pre-LN)")),
    Exercise(
        "decoder_only", "the decoder-only stack (the language model)",
        "minitfm.layers.decoder_only", ("stack_backward",), ("stack_forward", "param_shapes"),
        ("decoder-only stack (post-LN)", "decoder-only stack (pre-LN)"),
        ("The forward pass is the encoder stack's under a causal mask, and a mask is a constant "
         "of the forward pass: what does the backward pass of that stack need to know of it?",
         "the forward pass is encoder.stack_forward under a causal mask, a constant: "
         "the backward pass is encoder.stack_backward's"),
        quantities=LAYERS, sizes=STACKS, kind=LAYER),
    Exercise(
        "loss", "label-smoothed cross-entropy with its log-softmax", "minitfm.layers.loss",
        ("backward",), ("Cache", "forward"),
        ("label-smoothed cross-entropy", "label-smoothed cross-entropy (no smoothing)"),
        ("Since the smoothed target q sums to 1, dloss/dz_j = sum_k q_k (p_j - [j = k]) = "
         "p_j - q_j: the softmax minus the target, times dloss, and 0 on padding rows.",),
        sizes=dict(n=5, v=7), kind=LAYER),
    Exercise(
        "output", "the output layer: tied projection and loss, in chunks",
        "minitfm.layers.output", ("forward_backward",), ("logits", "project"),
        ("output (tied projection, label-smoothed loss)",),
        ("z = h E^T, then the loss: its backward gives dz; as for a linear layer with W = E^T, "
         "dh = dz E and dE = dz^T h (the transpose of dW = h^T dz).",),
        constants={"LOGIT_CHUNK": 4 * 7},          # 4 rows of V = 7 logits a chunk
        sizes=dict(n=11, d=6, v=7),                # chunks of 4 rows: 4, 4 and 3
        kind=LAYER),
    Exercise(
        "adam", "Adam and the paper's learning-rate schedule", "minitfm.optim",
        ("LRSchedule.__call__", "coefficients", "adam_step"), ("LRSchedule",), kind=OPTIM,
        todo={"LRSchedule.__call__": [
                  "TODO: return the learning rate of equation (3) at update `step` (counted "
                  "from 1), d_model = self.d_model and warmup_steps = self.warmup, times "
                  "self.factor; time_fraction is for other schedules: leave it."],
              "coefficients": [
                  "TODO: return (b1, b2, step_size, v_scale, keep) for update `step` (counted "
                  "from 1): b1, b2 and keep as given, and step_size and v_scale the numbers "
                  "that make step_size * m / (sqrt(v) * v_scale + eps) equal lr * m_hat / "
                  "(sqrt(v_hat) + eps), m_hat and v_hat the bias-corrected moments of Adam "
                  "(Algorithm 1, at the top of this file). state: None in the check and in the "
                  "workshop's train (a loss scaler's, under mixed precision): leave it."],
              "adam_step": [
                  "TODO: one Adam step, in place: m and v updated, then p; p, g, m and v are "
                  "arrays of one shape (in the check (3, 4) and (5,), float64), b1, b2, eps, "
                  "step_size and v_scale numbers from coefficients. Returns nothing."]},
        hints=("lrate = d_model^-0.5 min(step^-0.5, step warmup^-1.5); Adam's m and v are "
               "running averages of g and g^2, divided by 1 - beta^t (their start at 0) before "
               "p moves by lr m_hat / (sqrt(v_hat) + eps).",
               "m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t): lr m_hat / "
               "(sqrt(v_hat) + eps) = [lr / (1 - beta1^t)] m / (sqrt(v) / sqrt(1 - "
               "beta2^t) + eps)")),
    Exercise(
        "model", "the whole encoder-decoder backward", "minitfm.models.translator",
        ("stacks_backward",), ("ForwardCache", "encoder_forward", "decoder_forward", "loss_and_grads"),
        ("model (post-LN)", "model (pre-LN)", "model (separate embeddings)"), kind=MODEL,
        hints=("From dh, the decoder stack's backward gives dy and dmemory; the target inputs' "
               "backward adds into the target table; dmemory goes back through the encoder "
               "stack, then the source inputs.",
               "dy, dmemory = the decoder stack's backward of dh; the target inputs' "
               "backward of dy; dx = the encoder stack's backward of dmemory; the source "
               "inputs' backward of dx (docs: the whole encoder-decoder backward pass)"),
        sizes=dict(batch=6, src_len=7, tgt_len=8),
        config={"*": dict(n_layers=3, d_model=20, n_heads=4, d_ff=10, src_vocab=11,
                          tgt_vocab=11),
                "model (separate embeddings)": dict(tgt_vocab=13)}),
    Exercise(
        "kernel_dropout", "CUDA: dropout's backward, an element a thread",
        "minitfm.layers.dropout", ("dropout_backward",), ("apply",), kind=KERNEL,
        launch=dropout_launch, kernel="minitfm.speed.dropout.BACKWARD", quantities=KEEP_P,
        hints=("One thread per element: i from the block and thread index; the threads past the "
               "end (the last block's) must do nothing.",)),
    Exercise(
        "kernel_softmax", "CUDA: the softmax's backward, a block per row",
        "minitfm.layers.softmax", ("softmax_backward",), ("backward",), kind=KERNEL,
        launch=softmax_launch, kernel="minitfm.speed.softmax.BACKWARD",
        quantities={"the scale c": 0.5},
        hints=("A block per row: each thread adds dP * P over its share of the row, block_sum "
               "adds the shares (it ends with a barrier), then each thread writes its share of "
               "dS = (dP - dot) * P * scale.",)),
    Exercise(
        "kernel_layernorm", "CUDA: LayerNorm's forward, a block per row",
        "minitfm.layers.layernorm", ("layernorm_forward",), ("forward",), kind=KERNEL,
        launch=layernorm_launch, kernel="minitfm.speed.layernorm.FORWARD",
        hints=("A block per row: sum the row (block_sum) for the mean, then the squares of "
               "x - mu for the variance, then write xhat, y and (thread 0) rstd.",)),
    Exercise(
        "kernel_loss", "CUDA: the label-smoothed loss and its gradient, a block per row",
        "minitfm.layers.loss", ("smoothed_loss",), ("row_losses", "backward"), kind=KERNEL,
        launch=loss_launch, kernel="minitfm.speed.loss.KERNEL",
        hints=("A block per row: the row's max (block_max), the sums of exp(z - max) and of "
               "z - max (block_sum), the loss from them, then dz = weight * (p - q) over the "
               "row.",)),
]

EXERCISES = [dataclasses.replace(e, number=k, mistakes=MISTAKES.get(e.name, ()))
             for k, e in enumerate(EXERCISES, 1)]
ORDER = [e.name for e in EXERCISES]


def by_name(name: str) -> Exercise:
    """The exercise ``name`` (a unique prefix, or its number, will do)."""
    if name.isdigit() and 1 <= int(name) <= len(EXERCISES):
        return EXERCISES[int(name) - 1]
    exact = [e for e in EXERCISES if e.name == name]
    found = exact or [e for e in EXERCISES if e.name.startswith(name)]
    if len(found) != 1:
        raise KeyError(name)
    return found[0]


def make(ex: Exercise, hard: bool = False) -> str:
    """The exercise's file, from the library's source as it is now (``hard``: without the
    derivation of the backward pass)."""
    return ex.kind.make(ex, hard, EXERCISES)
