"""Which code a call runs: the textbook's plain function, or a fast path beside it. The one place
that chooses.

The layers (``minitfm/layers/``) are the plain code alone: what a learner reads, what a run with
``--kernels plain`` runs and what the gradient checks (float64) cover. A fast path takes the same
arguments as a plain function and gives the same results (bit for bit, or within the rounding
its test states): a fused CUDA kernel (:mod:`minitfm.speed.fused`), a row pass or compiled loops
on the CPU's cores (:mod:`minitfm.speed.rows`, :mod:`minitfm.speed.compiled`), a float16 variant
(:mod:`minitfm.speed.mixed`). Each lives in ``minitfm/speed/``, in the file named after the
layer it speeds up.

A fast path's file registers a *chooser* for the plain function::

    @policy.fast_path(layernorm.forward)
    def forward_path(x, p, eps=layernorm.EPS):      # the plain function's own arguments
        return fused_forward if fused.active(x) else None

The chooser is called with the call's own arguments and returns the function to run, or None
for the plain one. Registering puts a *route* in the plain function's place in its module
(``layernorm.forward`` is then the route, ``plain(layernorm.forward)`` the textbook's function):
so a call from anywhere, the layers' own composites included, is routed. Until this package is
imported nothing is registered, and ``layernorm.forward`` is the plain function itself, with no
frame between a caller and the math.

What the choosers read: ``--kernels`` (:func:`minitfm.speed.fused.use`,
:func:`minitfm.speed.rows.use`), ``--precision`` (:mod:`minitfm.speed.mixed`) and the arrays'
types. Two rules hold for every route, here and nowhere else:

- a call whose first argument is a float64 array (the gradient checks' type) runs the plain
  code;
- inside :func:`plain` (a kernel's twin, :meth:`minitfm.speed.fused.Kernel.run_twin`, and each
  block of a row pass, :func:`minitfm.speed.rows.run`) every call runs the plain code. It is a
  :class:`contextvars.ContextVar`: it holds in the thread (or task) that entered it, so a row
  pass's blocks on the pool's threads each enter it themselves.

:func:`minitfm.speed.explain` says which function a call runs and why; ``python -m
minitfm.kernelcheck --explain`` prints it for every route.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import sys
from dataclasses import dataclass

__all__ = ["fast_path", "plain", "plain_here", "plain_function", "path", "float64_call", "ROUTES",
           "Route"]

_plain_here = contextvars.ContextVar("minitfm_plain_here", default=False)


@contextlib.contextmanager
def plain():
    """Every routed call inside runs its plain code (in this thread or task)."""
    token = _plain_here.set(True)
    try:
        yield
    finally:
        _plain_here.reset(token)


def plain_here() -> bool:
    """Whether the calls made here run their plain code (inside :func:`plain`)."""
    return _plain_here.get()


@dataclass(frozen=True)
class Route:
    """A plain function with a fast path beside it: ``module.name`` is ``routed`` now, which
    holds the plain function and its chooser (``routed.plain``, ``routed.chooser``)."""
    module: str
    name: str
    routed: object

    @property
    def plain(self):
        return self.routed.plain

    @property
    def chooser(self):
        return self.routed.chooser

    @property
    def reads(self) -> str:
        """The first paragraph of the chooser's docstring, on one line: what it reads."""
        return " ".join((inspect.getdoc(self.chooser) or "").split("\n\n")[0].split())

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"


ROUTES: dict[str, Route] = {}       # "minitfm.layers.layernorm.forward" -> its Route


def float64_call(args) -> bool:
    """Whether a call with the positional arguments ``args`` is a float64 one: its first
    argument, the array a layer function works on (x, dy, the logits, a parameter buffer), is
    float64."""
    return bool(args) and getattr(getattr(args[0], "dtype", None), "char", None) == "d"


def _parameters(fn) -> list:
    """A function's parameters: names, kinds and defaults (not annotations, which may name a
    type through another module)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def plain_function(fn):
    """The textbook's function of ``fn`` (a route, or a plain function: itself)."""
    return getattr(fn, "plain", fn)


def fast_path(plain_fn):
    """Register the decorated ``chooser(*args, **kwargs) -> function or None`` for ``plain_fn``
    (a module-level function of the library, taking the chooser's arguments), and put its route
    in the plain function's place in its module. Returns the chooser."""
    plain_fn = plain_function(plain_fn)
    module, name = plain_fn.__module__, plain_fn.__name__

    def register(chooser):
        if _parameters(chooser) != _parameters(plain_fn):
            raise TypeError(f"the chooser {chooser.__qualname__} of {module}.{name} must take "
                            f"its arguments {inspect.signature(plain_fn)}, not "
                            f"{inspect.signature(chooser)}")
        if f"{module}.{name}" in ROUTES:
            raise ValueError(f"{module}.{name} has a chooser already")

        @functools.wraps(plain_fn)
        def route(*args, **kwargs):
            # float64_call(args), inlined: a route is on every layer call's way
            if not _plain_here.get() and (
                    not args or getattr(getattr(args[0], "dtype", None), "char", None) != "d"):
                fast = route.chooser(*args, **kwargs)
                if fast is not None:
                    return fast(*args, **kwargs)
            return plain_fn(*args, **kwargs)

        route.plain, route.chooser = plain_fn, chooser
        ROUTES[f"{module}.{name}"] = Route(module, name, route)
        setattr(sys.modules[module], name, route)
        return chooser
    return register


def path(fn, *args, **kwargs):
    """The function a call of ``fn`` (a route or a plain function) with these arguments runs."""
    plain_fn = plain_function(fn)
    chooser = getattr(fn, "chooser", None)
    if chooser is None or _plain_here.get() or float64_call(args):
        return plain_fn
    return chooser(*args, **kwargs) or plain_fn
