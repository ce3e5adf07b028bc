"""The machine beside the book: the fast paths of the layers and of Adam, a file per layer.

``minitfm/layers/`` is the plain code alone. Each file here holds a layer's fast paths (fused
CUDA kernels with their source, row passes and compiled loops on the CPU, float16 variants) and
the *chooser* that picks one per call, registered with :mod:`minitfm.speed.policy`, the one place
that chooses. Importing this package registers them all; a process that never imports it runs
the plain functions themselves.

The machinery they share: :mod:`~minitfm.speed.fused` (a CUDA kernel and its twin),
:mod:`~minitfm.speed.rows` (blocks of rows on the worker's threads), :mod:`~minitfm.speed.compiled`
(Numba's loops), :mod:`~minitfm.speed.mixed` (float16 products), :mod:`~minitfm.speed.shards` (a
batch's shards side by side: the fast paths of the models' steps, :mod:`~minitfm.speed.lm` and
:mod:`~minitfm.speed.translator`). :func:`explain` says which function a call runs, and why.
"""

import collections
import contextlib
import functools

from minitfm.speed import (attention, decoder, dropout, embedding, encoder,  # noqa: F401
                           feedforward, gradscale, layernorm, linear, lm, loss, optim,
                           output, residual, softmax, translator)
from minitfm.speed import fused, mixed, policy, rows  # noqa: E402  (the settings they read)

__all__ = ["explain", "traced"]


def _name(fn) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def explain(fn=None, *args, **kwargs) -> str:
    """Which function a call of ``fn`` with these arguments runs, and what chose it. Without
    ``fn``: every route, its fast paths' chooser and the settings the choosers read now."""
    passes = f"on {rows.threads()} thread(s)" if rows.enabled() else "off"
    settings = (f"--kernels {fused.choice()}{' (on the host)' if fused.on_host() else ''}; "
                f"row passes {passes}{', compiled loops' if rows.compiled() else ''}; "
                f"float16 products {'on' if mixed.enabled() else 'off'}")
    if fn is None:
        lines = [f"settings: {settings}"]
        for route in policy.ROUTES.values():
            lines.append(f"{route.qualified}: {_name(route.chooser)}: {route.reads}")
        return "\n".join(lines)
    chosen = policy.path(fn, *args, **kwargs)
    plain_fn = policy.plain_function(fn)
    if chosen is plain_fn:
        why = ("inside a twin or a row pass's block" if policy.plain_here() else
               "a float64 argument" if policy.float64_call(args) else
               "no fast path registered" if not hasattr(fn, "chooser") else
               "its chooser chose none for these arguments")
        return f"{_name(plain_fn)} runs its plain code ({why}; {settings})"
    return f"{_name(plain_fn)} runs {_name(chosen)} ({settings})"


@contextlib.contextmanager
def traced():
    """Within the block, what each route's chooser chose: ``{route: Counter({function name:
    calls})}``, "plain" where it chose none (calls inside a twin or a row pass's block, and
    float64 calls, run the plain code without asking a chooser, and are not counted)."""
    seen = {name: collections.Counter() for name in policy.ROUTES}
    saved = {}
    for name, route in policy.ROUTES.items():
        saved[name] = choose = route.routed.chooser

        @functools.wraps(choose)
        def spy(*args, _choose=choose, _counter=seen[name], **kwargs):
            fast = _choose(*args, **kwargs)
            _counter["plain" if fast is None else _name(fast)] += 1
            return fast
        route.routed.chooser = spy
    try:
        yield seen
    finally:
        for name, choose in saved.items():
            policy.ROUTES[name].routed.chooser = choose
