"""The fast paths of the token embedding's backward pass (``minitfm/layers/embedding.py``),
chosen per call by :mod:`minitfm.speed.policy`; the plain function is their twin.

Row passes (``--kernels fused`` on NumPy, float32): the scatter-add sorts the ids and adds the
first row of every id in one indexed add, then the second, ... (:func:`rows_scatter_add`),
instead of one row after another: each row of the table still receives its id's rows in their
order, from its own value: the plain backward's bits, some ten times faster. Where Numba is
installed, a compiled loop (:func:`add_rows_loop`) does add.at's own work, a row after another,
each of the worker's threads for the ids in its share of the table: the same bits.
"""

from __future__ import annotations

from minitfm import backend
from minitfm.layers import embedding
from minitfm.speed import compiled, policy, rows


# ---- row passes (CPU) -------------------------------------------------------------------------

ROW_PASS_MIN = 1 << 14      # numbers in dy below which add.at is as fast (the sort's fixed cost)
WIDE_PASS = 16              # ids a pass serves at least; fewer ids left: they go one by one


@policy.fast_path(embedding.backward)
def choose_backward(dy, cache: embedding.Cache, out=None):
    """The scatter-add by the compiled loop (Numba) or in wide passes (large dy), on NumPy
    (--kernels fused)."""
    # the scatter-add's arrays: dy times the scale (dy's type) and the table's gradient
    table = cache.dtype if out is None else out["table"].dtype
    if table != backend.xp.float32 or not rows.chosen(dy):
        return None
    if rows.compiled(dy) or (dy.size >= ROW_PASS_MIN and cache.shape[1] > 1):
        return rows_backward
    return None


def rows_backward(dy, cache: embedding.Cache, out=None):
    """``backward`` with the scatter-add by the compiled loops where they run
    (:func:`loops_scatter_add`), else by :func:`rows_scatter_add`: add.at's bits, either way."""
    dtable = backend.xp.zeros(cache.shape, dtype=cache.dtype) if out is None else out["table"]
    scaled = dy.reshape(-1, cache.shape[1]) * cache.scale   # (N, d_model), scaled before the sum
    scatter_add = loops_scatter_add if rows.compiled(scaled, dtable) else rows_scatter_add
    scatter_add(dtable, cache.ids.reshape(-1), scaled)
    return None, {"table": dtable}


def rows_scatter_add(target, indices, values) -> None:
    """``numpy.add.at(target, indices, values)`` (indices 1-D, values (N, d), d > 1) in fewer,
    wider operations, with add.at's bits.

    add.at adds the N rows one after another, some microseconds each. Here the rows are sorted
    by id, stably (each id's rows keep their order), and added a rank at a time:

        pass r = 0, 1, ...     the r-th row of every id that has more than r rows, at once:
                               target[ids] += values[their r-th rows]   (distinct ids: exact)
        then, once fewer than WIDE_PASS ids have rows left, each of those on its own:
                               target[id] = sum over axis 0 of (target[id], its rows left)

    Each row of ``target`` thus receives its id's rows one after another, from its own value,
    as add.at adds them. (NumPy sums a C-ordered (c, d) array over axis 0 row after row, d
    numbers at a time; for d = 1 it would use pairwise sums, hence d > 1.)
    """
    xp = backend.xp
    order = xp.argsort(indices, kind="stable")             # (N,) each id's rows together
    ids = indices[order]                                    # (N,) sorted
    if ids.size == 0 or ids[0] < 0:                         # none, or ids counted from the end
        backend.scatter_add(target, indices, values)
        return
    first = xp.flatnonzero(xp.diff(ids, prepend=ids[0] - 1))    # (U,) where each id's rows start
    count = xp.diff(first, append=ids.size)                 # (U,) the rows of each id
    most = xp.argsort(-count, kind="stable")                # the ids with most rows first: the
    first, count = first[most], count[most]                 # ids of a pass are then a prefix
    wide = xp.searchsorted(-count, -xp.arange(count[0]))    # (max count,) ids with count > r
    rank = 0
    while rank < count[0] and wide[rank] >= WIDE_PASS:
        n = wide[rank]
        target[ids[first[:n]]] += values[order[first[:n] + rank]]       # (n, d)
        rank += 1
    for k in range(wide[rank] if rank < count[0] else 0):   # the ids with rows left, one by one
        left = order[first[k] + rank:first[k] + count[k]]
        stack = xp.empty((1 + left.size, values.shape[1]), dtype=target.dtype)
        stack[0] = target[ids[first[k]]]
        xp.take(values, left, axis=0, out=stack[1:])        # (1 + c, d): the row, then its rows
        target[ids[first[k]]] = stack.sum(axis=0)      # row after row (add.reduce)


def loops_scatter_add(target, indices, values) -> None:
    """``numpy.add.at(target, indices, values)`` (indices 1-D, values (N, d)) by the compiled
    loop below, the table's rows shared among the worker's threads: each thread adds, in the
    order of the ids, the rows whose ids fall in its share. add.at's bits, on any thread count."""
    vocab = target.shape[0]
    if indices.size and (indices.min() < -vocab or indices.max() >= vocab):
        backend.scatter_add(target, indices, values)        # add.at's IndexError
        return
    edges = [vocab * k // rows.threads() for k in range(rows.threads() + 1)]
    rows.run(lambda k: add_rows_loop(target, indices, values, edges[k], edges[k + 1]),
             list(range(rows.threads())))


@compiled.kernel
def add_rows_loop(target, indices, values, low, high):
    """target[i] += values[n] for each n in order whose id i (counted from the end if negative)
    is in [low, high)."""
    vocab, d = target.shape
    for n in range(indices.shape[0]):
        i = indices[n]
        if i < 0:
            i += vocab
        if low <= i < high:
            for j in range(d):
                target[i, j] += values[n, j]
