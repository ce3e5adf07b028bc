"""A training run as the trainers make one, for tests that need only its end: the run opened
(its directory taken, a resumed checkpoint read and checked), started, and trained."""

from minitfm import models
from minitfm.training import loop
from minitfm.training.run import Run
from minitfm.training.state import TrainOptions, TrainState


def train(cfg, batches, options: TrainOptions, **start) -> TrainState:
    """Train ``cfg``'s model on ``batches`` as ``options`` say; ``start``: the arguments of
    :meth:`Run.start` (parameters, vocabulary, validation, ...)."""
    with Run(options, models.of(cfg).KIND) as run:
        run.start(cfg, **start)
        return loop.train(run, batches)
