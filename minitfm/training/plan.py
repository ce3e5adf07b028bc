"""What a run's options come to once its data is known: how many updates it makes, the learning
rate of each, and from which update dropout is on.

An epoch is ``epoch_updates`` updates, counted by the trainer from its data (translation: the
batches of one epoch over the batches of one update, of all workers; the language model: the
training tokens over the tokens of one update). Budgets and phases given in epochs become
updates with it (:mod:`minitfm.training.phases`); where there are no epochs (endless synthetic
data: ``epoch_updates=None``), they are refused.

The learning rate (:mod:`minitfm.optim`): ``schedule="paper"``, equation (3) times
``lr_factor``; ``"linear"`` or ``"cosine"``, a warm-up to ``lr`` (default: the paper's rate at the
end of the warm-up, times ``lr_factor``) then a decay to ``min_lr`` at the last update, or at the
time limit if that comes first; then a ``cooldown`` (a phase) to 0 at the end of the run.

Late dropout (``dropout_start``): no dropout for the first part of the run, a fraction of it
(measured as the cool-down measures it, by the updates or by the clock, whichever is further),
a number of updates or epochs (the same on any machine), or ``auto``: until the first validation
whose perplexity improved by less than ``dropout_start_margin`` (the validation record keeps
the update it starts at: :class:`minitfm.training.validation.Record`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from minitfm.optim import Cooldown, LRSchedule, WarmupDecaySchedule, run_progress
from minitfm.training import phases
from minitfm.training.state import TrainOptions

__all__ = ["PlanError", "Plan", "plan"]


class PlanError(ValueError):
    """Options that do not fit the run's data (a cool-down longer than the run, a budget in
    epochs without epochs): the message names the options."""


@dataclass(frozen=True)
class Plan:
    """The run's updates, the rate of each, and when dropout starts."""

    steps: int                                   # updates of the whole run
    schedule: Callable[[int, float], float]      # lr(step, time_fraction)
    schedule_words: str                          # the schedule, for the run's first lines
    dropout_start: float = 0.0                   # dropout off before this fraction of the run
    dropout_start_step: int = 0                  # ... or for this many updates
    dropout_start_auto: float | None = None      # ... or until a validation decides (a margin)

    def dropout_off(self, step: int, time_fraction: float, started: int | None) -> bool:
        """Whether update ``step`` runs without dropout; ``time_fraction``: the part of the time
        limit spent; ``started``: the first update with dropout that a validation decided on
        (``dropout_start_auto``; None: not yet)."""
        if self.dropout_start_auto is not None:
            return started is None or step < started
        if self.dropout_start_step:
            return step <= self.dropout_start_step
        return run_progress(step, self.steps, time_fraction) < self.dropout_start


def plan(options: TrainOptions, d_model: int, epoch_updates: float | None = None) -> Plan:
    """The plan of a run of a model of width ``d_model`` whose epoch is ``epoch_updates``
    updates (None: no epochs)."""
    steps = options.max_steps
    if options.max_epochs is not None:
        steps = phases.budget_steps(options.max_steps, options.max_epochs,
                                    _epoch(epoch_updates, "--max-epochs"))
        if options.schedule != "paper" and options.warmup >= steps:
            raise PlanError(f"--max-epochs {options.max_epochs:g} is {steps} updates, not more "
                            f"than --warmup {options.warmup}: the {options.schedule} decay ends "
                            f"at the last update")
    return Plan(steps, _schedule(options, d_model, steps, epoch_updates),
                _schedule_words(options, d_model), **_dropout_start(options, steps,
                                                                     epoch_updates))


def _epoch(epoch_updates: float | None, option: str) -> float:
    if epoch_updates is None:
        raise PlanError(f"{option} counts epochs, but this run's data has none: give updates")
    return epoch_updates


def _updates(phase: str, epoch_updates: float | None, option: str) -> int:
    """``option``'s ``phase`` (``1100steps``, ``2epochs``) in updates."""
    return phases.in_steps(phase, _epoch(epoch_updates, option) if phase.endswith("epochs")
                           else 1.0)


def _peak(options: TrainOptions, d_model: int) -> float:
    """The peak of a decay: ``lr``, by default the paper's rate at the end of the warm-up."""
    return options.lr or options.lr_factor * (d_model * max(options.warmup, 1)) ** -0.5


def _schedule(options: TrainOptions, d_model: int, steps: int,
              epoch_updates: float | None) -> Callable[[int, float], float]:
    """``--schedule``, then ``--cooldown``."""
    try:
        if options.schedule == "paper":
            schedule = LRSchedule(d_model, options.warmup, options.lr_factor)
        else:
            schedule = WarmupDecaySchedule(_peak(options, d_model), options.warmup, steps,
                                           options.min_lr, options.schedule)
        cooldown = options.cooldown
        if not cooldown:
            return schedule
        if phases.is_fraction(cooldown):
            return Cooldown(schedule, steps, cooldown)
        length = _updates(cooldown, epoch_updates, "--cooldown")
        if length > steps:
            raise PlanError(f"--cooldown {cooldown} is {length} updates, more than the run's "
                            f"{steps}")
        return Cooldown(schedule, steps, length / steps, follow_clock=False)
    except PlanError:
        raise
    except ValueError as exc:
        raise PlanError(f"learning-rate options: {exc}") from exc


def _schedule_words(options: TrainOptions, d_model: int) -> str:
    cooldown = options.cooldown
    after = (f", cool-down over the last {phases.describe(cooldown).removesuffix(' of the run')}"
             if cooldown else "")
    if options.schedule == "paper":
        return f"the paper's schedule, lr factor {options.lr_factor:g}{after}"
    return (f"peak lr {_peak(options, d_model):.3g}, {options.schedule} decay to "
            f"{options.min_lr:g} at the end{after}")


def _dropout_start(options: TrainOptions, steps: int, epoch_updates: float | None) -> dict:
    """The :class:`Plan` fields of ``--dropout-start`` (and ``--dropout-start-margin``)."""
    start = options.dropout_start
    if start == phases.AUTO:
        return {"dropout_start_auto": options.dropout_start_margin}
    if phases.is_fraction(start):
        return {"dropout_start": start}
    first = _updates(start, epoch_updates, "--dropout-start")
    if first >= steps:
        raise PlanError(f"--dropout-start {start} is {first} updates, but the run has {steps}: "
                        f"dropout would never start")
    return {"dropout_start_step": first}
