"""The fast path of the output projection at decoding (``minitfm/layers/output.py``), chosen per
call by :mod:`minitfm.speed.policy`: under ``--precision fp16`` the projection takes float16
operands, as in training (the linear layer's float16 path, ``speed/linear.py``).
"""

from __future__ import annotations

from minitfm.layers import linear, output
from minitfm.speed import mixed, policy


@policy.fast_path(output.project)
def choose_project(h, w):
    """The float16 products at decoding (--precision fp16)."""
    return half_project if mixed.enabled(h) else None


def half_project(h, w):
    """``output.project`` with float16 operands."""
    return linear.forward(h, {"w": w})[0]
