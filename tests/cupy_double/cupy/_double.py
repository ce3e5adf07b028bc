"""The double's own bookkeeping (test-only, not part of CuPy's API).

Which CuPy release the double behaves as (``CUPY_DOUBLE_RULES=14|13``, default 14), what a
launched kernel runs (``CUPY_DOUBLE_KERNELS=twin|host``, default twin: see :func:`emulate`), and the
counters tests assert budgets with: every device-to-host copy (``device_to_host``), every
random generator created (``generators``), every launch of device work (``launches``: a kernel
or a memset, see :func:`launch`) and every float32 product of one cuBLAS GEMM, run on TF32
tensor cores (``tf32_products``) or in plain float32 (``fp32_products``), and every float16 one
(``fp16_products``: float32 sums).

    from cupy import _double
    _double.reset()
    with _double.counting() as syncs:
        ...                               # code under test
    assert syncs.device_to_host == 0, _double.describe(syncs.events)

``CUPY_DOUBLE_TRACE=1`` records, for each copy and generator, where it happened (file:line of the
first caller outside the double, and the kind of copy): :func:`events`. Inside a ``counting()``
block, ``launch_sites`` counts the launches by the place that asked for them. ``CUPY_DOUBLE_REPORT=<path>`` writes
the counts (and the events, if traced) as JSON when the process exits, so that a test running a
whole command in a subprocess can assert its budget.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import sys

__all__ = ["RULES", "counts", "reset", "counting", "events", "describe", "Counter", "launch",
           "emulate"]


def _rules() -> int:
    value = os.environ.get("CUPY_DOUBLE_RULES", "14").strip() or "14"
    if value not in ("13", "14"):
        raise ImportError(f"CUPY_DOUBLE_RULES={value!r}: the double follows CuPy 14 or 13 "
                          f"(set it to 14 or 13, or unset it)")
    return int(value)


def _kernels() -> str:
    value = os.environ.get("CUPY_DOUBLE_KERNELS", "twin").strip() or "twin"
    if value not in ("twin", "host"):
        raise ImportError(f"CUPY_DOUBLE_KERNELS={value!r}: a launched kernel runs its plain "
                          f"twin (twin) or its own source on the CPU (host)")
    return value


RULES = _rules()
KERNELS = _kernels()             # what a launched kernel runs: its twin, or its source on the CPU
VERSION = {14: "14.2.0", 13: "13.6.0"}[RULES]
TRACE = os.environ.get("CUPY_DOUBLE_TRACE", "") not in ("", "0")
KINDS = ("device_to_host", "generators", "launches", "tf32_products", "fp32_products",
         "fp16_products")
_UNTRACED = ("launches",)        # thousands per step: counted by site, not listed one by one

_counts = dict.fromkeys(KINDS, 0)
_events: list[dict] = []
_counters: list[Counter] = []     # the open counting() blocks
_inside_kernel = 0                # > 0 while a kernel's twin runs: its operations are the kernel
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class Counter:
    """The counts inside one ``counting()`` block (attributes ``device_to_host``,
    ``generators``, ``launches``, ``tf32_products``, ``fp32_products``, ``fp16_products``;
    ``events``: where each copy, generator and
    product happened; ``launch_sites``: launches by ``file:line (function)``)."""

    def __init__(self) -> None:
        for kind in KINDS:
            setattr(self, kind, 0)
        self.events: list[dict] = []
        self.launch_sites: collections.Counter = collections.Counter()

    def as_dict(self) -> dict:
        return {kind: getattr(self, kind) for kind in KINDS}

    def __repr__(self) -> str:
        return f"Counter({self.as_dict()})"


def _caller() -> str:
    """file:line of the first frame outside the double."""
    frame = sys._getframe(2)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"


def record(kind: str, what: str) -> None:
    """Count one event of ``kind`` (one of KINDS); ``what`` says which operation (``float()``,
    ``boolean mask``, ``default_rng``...)."""
    _counts[kind] += 1
    traced = TRACE and kind not in _UNTRACED
    if not (traced or _counters):
        return
    where = _caller()
    event = {"kind": kind, "what": what, "where": where}
    if traced:
        _events.append(event)
    for counter in _counters:
        setattr(counter, kind, getattr(counter, kind) + 1)
        if kind in _UNTRACED:
            counter.launch_sites[where] += 1
        else:
            counter.events.append(event)


def launch(what: str = "kernel") -> None:
    """Count one launch of device work: a kernel (an elementwise operation, a reduction, a
    gather or scatter, a copy between arrays, a random draw, a matrix product, a collective)
    or a memset (``zeros``). One per CuPy call that launches work: the lower bound of what the
    device runs, since cuBLAS, CUB and CuPy's scans may launch several kernels for one call."""
    if not _inside_kernel:
        record("launches", what)


def emulate(kernel, grid, block, args, twin, host=None) -> None:
    """Launch ``kernel`` (a ``cupy.RawKernel``) as the double can: the launch checked as CuPy
    checks it, then ``twin(*args)``, the kernel's plain twin, run in its place and counted as one
    launch (its own operations are not counted). A twin must not copy to the host: that would
    be a copy the kernel does not make, and is refused.

    With ``CUPY_DOUBLE_KERNELS=host``, ``host(grid, block, host_args)`` runs instead: the
    kernel's own CUDA source executed on the CPU (a library's host execution), over the NumPy
    arrays under the double's (``host_args``: each device array as its NumPy array, no copy)."""
    global _inside_kernel
    from cupy._core import ndarray
    from cupy._core.raw import check_launch
    check_launch(grid, block, args)
    record("launches", f"kernel {kernel.name}")
    if KERNELS == "host":
        if host is None:
            raise AssertionError(f"CUPY_DOUBLE_KERNELS=host, but kernel {kernel.name!r} was "
                                 f"launched without a host execution")
        host(grid, block, tuple(a._a if isinstance(a, ndarray) else a for a in args))
        return
    before = _counts["device_to_host"]
    _inside_kernel += 1
    try:
        twin(*args)
    finally:
        _inside_kernel -= 1
    if _counts["device_to_host"] != before:
        raise AssertionError(f"the twin of kernel {kernel.name!r} copied to the host")


def device_to_host(what: str) -> None:
    record("device_to_host", what)


def counts() -> dict:
    """The counts since the start (or the last :func:`reset`)."""
    return dict(_counts)


def events() -> list[dict]:
    """Where each count happened (``CUPY_DOUBLE_TRACE=1`` only; else empty)."""
    return list(_events)


def reset() -> None:
    for kind in KINDS:
        _counts[kind] = 0
    _events.clear()


def describe(event_list) -> str:
    """Events in words, one a line, for an assertion message."""
    return "\n".join(f"{e['kind']} {e['what']} at {e['where']}" for e in event_list if e)


@contextlib.contextmanager
def counting():
    """Count what happens inside the block: yields a :class:`Counter`."""
    counter = Counter()
    _counters.append(counter)
    try:
        yield counter
    finally:
        _counters.remove(counter)


def _write_report() -> None:
    path = os.environ.get("CUPY_DOUBLE_REPORT")
    if not path:
        return
    report = {"rules": RULES, "pid": os.getpid(), "counts": counts()}
    if TRACE:
        report["events"] = _events
    path = path.replace("{pid}", str(os.getpid()))
    with open(path, "w") as f:
        json.dump(report, f)


atexit.register(_write_report)
