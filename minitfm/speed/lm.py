"""The fast path of the language model's step on the CPU (``minitfm/models/lm.py``): a batch's
shards side by side on the worker's threads, chosen per call by :mod:`minitfm.speed.policy`.

The row passes (:mod:`minitfm.speed.rows`) share a layer's element-wise work among the worker's
threads, and the BLAS library shares its products; but the Python code between them runs on one
thread, and a product of the language model's size (1,056 rows of 128 for ``train_lm.py``'s
defaults) gains little from a second one. So on NumPy, with the row passes chosen (``--kernels
fused``, the default there), ``lm.loss_and_grads`` splits a batch of blocks into :data:`SHARDS`
shards of whole blocks and runs the plain function on each: side by side on the worker's
threads, each shard with its share of them for its own row passes and products (one each on two
cores), its gradients in a buffer of its own; then it adds the shards' losses and gradients, in
shard order. NumPy's loops, the BLAS library and the compiled loops run without the GIL, so two
shards keep two cores busy where one batch kept one and a half.

Rounding: the loss is the sum of the shards' (each divided by the whole batch's normalizer) and
each gradient the sum of the shards', where the whole batch sums over its rows in one product:
the same numbers up to float32 rounding, the tolerance its test states. The shards depend on the
batch's shape alone, never on the thread count: a run gives the same bits on one thread or two
(one thread runs the shards one after the other, at the whole batch's speed).

Dropout: each shard draws its masks from a generator of its own, keyed on a number drawn from the
batch's generator; the masks depend on the seed, the step and the batch as before, but are not
the whole batch's masks. Batches of fewer than :data:`MIN_TOKENS` tokens a shard run whole: there
the Python code of each layer, twice, outweighs the second core. Host-only (NumPy): on a GPU the
whole batch is one launch of each kernel.
"""

from __future__ import annotations

import threading

import numpy

from minitfm import flat
from minitfm.models import lm
from minitfm.speed import policy, rows
from minitfm.workers import placement

__all__ = ["SHARDS", "MIN_TOKENS", "shards", "sharded_loss_and_grads"]

SHARDS = 2              # whatever the thread count: the bits depend on the batch's shape alone
MIN_TOKENS = 256        # a shard's tokens at least

# the further shards' gradient buffers, kept for the next step of a model of the same layout
_spare: tuple = ((), [])
_spare_lock = threading.Lock()


def shards(n_rows: int, row_tokens: int) -> list[slice]:
    """The shards of a batch of ``n_rows`` blocks of ``row_tokens`` tokens: :data:`SHARDS` runs
    of whole blocks of near-equal sizes, or the whole batch where a shard would hold fewer than
    :data:`MIN_TOKENS` tokens (or no block)."""
    count = SHARDS
    if n_rows < count or n_rows * row_tokens < count * MIN_TOKENS:
        return [slice(0, n_rows)]
    edges = [n_rows * i // count for i in range(count + 1)]
    return [slice(a, b) for a, b in zip(edges, edges[1:])]


@policy.fast_path(lm.loss_and_grads)
def choose_loss_and_grads(params, cfg, x, y, rng=None, *, grads=True, normalizer=None, out=None,
                          loss_scale=None):
    """Shards of the batch on the worker's threads: on NumPy, float32 parameters, the row passes
    chosen (--kernels fused), and a batch of two shards' tokens or more."""
    first = next(iter(params.values()), None)
    if first is None or not rows.chosen(first):
        return None
    shape = numpy.shape(x)
    if len(shape) != 2 or len(shards(*shape)) < 2:
        return None
    return sharded_loss_and_grads


def sharded_loss_and_grads(params, cfg, x, y, rng=None, *, grads=True, normalizer=None, out=None,
                           loss_scale=None):
    """``lm.loss_and_grads`` over the batch's :func:`shards`, side by side on the worker's
    threads; the same results up to float32 rounding (this module's docstring)."""
    plain = policy.plain_function(lm.loss_and_grads)
    lm.check_params(params, cfg)
    x, y = lm.check_blocks(cfg, x, y)
    parts = shards(*x.shape)
    norm = float(normalizer) if normalizer is not None else float(x.size)
    if rng is not None:     # a generator per shard, keyed on one number of the batch's
        key = int(rng.integers(2 ** 63))
        rngs = [numpy.random.default_rng([key, i]) for i in range(len(parts))]
    else:
        rngs = [None] * len(parts)
    layout, spare = _take_buffers(params, len(parts) - 1) if grads else ((), [])
    if grads:
        outs = [out if out is not None else flat.zeros_like(params), *spare]
    else:
        outs = [None] * len(parts)

    def one(i: int):
        part = parts[i]
        stats, _ = plain(params, cfg, x[part], y[part], rngs[i], grads=grads, normalizer=norm,
                         out=outs[i], loss_scale=loss_scale)
        return stats["loss"]

    share = max(1, rows.threads() // len(parts))
    try:
        with placement.blas_threads_within(share):
            losses = rows.run(one, list(range(len(parts))), share=share)
    finally:
        _give_back(layout, spare)
    loss = losses[0]
    for part_loss in losses[1:]:
        loss += part_loss            # a 0-d array of the first shard's, as the plain code's
    stats = {"loss": loss, "nll": loss, "tokens": int(x.size)}
    if not grads:
        return stats, None
    for part_grads in outs[1:]:
        flat.add_into(outs[0], part_grads)
    return stats, outs[0]


def _take_buffers(params, n: int) -> tuple:
    """``(layout, n gradient buffers for params)``: those kept from the last step where the
    layout is the same (a buffer is taken by one call at a time), new ones for the rest."""
    global _spare
    layout = tuple((name, a.shape, a.dtype.str) for name, a in params.items())
    with _spare_lock:
        kept, free = _spare
        taken = [free.pop() for _ in range(min(n, len(free)))] if kept == layout else []
    return layout, taken + [flat.zeros_like(params) for _ in range(n - len(taken))]


def _give_back(layout: tuple, buffers: list) -> None:
    """Keep ``buffers`` for the next step (only the last layout's: one model is trained at a
    time)."""
    global _spare
    with _spare_lock:
        kept, free = _spare
        _spare = (layout, (free if kept == layout else []) + buffers)
