"""Validation: the loss of the validation batches, and choosing by it -- the best checkpoint so
far, the few best kept, patience, and the automatic start of late dropout.

:func:`evaluate` is the loss, NLL and perplexity per target token of validation batches,
without dropout; a caller's metric (BLEU, exact match) joins them at each validation
(:meth:`minitfm.training.run.Run.validate`).

A run that names a metric (``TrainOptions.best_metric``, a key of the validation results:
``valid_loss``, ``valid_bleu``, ...) judges each validation by it, in the direction the metric
implies (:data:`HIGHER_IS_BETTER`): a validation improves on the best so far when its value is
strictly better (a tie is no improvement). Everything the run has judged so far is one
:class:`Record`, small and JSON-able, stored in every checkpoint (``extra["validation"]``), so a
resumed run goes on judging exactly as an uninterrupted one would:

- ``best``, ``best_step``: the best value so far and the step of its validation;
- ``since_best``: validations since then without improvement (``patience`` stops the run when
  it reaches that number);
- ``kept``: ``[value, step]`` of the ``keep_best`` best validations, best first (ties: the
  earlier step); the run directory keeps their checkpoints, which rotation never deletes;
- ``last_validated``, ``last_ppl``: the step and the perplexity of the latest validation;
- ``dropout_from``: with the automatic late-dropout start, the first update with dropout.

A checkpoint saved at a validation also records that validation's results
(``extra["valid"]``, with its ``step``): :func:`recorded_metric` reads them back, as
``python -m minitfm.average --best N`` does to rank checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from minitfm import models
from minitfm.checkpoint import Checkpoint, CheckpointError

__all__ = ["Batch", "ValidMetric", "evaluate", "HIGHER_IS_BETTER", "NoRecordedMetric", "Record",
           "check_metric", "better", "recorded_metric", "ranked"]

Batch = tuple            # (src (B, S), tgt (B, T+1)), or (x (B, T), y (B, T)) for lm: token ids
ValidMetric = Callable[[dict, object], dict]     # (params, cfg) -> {"valid_bleu": ...}


def evaluate(params: dict, cfg, batches: Iterable[Batch]) -> dict:
    """Loss, NLL and perplexity per target token over ``batches``, without dropout."""
    loss_sum = nll_sum = 0.0
    tokens = 0
    for a, b in batches:
        stats, _ = models.of(cfg).loss_and_grads(params, cfg, a, b, grads=False, normalizer=1.0)
        loss_sum += stats["loss"]
        nll_sum += stats["nll"]
        tokens += stats["tokens"]
    if tokens == 0:
        raise ValueError("the validation batches hold no target tokens")
    nll = float(nll_sum) / tokens
    return {"valid_loss": float(loss_sum) / tokens, "valid_nll": nll,
            "valid_ppl": math.exp(min(nll, 700.0))}

# the metrics a run can choose by, and their direction
HIGHER_IS_BETTER = {"valid_loss": False, "valid_nll": False, "valid_ppl": False,
                    "valid_bleu": True, "valid_acc": True}


class NoRecordedMetric(CheckpointError):
    """A checkpoint holds no validation metric to rank it by."""


def check_metric(metric: str) -> None:
    if metric not in HIGHER_IS_BETTER:
        raise ValueError(f"unknown validation metric {metric!r}: choose one of "
                         f"{', '.join(HIGHER_IS_BETTER)}")


def better(metric: str, value: float, than: float | None) -> bool:
    """Whether ``value`` of ``metric`` is strictly better than ``than`` (None: anything finite
    is). A NaN or infinite value is never better."""
    if not math.isfinite(value):
        return False
    if than is None:
        return True
    return value > than if HIGHER_IS_BETTER[metric] else value < than


def _rank_key(metric: str, value: float, step: int) -> tuple[float, int]:
    """Sorts best first; among equal values the earlier step first."""
    return (-value if HIGHER_IS_BETTER[metric] else value, step)


@dataclass
class Record:
    """What a run has judged by validation so far (see the module's docstring)."""

    metric: str | None = None
    best: float | None = None
    best_step: int | None = None
    since_best: int = 0
    kept: list = field(default_factory=list)        # [[value, step], ...], best first
    last_validated: int | None = None
    last_ppl: float | None = None
    dropout_from: int | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> Record:
        data = dict(data or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CheckpointError(f"the validation record of this checkpoint has fields this "
                                  f"minitfm does not know: {unknown}")
        return cls(**data)

    def judge(self, step: int, results: dict, keep_best: int,
              dropout_margin: float | None = None) -> tuple[bool, str | None]:
        """Take the validation of ``step``: whether it improved on the best so far, and (with a
        ``dropout_margin``, the automatic late-dropout start) the words saying that dropout
        starts now, or None."""
        previous_ppl = self.last_ppl
        self.last_validated = step
        if "valid_ppl" in results:
            self.last_ppl = results["valid_ppl"]
        started = None
        if dropout_margin is not None:
            started = self._start_dropout_if_flat(step, previous_ppl, dropout_margin)
        if self.metric is None:
            return False, started
        if self.metric not in results:
            raise ValueError(f"the validation results ({', '.join(sorted(results))}) hold no "
                             f"{self.metric}, the metric the run chooses by")
        value = results[self.metric]
        improved = better(self.metric, value, self.best)
        if improved:
            self.best, self.best_step, self.since_best = value, step, 0
        else:
            self.since_best += 1
        if keep_best and math.isfinite(value):
            kept = [pair for pair in self.kept if pair[1] != step] + [[value, step]]
            kept.sort(key=lambda pair: _rank_key(self.metric, *pair))
            self.kept = kept[:keep_best]
        return improved, started

    def kept_steps(self, keep_best: int) -> list[int]:
        """The steps of the checkpoints kept as the ``keep_best`` best."""
        return [step for _, step in self.kept[:keep_best]]

    def describe_best(self) -> str:
        if self.best is None:
            return f"no finite {self.metric} yet"
        return f"best {self.metric} {self.best:.4g} at step {self.best_step}"

    def _start_dropout_if_flat(self, step: int, previous: float | None,
                               margin: float) -> str | None:
        """Dropout starts with the next update at the first validation whose perplexity improved
        on the previous validation's by less than ``margin`` (relative)."""
        if self.dropout_from is not None or previous is None or self.last_ppl is None:
            return None
        gain = (previous - self.last_ppl) / previous
        if gain >= margin:
            return None
        self.dropout_from = step + 1
        return (f"dropout starts at step {step + 1}: validation perplexity {self.last_ppl:.4g} "
                f"improved by {gain:.2%} on {previous:.4g}, less than the margin of {margin:.2%}")


# ---- ranking checkpoints by their recorded metric ----------------------------------------------

def recorded_metric(ckpt: Checkpoint) -> tuple[str, float] | None:
    """``(metric, value)`` of the validation recorded in ``ckpt``: the metric its run chose by,
    from the validation of the checkpoint's own step; None when there is none."""
    metric = (ckpt.extra.get("validation") or {}).get("metric")
    valid = ckpt.extra.get("valid") or {}
    if metric is None or valid.get("step") != ckpt.step or metric not in valid:
        return None
    return metric, float(valid[metric])


def ranked(ckpts: list[Checkpoint]) -> list[Checkpoint]:
    """``ckpts`` best first by their recorded metric (ties: the earlier step first). Refuses a
    checkpoint without one, or checkpoints chosen by different metrics."""
    scored = []
    for ckpt in ckpts:
        found = recorded_metric(ckpt)
        if found is None:
            raise NoRecordedMetric(
                f"checkpoint {ckpt.path} (step {ckpt.step}) has no recorded validation metric: "
                f"only checkpoints saved at a validation of a run with --best-metric have one; "
                f"pass those (or the run directory), or average with --last N")
        scored.append((found, ckpt))
    metrics = sorted({metric for (metric, _), _ in scored})
    if len(metrics) > 1:
        raise NoRecordedMetric(f"the checkpoints were chosen by different metrics "
                               f"({', '.join(metrics)}): rank checkpoints of one run only")
    return [ckpt for (metric, value), ckpt in
            sorted(scored, key=lambda item: _rank_key(item[0][0], item[0][1], item[1].step))]
