"""The argparse types of the commands' options: each reads a value and checks it before any work,
so that a bad one is a usage error naming the option and what it must be (status 2). NaN and
infinity are refused wherever a finite number is meant; a time limit carries its unit
(:func:`duration`); :func:`phase` reads a point or length of a run (a fraction, ``<N>steps``,
``<x>epochs``, ``auto``). The options themselves are declared in :mod:`minitfm.cli.options`.

A command reads its options with :class:`Parser`, argparse's parser with one difference: a
value that begins with a minus sign and a digit (``-5m``, ``-1e-3``, ``-2``) or names an
infinity or NaN (``-inf``) is the value of the option before it, so that ``--time-limit -5m``
is refused by the option's own type, which says what the option takes, and not for a missing
value ("expected one argument"). argparse itself reads only plain negative numbers so (``-2``,
``-.5``); no command has an option that begins with a digit.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from minitfm.cli import limits
from minitfm.training import phases

__all__ = ["Parser", "integer", "number", "positive_int", "duration", "phase", "vocab_size"]


class Parser(argparse.ArgumentParser):
    """argparse's parser, reading a value that looks negative (``-5m``, ``-1e-3``, ``-inf``) as
    the value of the option before it, as argparse reads ``-2``; its sub-parsers too.

    argparse decides whether a word is an option or a value by its ``_negative_number_matcher``
    (a word it matches is a value while no option looks like a negative number); this parser
    widens that pattern. The attribute is argparse's own, unchanged from Python 3.10 to 3.13."""

    NEGATIVE_LOOKING = re.compile(r"^-(\.?\d|inf(inity)?$|nan$)", re.IGNORECASE)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = self.NEGATIVE_LOOKING


def _bounds(low, high, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{_shown(low)}, {_shown(high)}" \
               f"{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {_shown(low)}"
    if high is not None:
        return f"{'<' if high_open else '<='} {_shown(high)}"
    return ""


def _shown(bound: float) -> str:
    """A bound as written: an integer whole (2147483647), a float short (0.5, 1e-08)."""
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


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
_EXAMPLES = "90s, 60m, 1.5h"


def duration(text: str) -> float:
    """An argparse ``type=`` for a length of time with its unit, in seconds: ``90s``, ``60m``,
    ``1.5h`` (> 0). A bare number is refused: the unit is part of the value; so is a time of 0
    or below (``-5m``), with the way to write one."""
    match = re.fullmatch(r"\s*([-+]?)(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)\s*", text.lower())
    if not match:
        raise argparse.ArgumentTypeError(f"must be a time with its unit, s, m or h ({_EXAMPLES}), "
                                         f"got {text!r}")
    sign, number_text, unit = match.groups()
    seconds = float(number_text) * _UNITS.get(unit, 1.0)
    if sign == "-" or seconds == 0:
        raise argparse.ArgumentTypeError(f"must be a time above 0, with its unit, s, m or h "
                                         f"({_EXAMPLES}), got {text!r}")
    if not unit:
        raise argparse.ArgumentTypeError(f"must be a time with its unit, s, m or h ({_EXAMPLES}), "
                                         f"got {text!r} (a bare number: {number_text}s or "
                                         f"{number_text}m?)")
    if not seconds < math.inf:
        raise argparse.ArgumentTypeError(f"must be a time of finite length, s, m or h "
                                         f"({_EXAMPLES}), got {text!r}")
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
    limit (:data:`minitfm.cli.limits.SENTENCEPIECE_MAX_VOCAB`)."""
    value = integer(8)(text)
    if value > limits.SENTENCEPIECE_MAX_VOCAB:
        raise argparse.ArgumentTypeError(
            f"must be at most {limits.SENTENCEPIECE_MAX_VOCAB} (sentencepiece stores the "
            f"vocabulary size as a 32-bit integer), got {text!r}")
    return value
