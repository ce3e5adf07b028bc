"""Points and lengths of a training run that do not depend on the machine: a budget in data
passes, and the late-dropout start and the cool-down given in updates or epochs.

A phase is written one of three ways (the ``--dropout-start`` / ``--cooldown`` values)::

    0.3         a fraction of the run: of its updates, or of the time limit if that comes first
    1200steps   1200 updates
    8epochs     8 passes over the training data (fractions allowed: 2.5epochs)

A fraction follows the clock, so where a run ends by ``--time-limit`` it depends on how fast the
machine is; a count of updates or epochs does not. An epoch counts as the updates one pass over
the training batches takes, ``epoch_updates`` (translation: the batches of one epoch over the
batches of one update; the language model: the training tokens over the tokens of one update),
rounded up: ``n`` epochs are the first ``ceil(n * epoch_updates)`` updates.

Parsed values stay plain JSON (a float for a fraction, the normalised text otherwise), so a run's
record (``run.json``) can hold and compare them. A time limit, the one length of a run that
does depend on the machine, is given in seconds and shown by :func:`describe_duration`.
"""

from __future__ import annotations

import math
import re

__all__ = ["AUTO", "parse", "is_fraction", "epochs_to_steps", "in_steps", "budget_steps",
           "describe", "describe_duration"]

AUTO = "auto"
_COUNT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(steps|epochs)")


def parse(text: str, *, auto: bool = False) -> float | str:
    """A phase from its text: a fraction in [0, 1) as a float, else ``"<N>steps"`` (N an integer
    > 0), ``"<x>epochs"`` (x > 0) or, where ``auto`` is allowed, ``"auto"``."""
    text = str(text).strip().lower()
    forms = "a fraction in [0, 1), a number of updates (1200steps), of epochs (8epochs)" + \
        (" or auto" if auto else "")
    if auto and text == AUTO:
        return AUTO
    match = _COUNT.fullmatch(text)
    if match:
        amount, unit = match.groups()
        if unit == "steps":
            if not amount.isdigit() or int(amount) < 1:
                raise ValueError(f"must be {forms}: updates are a whole number >= 1, got {text!r}")
            return f"{int(amount)}steps"
        if not float(amount) > 0:
            raise ValueError(f"must be {forms}: epochs must be > 0, got {text!r}")
        return f"{float(amount):g}epochs"
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be {forms}, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise ValueError(f"must be {forms}, got {text!r}")
    return value


def is_fraction(phase: float | str) -> bool:
    return not isinstance(phase, str)


def epochs_to_steps(epochs: float, epoch_updates: float) -> int:
    """The updates ``epochs`` passes over the data take: the first update boundary at or after
    them."""
    if not epoch_updates > 0:
        raise ValueError(f"an epoch must hold updates, got {epoch_updates}")
    return max(1, math.ceil(epochs * epoch_updates - 1e-9))


def in_steps(phase: float | str, epoch_updates: float) -> int:
    """A phase given in updates or epochs, as updates (not for a fraction or ``auto``)."""
    if is_fraction(phase) or phase == AUTO:
        raise ValueError(f"{phase!r} is not a count of updates or epochs")
    if phase.endswith("steps"):
        return int(phase[:-len("steps")])
    return epochs_to_steps(float(phase[:-len("epochs")]), epoch_updates)


def budget_steps(max_steps: int, max_epochs: float | None, epoch_updates: float) -> int:
    """The updates of a run: ``max_steps``, or fewer when ``max_epochs`` passes end it first."""
    if max_epochs is None:
        return max_steps
    return min(max_steps, epochs_to_steps(max_epochs, epoch_updates))


def describe(phase: float | str) -> str:
    """A phase in words: "30% of the run", "1200 updates", "8 epochs", "auto"."""
    if is_fraction(phase):
        return f"{phase:.0%} of the run"
    if phase == AUTO:
        return AUTO
    if phase.endswith("steps"):
        return f"{phase[:-len('steps')]} updates"
    return f"{phase[:-len('epochs')]} epochs"


def describe_duration(seconds: float) -> str:
    """A time limit (seconds) in the unit it reads best in: "90 s", "60 min", "1.5 h"."""
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if seconds >= size and (seconds / size).is_integer() or seconds >= 10 * size:
            return f"{seconds / size:.4g} {unit}"
    return f"{seconds:.4g} s"
