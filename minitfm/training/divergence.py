"""Stopping a run whose numbers ran off, before a checkpoint of the broken state is written.

Three things raise :class:`TrainingDiverged`, naming the step and the last good checkpoint:

- a NaN or Inf loss or gradient norm in a logged window (:func:`check_finite`);
- parameters that are no longer finite when a checkpoint is due (the training loop turns
  ``checkpoint.NonFiniteError`` into :func:`diverged`);
- a finite blow-up (:class:`DivergenceWatch`): a logged window's loss above four times chance,
  4 ln V (a model that guesses uniformly scores ln V, where every fresh model starts), at once;
  or above twice chance, 2 ln V, for ``DIVERGED_WINDOWS`` logged windows in a row.

Every check reads the numbers the log line reads already (no further wait for the device), and
runs at every log line, the warmup included: a learning rate far too high shows in the first
windows, long before a warmup of thousands of steps ends.
"""

from __future__ import annotations

import math
from typing import Protocol

__all__ = ["TrainingDiverged", "DIVERGED_WINDOWS", "FAR_ABOVE_CHANCE", "DivergenceWatch",
           "diverged", "check_finite"]

DIVERGED_WINDOWS = 3     # logged windows in a row above 2 ln V that stop a run
FAR_ABOVE_CHANCE = 4.0   # one logged window above this many times ln V stops a run at once


class TrainingDiverged(RuntimeError):
    """The loss or the parameters stopped being finite numbers, or the loss ran far off."""


class Progress(Protocol):
    """What the watch reads of a run's state (``train.TrainState`` has both)."""

    step: int                       # updates done
    last_checkpoint: str | None     # the newest checkpoint written, if any
    spared_step: int | None         # the step of a checkpoint rotation must keep (the watch's)


def diverged(what: str, step: int | str, state: Progress,
             good: str | None = None) -> TrainingDiverged:
    """The error for ``what`` went wrong at ``step`` (a step, or a phrase such as "steps 11-20"
    for a logged window); ``good``: the last checkpoint known good (default: the latest)."""
    good = state.last_checkpoint if good is None else good
    resume = "resume from that checkpoint (--resume)"
    if good and good != state.last_checkpoint:
        resume = ("resume from that checkpoint (move the newer ones aside, e.g. rename them to "
                  ".npz.bad: --resume takes the newest checkpoint_*.npz)")
    if good:
        kept = f"the last good checkpoint, {good}, is intact"
    elif state.last_checkpoint:
        kept = f"every checkpoint up to {state.last_checkpoint} was written after the loss ran off"
    else:
        kept = "no checkpoint was written"
    return TrainingDiverged(
        f"{what} at {step if isinstance(step, str) else f'step {step}'}; training stopped and "
        f"{kept}. Lower the learning rate (--lr-factor, or --lr), lengthen the warmup (--warmup) "
        f"or clip gradients (--clip-norm), then "
        + (f"{resume} or start again" if good else "start again"))


def check_finite(loss: float, nll: float, grad_norm: float | None, window_steps: int,
                 state: Progress) -> None:
    """Raise :class:`TrainingDiverged` if the logged window of ``window_steps`` updates, ending
    at ``state.step``, has a NaN or Inf loss, NLL or gradient norm."""
    if not (math.isfinite(loss) and math.isfinite(nll)):
        first = state.step - window_steps + 1
        when = f"step {state.step}" if first == state.step else f"steps {first}-{state.step}"
        raise diverged(f"the training loss is {loss}", when, state)
    if grad_norm is not None and not math.isfinite(grad_norm):
        raise diverged(f"the gradient norm is {grad_norm}", f"step {state.step}", state)


class DivergenceWatch:
    """Stops a run whose loss runs far above chance, warmup included: one logged window above
    ``FAR_ABOVE_CHANCE`` ln V, or ``DIVERGED_WINDOWS`` in a row above 2 ln V. Call :meth:`check`
    with each logged window's loss per token and :meth:`saved` after each checkpoint: the last
    checkpoint saved while the loss was below 2 ln V is the one the error names as good; while a
    logged window's loss is above 2 ln V, ``state.spared_step`` names it, and rotation keeps it.

    ``warmup`` only words the message ("during the warmup"): the watch runs at every step."""

    def __init__(self, vocab: int, warmup: int, state: Progress) -> None:
        if vocab < 2:
            raise ValueError(f"DivergenceWatch needs an output vocabulary of at least 2 tokens "
                             f"(chance is ln V), got {vocab}")
        self.limit = 2.0 * math.log(vocab)
        self.far_limit = FAR_ABOVE_CHANCE * math.log(vocab)
        self.warmup, self.state = warmup, state
        self.high = 0                             # windows in a row above the limit
        self.good_checkpoint, self.good_step = state.last_checkpoint, state.step

    def check(self, loss: float) -> None:
        when = " during the warmup" if self.state.step <= self.warmup else ""
        if loss > self.far_limit:
            raise diverged(
                f"the training loss ran off{when}: {loss:.4g} per token, above "
                f"{FAR_ABOVE_CHANCE:g} ln V = {self.far_limit:.2f} ({FAR_ABOVE_CHANCE:g} times "
                f"chance)", self.state.step, self.state, good=self._good())
        if loss <= self.limit:
            self.high = 0
            self.state.spared_step = None
            return
        self.high += 1
        if self.good_checkpoint:        # the checkpoint the error would name: rotation keeps it
            self.state.spared_step = self.good_step
        if self.high >= DIVERGED_WINDOWS:
            raise diverged(
                f"the training loss has stayed above 2 ln V = {self.limit:.2f} (twice chance) "
                f"for {self.high} logged windows{when}, at {loss:.4g} per token",
                self.state.step, self.state, good=self._good())

    def _good(self) -> str:
        """The last checkpoint saved below the limit; "" when none was."""
        return self.good_checkpoint or ""

    def saved(self) -> None:
        if self.high == 0:
            self.good_checkpoint, self.good_step = self.state.last_checkpoint, self.state.step
