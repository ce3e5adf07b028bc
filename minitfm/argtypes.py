"""The argparse types of the commands' options: each reads a value and checks it before any work,
so that a bad one is a usage error naming the option and what it must be (status 2). NaN and
infinity are refused wherever a finite number is meant; a time limit carries its unit
(:func:`duration`); :func:`phase` reads a point or length of a run (a fraction, ``<N>steps``,
``<x>epochs``, ``auto``). The options themselves are declared in :mod:`minitfm.options`.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from minitfm import limits
from minitfm.training import phases

__all__ = ["integer", "number", "positive_int", "duration", "phase", "vocab_size"]


def _bounds(low, high, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high:g}"
    return ""


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=`` for an integer in [low, high] (None: unbounded)."""
    def parse(text: str) -> int:
        wanted = " ".join(filter(None, ("an integer", _bounds(low, high, False, False))))
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value
    return parse


positive_int = integer(1)


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type=`` for a finite number in the given range; NaN and infinity are
    refused. ``low_open`` / ``high_open`` exclude the bound itself."""
    def parse(text: str) -> float:
        wanted = " ".join(filter(None, ("a finite number",
                                         _bounds(low, high, low_open, high_open))))
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        if (not math.isfinite(value)
                or (low is not None and (value < low or (low_open and value == low)))
                or (high is not None and (value > high or (high_open and value == high)))):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value
    return parse


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """An argparse ``type=`` for a length of time with its unit, in seconds: ``90s``, ``60m``,
    ``1.5h`` (> 0). A bare number is refused: the unit is part of the value."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh])\s*", text.lower())
    if not match:
        bare = text.strip()
        hint = f" (a bare number: {bare}s or {bare}m?)" if re.fullmatch(r"[\d.]+", bare) else ""
        raise argparse.ArgumentTypeError(f"must be a time with its unit, s, m or h (90s, 60m, "
                                         f"1.5h), got {text!r}{hint}")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(f"must be a time > 0, got {text!r}")
    return seconds


def phase(*, auto: bool = False) -> Callable[[str], float | str]:
    """An argparse ``type=`` for a point or length of a run (minitfm.training.phases): a
    fraction in [0, 1), ``<N>steps``, ``<x>epochs`` or, with ``auto``, ``auto``."""
    def parse(text: str) -> float | str:
        try:
            return phases.parse(text, auto=auto)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def vocab_size(text: str) -> int:
    """An argparse ``type=`` for ``--vocab-size``: an integer from 8 to sentencepiece's int32
    limit (:data:`minitfm.limits.SENTENCEPIECE_MAX_VOCAB`)."""
    value = integer(8)(text)
    if value > limits.SENTENCEPIECE_MAX_VOCAB:
        raise argparse.ArgumentTypeError(
            f"must be at most {limits.SENTENCEPIECE_MAX_VOCAB} (sentencepiece stores the "
            f"vocabulary size as a 32-bit integer), got {text!r}")
    return value
