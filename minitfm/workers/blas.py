"""Host-only: what the BLAS library NumPy loads reads from the environment, set before it loads.
Imported by the package itself (``minitfm/__init__.py``), ahead of any array math; a value
already in the environment wins, so a user's own setting is kept.

``OPENBLAS_THREAD_TIMEOUT``: OpenBLAS's threads wait for work spinning, 2^28 cycles (about 0.1 s)
after each product, before they sleep. Between the products of a training step they then never
sleep, and keep every core but one busy-waiting where the row passes (:mod:`minitfm.speed.rows`) would
run: a ``small`` step on two cores took 0.836 s with them spinning and 0.764 s at 2^16 cycles
(about 25 us, which still bridges back-to-back products); the plain code, 0.83 s either way.

OpenBLAS reads it once, when NumPy loads it: a program that imports NumPy before minitfm keeps
OpenBLAS's default (the commands import minitfm first).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["SETTINGS", "apply"]

SETTINGS = {"OPENBLAS_THREAD_TIMEOUT": "16"}       # 2^16 cycles


def apply(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set each of :data:`SETTINGS` that ``environ`` (the process's) lacks; return those set."""
    chosen = {name: value for name, value in SETTINGS.items() if name not in environ}
    environ.update(chosen)
    return chosen
