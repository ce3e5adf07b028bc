"""Row passes on the CPU's cores: the NumPy backend's fast path, beside the plain code.

NumPy runs each array operation on one core, sweeping the whole array: a LayerNorm over an (N, D)
array is some eight passes over memory, each reading back from the outer caches what the last one
wrote. Most of a training step's work outside the matrix products is *row-wise*, each row of the
outputs depending on the same row of the inputs alone (LayerNorm, the loss, softmax, dropout,
bias + ReLU, the residual add; Adam is element-wise, its flat buffers rows of one). Such a pass
runs the layer's plain code on blocks of rows:

- a block small enough (:data:`BLOCK_BYTES`) to stay in a core's cache between the operations of
  the pass, so that its sweeps of memory become about one;
- the blocks shared among the worker's threads (NumPy releases the GIL inside its loops), so
  that every core the placement gives the worker does the work that one did.

The plain code on a block does on each row what it does on the whole array, so a row-wise pass
gives the plain pass's bits; a pass that also sums over the rows (LayerNorm's dgamma and dbeta)
adds the blocks' partial sums in block order instead of the rows in one sweep: the
same numbers up to float32 rounding, the tolerance its test states. The blocks depend on the
array's shape alone, never on the thread count or on which thread finishes first: a run gives the
same bits with one thread or two, every time.

``--kernels fused`` chooses these passes on NumPy (the default there: :func:`use`), ``plain`` the
plain code; float64 (the gradient checks) always runs the plain code. Threads: the placement's
(``--threads``, or the worker's share of the cores); with one thread the passes still run block
by block, for the cache. This module is host-only: on CuPy the fused kernels play its part.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
import threading
from concurrent.futures import ThreadPoolExecutor

from minitfm import backend
from minitfm.speed import policy
from minitfm.speed import compiled as _numba

__all__ = ["BLOCK_BYTES", "MIN_BYTES", "use", "enabled", "threads", "chosen", "active",
           "compiled", "state", "blocks", "run", "map_rows", "sharing"]

# A block's rows in every array its pass touches: about a core's L2 cache (1-2 MiB on today's
# x86 cores), large enough that the dozen NumPy calls of a block, serialised by the GIL, stay
# short beside its arithmetic (256 KiB blocks made a LayerNorm on two threads slower than on one)
BLOCK_BYTES = 1 << 21
# Smaller passes still split, so that two to four threads share them: blocks of 128 KiB and
# more, at most SPLIT of them (a language model's attention over 22 sequences: 4 blocks)
SPLIT, SPLIT_BYTES = 4, 1 << 17
MIN_ROWS = 8                    # rows a block has at least
# Arrays smaller than this in all (a language model's (1056, 128) LayerNorm, 0.5 MiB) run the
# plain code: they fit in the cache whole, and a pass's dozen calls per block and the handing
# of blocks to threads cost more than they save (LayerNorm: 145 us plain, 170-260 in blocks)
MIN_BYTES = 1 << 20

_enabled = False
_compiled = True
_threads = 1
_min_bytes = MIN_BYTES
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()
# the threads of the row passes called here, where a caller shares the worker's threads among
# parts that each run whole layers (a batch's shards: minitfm.speed.lm); 0: all of them
_threads_here = contextvars.ContextVar("minitfm_rows_threads_here", default=0)


def use(enabled: bool, threads: int = 1, min_bytes: int = MIN_BYTES,
        compiled: bool = True) -> None:
    """Run the row passes (``enabled``) on ``threads`` threads, or the plain code; passes over
    fewer than ``min_bytes`` in all run the plain code (tests take 0: every pass), except the
    layers' compiled loops (``compiled``, where Numba is installed: :mod:`minitfm.speed.compiled`),
    which take every size; with ``compiled=False`` the row passes run NumPy on their blocks."""
    global _enabled, _threads, _min_bytes, _compiled
    if threads < 1:
        raise ValueError(f"threads must be 1 or more, not {threads}")
    _enabled, _threads, _min_bytes = bool(enabled), int(threads), int(min_bytes)
    _compiled = bool(compiled)


def state() -> tuple:
    """The arguments of the last :func:`use`: ``use(*state())`` puts them back."""
    return _enabled, _threads, _min_bytes, _compiled


def enabled() -> bool:
    return _enabled


def threads() -> int:
    """The threads the row passes called here use: the worker's (:func:`use`), or a part's share
    of them inside :func:`sharing`."""
    return _threads_here.get() or _threads


@contextlib.contextmanager
def sharing(threads: int):
    """Inside the block, in this thread, the row passes use ``threads`` threads (a part's share of
    the worker's, when parts run side by side)."""
    token = _threads_here.set(max(1, int(threads)))
    try:
        yield
    finally:
        _threads_here.reset(token)


def chosen(*arrays) -> bool:
    """Whether the row passes are chosen for ``arrays``: on NumPy, float32, and not already
    inside a block (there a layer runs its plain code on the block), whatever their size."""
    if not _enabled or backend.name != "numpy" or policy.plain_here():
        return False
    return all(a.dtype == backend.xp.float32 for a in arrays)


def active(*arrays) -> bool:
    """Whether a layer given ``arrays`` runs its row pass: chosen, on NumPy, float32 arrays of
    :data:`MIN_BYTES` or more in all, and not already inside a block (there a layer runs its
    plain code on the block)."""
    return chosen(*arrays) and sum(a.nbytes for a in arrays) >= _min_bytes


def compiled(*arrays) -> bool:
    """Whether a layer that has a compiled loop runs it on ``arrays``, whatever their size:
    the row passes chosen for them (:func:`chosen`) with their compiled loops, and Numba
    installed."""
    return _compiled and chosen(*arrays) and _numba.available()


def blocks(n_rows: int, row_bytes: int, block_bytes: int = BLOCK_BYTES) -> list[slice]:
    """The blocks of ``n_rows`` rows of ``row_bytes`` bytes (in all the pass's arrays): about
    ``block_bytes`` each, or up to :data:`SPLIT` of at least :data:`SPLIT_BYTES` where that
    makes more, at least :data:`MIN_ROWS` rows, of near-equal sizes. They depend on these
    numbers alone."""
    total = n_rows * row_bytes
    count = max(math.ceil(total / block_bytes), min(SPLIT, total // SPLIT_BYTES))
    count = max(1, min(count, n_rows // MIN_ROWS))
    if n_rows == 0:
        return []
    edges = [n_rows * i // count for i in range(count + 1)]
    return [slice(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def _executor() -> ThreadPoolExecutor:
    """The pool of the threads beside the caller's, made on first use (and again for more)."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < _threads - 1:
            if _pool is not None:
                _pool.shutdown(wait=True)
            _pool_size = _threads - 1
            _pool = ThreadPoolExecutor(max_workers=_pool_size, thread_name_prefix="minitfm-rows")
        return _pool


def run(fn, parts: list, *, share: int = 0) -> list:
    """``[fn(part) for part in parts]``, the parts taken in order by the calling thread and the
    pool's threads, each the next one not yet taken; results in the parts' order. A thread that
    the machine's other work keeps from running takes no part, so the caller does its share: it
    then waits only for the parts already begun elsewhere, never for a thread to be scheduled
    (a pool whose threads each own a fixed share waits at every pass for the slowest).

    A part runs the plain code of every layer it calls (a row pass's block); with ``share``, it
    runs the layers' own paths instead, their row passes on ``share`` threads (:func:`sharing`).
    """
    if not parts:
        return []
    results: list = [None] * len(parts)
    taken = itertools.count()            # next() of a count is atomic: each part taken once
    helpers = min(threads(), len(parts)) - 1
    # a part's end, for a caller that shares the parts (on one thread it does them all itself)
    finished = [threading.Event() for _ in parts] if helpers else None
    errors: list = []

    def work() -> None:
        # the layers called on a block run their plain code; a shared part, its own paths
        with sharing(share) if share else policy.plain():
            for i in iter(lambda: next(taken), None):
                if i >= len(parts):
                    return
                try:
                    results[i] = fn(parts[i])
                except BaseException as exc:       # re-raised by the caller, below
                    errors.append((i, exc))
                finally:
                    if finished:
                        finished[i].set()

    for _ in range(helpers):
        _executor().submit(work)
    work()
    for event in finished or ():         # the parts begun by other threads
        event.wait()
    if errors:
        raise min(errors, key=lambda error: error[0])[1]
    return results


def map_rows(fn, n_rows: int, row_bytes: int, block_bytes: int = BLOCK_BYTES) -> list:
    """``fn(rows)`` for each block of rows (a slice), on the threads: :func:`run` over
    :func:`blocks`."""
    return run(fn, blocks(n_rows, row_bytes, block_bytes))

