"""One file per layer, in the order a reader meets them: linear, embedding, positional, dropout,
inputs, layernorm, feedforward, softmax, attention, residual, encoder, decoder, decoder_only,
loss and output. Each file has the math and the derivation of its backward pass in its
docstring, then the code. ``inputs`` (embedding, positions, dropout) and ``output`` (the tied
projection and the loss) are the ends both models share; ``encoder`` and ``decoder`` are the translator's stacks,
``decoder_only`` the language model's.

The contract every layer keeps
------------------------------
    out, cache = forward(inputs..., params, settings...)
    *d_inputs, grads = backward(dout, cache, out=None)      # out: a parameter layer's only

- ``params`` is a dict of the layer's arrays under its own local names ("w", "gamma", "w_qkv"),
  and ``param_shapes(...)`` declares those names and their shapes, in order. A layer without
  parameters (positional, dropout, scaled dot-product attention) takes none.
- ``grads`` is a dict with the same local names as ``params`` ({} for a layer without any).
- ``d_inputs`` holds the gradient of each array input the output flows from, in the order of
  forward's arguments: ``dx`` for most layers, ``(dx, dmemory)`` for cross-attention, ``(dq, dk,
  dv)`` for scaled dot-product attention, ``dlogits`` for the loss. Token ids have no gradient
  and get None in their place (embedding returns ``(None, grads)``). Masks, targets, the dropout
  generator and settings such as ``n_heads`` are constants, not inputs: no gradient.
- ``cache`` is a NamedTuple defined in the layer's file (``linear.Cache``,
  ``attention.SelfCache``); whatever the backward pass needs is in it, and only the layer that
  built it reads it. A caller passes it back whole, or reads a named field
  (``layer_cache.self_attn.sublayer.attention.p``), never a position. Layers hold no state, so a
  layer can be used several times in one step (the shared embedding is used three times).

Why dicts for parameters, in every layer: the composite layers (attention, the encoder and
decoder layers and stacks) take from four to several hundred arrays, and a dict slice of the
model's flat parameter dict (``subdict(params, "enc.0.")``) hands them over by name; gradients
come back under the same local names, which the caller puts back under its prefix
(``prefixed(grads, "enc.0.")``). The leaf layers take the same shape of argument so that one
rule holds everywhere: ``grads`` has exactly the keys of ``params``.

Three layers need a word more:
- ``loss.forward`` returns the pair ``(loss_sum, nll_sum)`` as its output; ``dout`` is the
  gradient of ``loss_sum`` (the negative log-likelihood is reported, not trained).
- ``output.forward_backward`` is forward and backward in one call, over chunks of rows: the
  loss is the last layer, so each chunk's (rows, V) logits are dropped as soon as their gradient
  is taken, and a step never holds all (N, V) of them.
- ``residual`` wraps another layer F: ``forward`` takes ``sublayer(h) -> (out, cache)``, and
  ``backward`` takes the matching ``sublayer_backward``; the residual's gradient for its input F
  is whatever F's backward returns after its dx (the gradients of F's other inputs and of its
  parameters), so it returns ``(dx, *rest_of_F, ln_grads)``: still its inputs, then its own
  parameters (the LayerNorm's).

The gradient rule: ``out=``
---------------------------
A parameter layer's backward takes an optional ``out``, a dict of arrays with the names and
shapes of its parameters, and *overwrites* them with its gradients (``matmul(..., out=)``,
``sum(..., out=)``), returning those same arrays in ``grads``. A model passes views of one flat
gradient buffer (``subdict(out, "enc.0.")``; :mod:`minitfm.flat`), so a step fills the whole
buffer without a copy, and whatever the buffer held before does not matter. Without ``out`` the
gradients are new arrays. Composite layers hand each part of their ``out`` down (``out_part``).
Parameterless layers take no ``out``; scaled dot-product attention's ``dq_out``, ``dk_out``,
``dv_out`` follow the same rule for its input gradients (views of merged heads).

The one exception is ``embedding.backward`` (and ``inputs.backward``, which is it): it *adds*
into ``out["table"]``. A token table is used up to three times in one step (source embedding,
target embedding, output projection) and its gradient is the sum of those uses; the scatter-add
that computes the embedding's gradient is itself a sum into an array, so adding into the buffer
where the other uses' gradients already are costs nothing and spares a (V, d) temporary. The
model writes the first use (the output projection overwrites, as every other layer does) and the
embeddings add to it; when nothing was written first, it zeroes the buffer.

The in-place rule
-----------------
Layers write into the arrays they create wherever that saves memory: ``residual`` applies
dropout to the sub-layer's output and adds x to it *in place*, and the loss turns its logits into
the softmax in place. So no layer may keep its own output in its cache (nor a view of it): the
array it returns belongs to the caller, who may overwrite it. A layer may keep its inputs and
its intermediate arrays (linear keeps x; layernorm keeps xhat, not y).

A backward pass leaves its ``dout`` and its cache as they were, but for what its own file says
it consumes (softmax's dP becomes dS in place; the loss turns its cached exponentials into the
gradient): a composite reads a gradient again after handing it down (pre-LN's residual adds dy
to the sub-layer's path), and a cache holds the layer's inputs and parameters themselves. The
workshop's checks hold a learner's backward to this rule.

Fast paths
----------
A layer's plain ``forward`` and ``backward`` hold the textbook's code alone. Its fast paths live
apart, in the file of the same name in ``minitfm/speed/``: they take the same arguments and give
the same results, and :mod:`minitfm.speed.policy` chooses one per call, outside the plain
function (:func:`minitfm.speed.explain` says which). float64, the gradient checks' type, runs
the plain code of every layer, and so does a run that never imports ``minitfm.speed`` (the plain
code chosen, at float32 precision). A composite's plain code calls the other layers'
functions, each choosing its own path; a pass that joins several layers (post-LN's residual add
and LayerNorm on the same rows) is the composite's own fast path.

Incremental decoding
--------------------
Generating one position at a time reuses the keys and values of the earlier positions. The
one-position ``*_step`` functions (``attention.self_step``, ``attention.cross_step``,
``residual.step``, ``decoder.layer_step``, ``decoder.stack_step``, ``decoder_only.layer_step``,
``decoder_only.stack_step``) sit right below the full-sequence ``*_forward`` they mirror, take the
per-layer key/value arrays explicitly, return the output alone (no dropout, nothing for a
backward pass) and are held equal to the forward pass by the tests.
"""


def subdict(params, prefix):
    """The entries of ``params`` whose names start with ``prefix``, with the prefix removed."""
    n = len(prefix)
    return {k[n:]: v for k, v in params.items() if k[:n] == prefix}   # (faster than startswith)


def out_part(out, prefix):
    """``subdict(out, prefix)``, or None when there is no ``out`` (see the contract above)."""
    return None if out is None else subdict(out, prefix)


def stack_param_shapes(layer_shapes: dict, n_layers: int, final_ln: dict | None = None) -> dict:
    """A stack's parameter shapes: "{i}." + ``layer_shapes`` for each of its ``n_layers``
    layers, then "ln." + ``final_ln`` (the final LayerNorm of a pre-LN stack) when given."""
    shapes = {}
    for i in range(n_layers):
        shapes.update(prefixed(layer_shapes, f"{i}."))
    if final_ln is not None:
        shapes.update(prefixed(final_ln, "ln."))
    return shapes


def prefixed(grads, prefix):
    """``grads`` (or any dict keyed by name) with ``prefix`` put in front of every name."""
    return {prefix + k: v for k, v in grads.items()}
