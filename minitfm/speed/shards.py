"""A batch's shards side by side on the worker's threads: the machinery of the models' steps on the
CPU (the language model's, :mod:`minitfm.speed.lm`; the translator's,
:mod:`minitfm.speed.translator`).

The row passes (:mod:`minitfm.speed.rows`) share a layer's element-wise work among the worker's
threads, and the BLAS library shares its products; but the Python code between them runs on one
thread, and a product of a few hundred rows gains little from a second one (the language model
of ``train_lm.py``'s defaults: 1,056 rows of 128). So on NumPy, with the row passes chosen
(``--kernels fused``, the default there), a model's ``loss_and_grads`` splits a large enough
batch into :data:`SHARDS` shards of whole rows (blocks, sentences) and runs the plain function
on each: side by side on the worker's threads, each shard with its share of them for its own
row passes and products (one each on two cores), its gradients in a buffer of its own; then it
adds the shards' losses and gradients, in shard order. NumPy's loops, the BLAS library and the
compiled loops run without the GIL, so two shards keep two cores busy where one batch kept one
and a half.

Rounding: the losses are the sums of the shards' (each divided by the whole batch's
normalizer) and each gradient the sum of the shards', where the whole batch sums over its rows
in one product: the same numbers up to float32 rounding, the tolerance the tests state. The
shards depend on the batch's shape and the model's width alone, never on the thread count: a run
gives the same bits on one thread or two (one thread runs the shards one after the other).

Dropout: each shard draws its masks from a generator of its own, keyed on a number drawn from the
batch's generator: the masks depend on the seed, the step and the batch as before, but are not
the whole batch's masks. A batch whose shards would hold less than :data:`MIN_WORK` (tokens x
d_model) runs whole: there the Python code of each layer, twice, outweighs the second core, and
on one thread it would cost more than a few per cent. Host-only (NumPy): on a GPU the whole
batch is one launch of each kernel.
"""

from __future__ import annotations

import threading

from minitfm import backend, flat
from minitfm.speed import rows
from minitfm.workers import placement

__all__ = ["SHARDS", "MIN_WORK", "shards", "chosen", "generators", "run", "added"]

SHARDS = 2              # whatever the thread count: the bits depend on the batch's shape alone
MIN_WORK = 256 * 128    # a shard's tokens x d_model at least: 256 tokens of the language model

# the further shards' gradient buffers, kept for the next step of a model of the same layout
_spare: tuple = ((), [])
_spare_lock = threading.Lock()


def shards(n_rows: int, row_tokens: int, d_model: int) -> list[slice]:
    """The shards of a batch of ``n_rows`` rows of ``row_tokens`` tokens (padding included) of a
    model of width ``d_model``: :data:`SHARDS` runs of whole rows of near-equal sizes, or the
    whole batch where a shard would hold less work than :data:`MIN_WORK` (or no row)."""
    count = SHARDS
    if n_rows < count or n_rows * row_tokens * d_model < count * MIN_WORK:
        return [slice(0, n_rows)]
    edges = [n_rows * i // count for i in range(count + 1)]
    return [slice(a, b) for a, b in zip(edges, edges[1:])]


def chosen(params, batch_rows, d_model: int) -> bool:
    """Whether a step runs in shards: float32 parameters on NumPy with the row passes chosen
    (:func:`minitfm.speed.rows.chosen`), and ``batch_rows`` ((rows, tokens): the blocks, or the
    sentences' targets) of two shards' work or more."""
    first = next(iter(params.values()), None)
    if first is None or not rows.chosen(first):
        return False
    shape = backend.xp.shape(batch_rows)    # on NumPy: an array, or a list of lists
    return len(shape) == 2 and len(shards(*shape, d_model)) > 1


def generators(rng, count: int) -> list:
    """A dropout generator per shard, keyed on one number drawn from ``rng`` (None: none)."""
    if rng is None:
        return [None] * count
    key = int(rng.integers(2 ** 63))
    return [backend.host_rng(key, i) for i in range(count)]     # NumPy's: the shards run there


def run(plain, params, cfg, a, b, parts: list, rng, *, grads: bool, normalizer: float, out,
        loss_scale) -> tuple[list, object]:
    """A model's plain ``loss_and_grads`` on each of ``parts`` of the batch ``(a, b)`` (the same
    arguments, ``normalizer`` the whole batch's), side by side on the worker's threads, each on
    its share of them, each shard's dropout from its own generator (:func:`generators`); returns
    ``(the shards' stats, the gradients)``: the shards' sums in shard order, in ``out`` (new
    buffers when None), or None when not ``grads``."""
    count = len(parts)
    rngs = generators(rng, count)
    layout, spare = _take_buffers(params, count - 1) if grads else ((), [])
    if grads:
        outs = [out if out is not None else flat.zeros_like(params), *spare]
    else:
        outs = [None] * count

    def step(i: int) -> dict:
        part = parts[i]
        return plain(params, cfg, a[part], b[part], rngs[i], grads=grads, normalizer=normalizer,
                     out=outs[i], loss_scale=loss_scale)[0]

    share = max(1, rows.threads() // count)
    try:
        with placement.blas_threads_within(share):
            stats = rows.run(step, list(range(count)), share=share)
    finally:
        _give_back(layout, spare)
    if not grads:
        return stats, None
    for part_grads in outs[1:]:
        flat.add_into(outs[0], part_grads)
    return stats, outs[0]


def added(stats: list, name: str):
    """The shards' ``stats[i][name]`` (numbers of the backend) added in shard order; a new
    number, the shards' own left as they were."""
    total = stats[0][name]
    for more in stats[1:]:
        total = total + more[name]
    return total


def _take_buffers(params, n: int) -> tuple:
    """``(layout, n gradient buffers for params)``: those kept from the last step where the
    layout is the same (a buffer is taken by one call at a time), new ones for the rest."""
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
