"""Which path a layer call runs: the textbook's plain code, or a fast path beside it.

A layer's plain ``forward`` and ``backward`` are the math and nothing else: what a learner reads,
what ``--kernels plain`` runs and what the gradient checks (float64) cover. Beside them, in the
same file and under the same derivation, a layer may have fast paths taking the same arguments
and giving the same results (bit for bit, or within the rounding their tests state): a fused
CUDA kernel (:mod:`minitfm.fused`), a row pass or compiled loops on the CPU's cores
(:mod:`minitfm.rows`), a float16 variant (:mod:`minitfm.mixed`).

The choice is made outside the textbook's function. ``@paths.fast`` marks the plain function;
a *chooser*, registered in the file's fast-path section with ``@forward.chooser``, is called with
the call's own arguments and returns the fast function to run, or None for the plain code. It
reads ``--kernels`` (:func:`minitfm.fused.use`, :func:`minitfm.rows.use`), ``--precision`` and
the arrays' types (float64 always runs the plain code)::

    @paths.fast
    def forward(x, p):
        ...                                     # the plain code, alone

    @forward.chooser                            # further down, beside the fast paths
    def _forward_path(x, p):
        return _fused_forward if fused.active(x) else None

``forward.plain`` is the plain function (``inspect.getsource(forward)`` shows it, decorator line
included), ``forward.path(x, p)`` the function a call with these arguments runs, and
``forward.choose`` the chooser. Until one is registered every call runs the plain code.

A fast path may call other layers' functions, which choose their own paths; inside a twin
(:meth:`minitfm.fused.Kernel.run_twin`) and on the blocks of a row pass (:func:`minitfm.rows.run`)
the choosers pick the plain code.
"""

from __future__ import annotations

import functools

__all__ = ["fast"]


def _plain_only(*args, **kwargs) -> None:
    """The chooser of a function that has none registered: always the plain code."""
    return None


def fast(plain):
    """``plain`` with fast paths beside it, chosen per call (see the module's docstring)."""
    choose = _plain_only

    @functools.wraps(plain)
    def run(*args, **kwargs):
        path = choose(*args, **kwargs)
        return (plain if path is None else path)(*args, **kwargs)

    def chooser(choose_path):
        """Register ``choose_path(*args, **kwargs) -> fast function or None``; returns it."""
        nonlocal choose
        choose = run.choose = choose_path
        return choose_path

    def path(*args, **kwargs):
        """The function a call with these arguments runs: a fast path, or the plain one."""
        return choose(*args, **kwargs) or plain

    run.plain, run.chooser, run.path, run.choose = plain, chooser, path, None
    return run
