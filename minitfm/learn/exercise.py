"""One exercise's row: its named fields. The rows themselves, in reading order, are the table of
``exercises.py``; what an exercise of each kind is made of, how it is checked and what its hints
and solution are, its kind's object (``kinds.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from minitfm.learn.mistakes import Mistake

__all__ = ["Exercise"]


@dataclass(frozen=True)
class Exercise:
    """One exercise. ``kind``: its kind's object (``kinds.LAYER``: a gradient check of
    ``cases``; ``kinds.OPTIM``: Adam and the schedule against the library's update;
    ``kinds.MODEL``: the whole backward; ``kinds.KERNEL``: CUDA C run on the CPU, ``kernel``
    the library's :class:`minitfm.speed.fused.Kernel` by its dotted name,
    ``minitfm.speed.<layer>.NAME``, ``module`` the layer whose plain code its twin runs, and
    ``launch(rng)`` the check's launch: ``(grid, args, words)``, NumPy arrays and scalars typed
    as the kernel's parameters, and the launch in words).
    ``hints``: the hints written for it, after the first (the shapes, computed): the chain-rule
    step, then the derivation's start where the module's docstring does not give it.
    ``borrow``: names the exercise imports from the library instead of copying (not part of the
    exercise: a mask's random numbers). ``quantities``: name -> value of the case's numbers
    beyond its sizes (a dropout's scale), for the diagnosis of a constant factor, or a size's
    key -> its name where it is not the usual one (a stack's n, its number of layers).
    ``mistakes``: the named mistakes (``mistakes.MISTAKES``). ``todo``: a function's TODO in
    words, where it is not made from a call of the check. ``sizes``: the sizes the check runs
    its cases at (over the gradient checks' own, where the case has them), and for the model
    ``config``, the config's fields ("*": every case; a case's name: that case's): all
    distinct, none 2, none the square of another, so that no size written in place of another
    passes by coincidence (tests/learn/test_cases.py). ``number``: its place in the table,
    from 1."""
    name: str
    title: str
    module: str
    write: tuple[str, ...]
    keep: tuple[str, ...] = ()
    cases: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()
    kind: object = field(kw_only=True)      # a kinds.Kind, named in every row
    mistakes: tuple[Mistake, ...] = ()
    borrow: tuple[str, ...] = ()
    quantities: dict = field(default_factory=dict)
    kernel: str = ""
    launch: Callable | None = None
    todo: dict = field(default_factory=dict)
    constants: dict = field(default_factory=dict)   # module constants set for the check
    sizes: dict = field(default_factory=dict)       # the check's sizes (over its cases')
    config: dict = field(default_factory=dict)      # a model case's config: "*" and by case
    number: int = 0

    @property
    def filename(self) -> str:
        return f"{self.number:02d}_{self.name}{self.kind.suffix}"
