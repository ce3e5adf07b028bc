"""Host-only: compiled loops for the row passes (:mod:`minitfm.speed.rows`), through Numba.

A NumPy pass over a block of rows is a dozen calls, each a sweep of the block, and a thread
takes Python's lock (the GIL) back between two calls: on two cores, two threads running such
passes wait on each other for it (a LayerNorm over (3072, 256) float32 rows took 0.59 ms in
NumPy blocks on two threads, 0.65 ms in the plain code on one). A layer's compiled loop does
the whole pass on a block in one call, a row at a time, the row in the core's first-level cache,
without the lock: the same LayerNorm took 0.18 ms.

Each loop is plain Python over scalars, written in its layer's file beside the plain code and the
CUDA kernel, and turned into machine code by Numba on its first call (some tenths of a second, then
kept on disk beside the module, or in ``$NUMBA_CACHE_DIR``: ``cache=True``; an entry there that does
not load, or holds another loop's code, is compiled again and said once; one that cannot be written
is said once, and compiled again by the next run), with ``nogil`` (threads run it side by side) and
two of LLVM's fast-math flags: ``reassoc`` (a row's sum may be added in another order: in vector
registers, several lanes at once) and ``contract`` (a multiply and an add may be one fused
instruction). NaNs and infinities keep their meaning. So a compiled pass equals the plain code up to
float32 rounding (its tests state the tolerance), and gives the same bits run after run on one
machine, on one thread or two (the blocks depend on the shape alone).

Without Numba (``pip install numba`` brings it; it is one of minitfm's dependencies, but a
platform may lack its wheels), :func:`available` is False and the row passes run their NumPy
blocks.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import signal
import sys
import threading

import numpy

__all__ = ["available", "kernel", "signals_held_back", "float32", "uint64", "sqrt", "log", "inf"]

FASTMATH = frozenset({"reassoc", "contract"})
# what the loops in the layers' files (which reach arrays through minitfm.backend alone) call for
# a float32 number, a 64-bit word, a square root, a logarithm and infinity: compiled.float32(0.0),
# compiled.uint64(32) (a loop's integer constants must be words too: a word and an int give a
# float), compiled.sqrt(v), -compiled.inf
float32, uint64 = numpy.float32, numpy.uint64
sqrt, log, inf = numpy.sqrt, numpy.log, numpy.inf
_compiling = threading.RLock()


@functools.cache
def available() -> bool:
    """Whether Numba can be imported (it is not imported here: that takes a few tenths of a
    second, paid only by a run whose row passes call a compiled loop)."""
    return importlib.util.find_spec("numba") is not None


def kernel(fn):
    """``fn`` compiled by Numba (nogil, cached on disk, :data:`FASTMATH`) on its first call;
    ``kernel(fn).python`` is ``fn`` itself, the same loop run by the interpreter."""
    compiled = None

    @functools.wraps(fn)
    def call(*args):
        nonlocal compiled
        if compiled is None:
            # the threads of a row pass may call it first together: one imports Numba
            with _compiling, signals_held_back():
                if compiled is None:
                    compiled = _compile(fn)
        return compiled(*args)

    call.python = fn
    return call


def _compile(fn):
    """Numba's dispatcher of ``fn``, its machine code kept on disk where Numba finds a place
    (beside the module, else a cache in the user's home): a read-only installation with no
    writable home compiles it anew in each process instead of failing."""
    import numba
    options = {"nogil": True, "fastmath": set(FASTMATH)}
    try:
        dispatcher = numba.njit(cache=True, **options)(fn)
    except RuntimeError:                # "cannot cache function ...: no locator available"
        dispatcher = numba.njit(cache=False, **options)(fn)
    try:
        from numba.core.caching import FunctionCache
        kept_on_disk = isinstance(dispatcher._cache, FunctionCache)
    except (ImportError, AttributeError):   # a Numba whose insides differ: its own cache, as is
        kept_on_disk = False
    if kept_on_disk:                                        # kept on disk: by a cache that heals
        dispatcher._cache = _healing_cache()(fn)
    # Numba compiles (or loads from its cache) on a call with argument types it has no machine
    # code for yet: the first call, and any later one with another layout or dtype. Each such
    # call runs Python for a while, inside Numba: the stop signals are held back for all of it.
    compile_for_args = dispatcher._compile_for_args

    def held_back(*args, **kwargs):
        with _compiling, signals_held_back():
            return compile_for_args(*args, **kwargs)

    dispatcher._compile_for_args = held_back
    return dispatcher


_unkept: list[str] = []         # the folder where a compiled loop could not be kept, once said


@functools.cache
def _healing_cache():
    """Numba's cache of a function's machine code, healing itself: an entry that does not load
    (a truncated or damaged file) or holds another loop's code, or another signature's (files
    swapped), is compiled again, and said once; an entry that cannot be written (a full disk) is
    said once, and the run goes on with the code it compiled."""
    from numba.core import sigutils
    from numba.core.caching import FunctionCache

    class HealingCache(FunctionCache):
        def __init__(self, py_func):
            super().__init__(py_func)
            self._loop = f"{py_func.__module__}.{py_func.__qualname__}"
            self._said = False

        def _load_overload(self, sig, target_context):
            # Numba's own, which trusts what it reads, with the checks of what it read
            if not self._enabled:
                return None
            try:
                data = self._cache_file.load(self._index_key(sig, target_context.codegen()))
                if data is None:
                    return None
                fndesc, signature = data[1], data[3]
                found = f"{fndesc.modname}.{fndesc.qualname}"
                if found != self._loop:
                    return self._unloadable(f"it holds another loop's code, {found}'s")
                if tuple(signature.args) != tuple(sigutils.normalize_signature(sig)[0]):
                    return self._unloadable("it holds the code for other argument types")
                return self._impl.rebuild(target_context, data)
            except Exception as exc:        # whatever unpickling a damaged file raises
                return self._unloadable(f"{type(exc).__name__}: {exc}")

        def _unloadable(self, why: str) -> None:
            if not self._said:
                self._said = True
                print(f"warning: the compiled loop {self._loop} kept in {self._cache_path} does "
                      f"not load ({why}): compiling it again", file=sys.stderr, flush=True)

        def save_overload(self, sig, data):
            try:
                try:
                    super().save_overload(sig, data)
                except OSError:
                    raise
                except Exception:           # a damaged index: a new one
                    self.flush()
                    super().save_overload(sig, data)
            except OSError as exc:
                if not _unkept:
                    _unkept.append(self._cache_path)
                    print(f"warning: the compiled loops cannot be kept in {self._cache_path} "
                          f"({exc.strerror or exc}): each run compiles them again; make room "
                          f"there, or move Numba's cache elsewhere with NUMBA_CACHE_DIR=DIR",
                          file=sys.stderr, flush=True)

    return HealingCache


STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))


@contextlib.contextmanager
def signals_held_back():
    """Ctrl-C, SIGTERM and SIGHUP held back while Numba is imported and compiles (a second
    or two on a busy machine), then delivered to the handlers they had (a KeyboardInterrupt,
    a clean stop). A Ctrl-C raised inside that work was seen lost: a sampling command went on
    to its end (once in about ten runs under two busy loops, with no compiled code cached
    yet); held back, it reaches the command where its handler expects it. Python runs signal
    handlers in the main thread alone: elsewhere nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {}
    for signum in STOP_SIGNALS:
        handler = signal.getsignal(signum)
        if handler is not None:             # None: set outside Python, left alone
            previous[signum] = signal.signal(signum, lambda number, frame: came.append(number))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(came):
            signal.raise_signal(signum)     # its own handler runs now, here
