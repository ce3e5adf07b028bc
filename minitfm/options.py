"""The commands' shared options: argparse types that check a value before any work, and the
option groups more than one command has.

- every numeric option is checked by argparse with a ``type=`` from here (:func:`integer`,
  :func:`number`): a bad value is a usage error naming the option and its allowed range, before
  any work; NaN and infinity are refused wherever a finite number is meant; :func:`phase` reads a
  point or length of a run (a fraction, ``<N>steps``, ``<x>epochs``, ``auto``);
- ``add_*_options`` add one group each (optimiser, schedule, checkpoints, validation, logging,
  seed, precision) with the calling command's defaults, so that the same option means the same
  thing, with the same help, in ``train_toy.py``, ``train_lm.py`` and ``train_wmt.py``;
- :func:`add_search_options`: beam search's settings, the same in ``minitfm.translate``,
  ``train_wmt.py --eval-only`` and ``minitfm.export``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence

from minitfm import backend, beam, fused, gradscale, phases

__all__ = ["integer", "number", "positive_int", "phase", "add_optimiser_options",
           "add_schedule_options", "add_checkpoint_options", "BEST_METRICS",
           "add_validation_options", "check_validation_options", "validation_options",
           "add_max_epochs_option", "add_logging_options", "add_seed_option",
           "add_precision_option", "precision_options", "add_kernels_option",
           "add_search_options"]


# ---- option values ---------------------------------------------------------------------------

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


def phase(*, auto: bool = False) -> Callable[[str], float | str]:
    """An argparse ``type=`` for a point or length of a run (minitfm.phases): a fraction in
    [0, 1), ``<N>steps``, ``<x>epochs`` or, with ``auto``, ``auto``."""
    def parse(text: str) -> float | str:
        try:
            return phases.parse(text, auto=auto)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


# ---- option groups shared by the training commands ------------------------------------------
# Each command passes its own defaults: a value (None: filled in later, from a preset or a task)
# and the words its help shows for it, such as "default 10" or "default: preset".

def add_optimiser_options(group, *, warmup: str, warmup_type=positive_int,
                          lr_factor: tuple[float | None, str] | None = None,
                          weight_decay: str | None = None) -> None:
    """``--warmup``, ``--clip-norm``; ``--lr-factor`` (``(default, words)``) and
    ``--weight-decay`` where the command has them."""
    group.add_argument("--warmup", type=warmup_type, help=f"warmup steps ({warmup})")
    if lr_factor is not None:
        group.add_argument("--lr-factor", type=number(0, low_open=True), default=lr_factor[0],
                           help=f"scales the paper's learning-rate schedule "
                                f"({lr_factor[1]})")
    if weight_decay is not None:
        group.add_argument("--weight-decay", type=number(0),
                           help=f"AdamW's decoupled decay ({weight_decay})")
    group.add_argument("--clip-norm", type=number(0, low_open=True),
                       help="clip the gradient norm (default: no)")


def add_schedule_options(group, *, choices: Sequence[str], default: str, lr_help: str,
                         min_lr: tuple[float | None, str], steps: str,
                         cooldown: bool = False) -> None:
    """``--schedule``, ``--lr``, ``--min-lr`` (``(default, words)``) and where the command has it
    ``--cooldown``; ``steps``: the option that ends the run (``--max-steps``, ``--steps``)."""
    group.add_argument("--schedule", choices=tuple(choices),
                       help=f"after the warmup: the paper's inverse square root, or a linear or "
                            f"cosine decay to --min-lr at {steps}, or at --time-limit if that "
                            f"comes first ({default})")
    group.add_argument("--lr", type=number(0, low_open=True), help=lr_help)
    group.add_argument("--min-lr", type=number(0), default=min_lr[0],
                       help=f"rate at {steps} with --schedule linear or cosine "
                            f"({min_lr[1]})")
    if cooldown:
        group.add_argument("--cooldown", type=phase(), metavar="PHASE",
                           help=f"bring the rate down linearly to 0 over this last part of the "
                                f"run: a fraction (of {steps}, or of --time-limit if that comes "
                                f"first), or a number of updates (1200steps) or epochs (8epochs) "
                                f"before the end of {steps} or --max-epochs, whatever the clock")


def add_checkpoint_options(group, *, save_every: tuple[int | None, str],
                           keep_last: bool = False) -> None:
    """``--save-every`` (``(default, words)``) and where the command has it ``--keep-last``."""
    group.add_argument("--save-every", type=integer(0), default=save_every[0],
                       help=f"steps between checkpoints ({save_every[1]})")
    if keep_last:
        group.add_argument("--keep-last", type=positive_int, default=5,
                           help="checkpoints kept (default 5)")


BEST_METRICS = {"loss": "valid_loss", "bleu": "valid_bleu", "acc": "valid_acc"}


def add_validation_options(group, metrics: Sequence[str],
                           valid_option: str = "--valid-every") -> None:
    """``--best-metric`` (one of ``metrics``, keys of BEST_METRICS), ``--keep-best`` and
    ``--patience``: choosing checkpoints by validation (minitfm.validation)."""
    words = {"loss": "loss (lower is better)", "bleu": "bleu (greedy BLEU, higher is better)",
             "acc": "acc (exact match, higher is better)"}
    group.add_argument("--best-metric", choices=tuple(metrics),
                       help=f"choose by this validation result: "
                            f"{', '.join(words[m] for m in metrics)}. Every validation then "
                            f"saves a checkpoint that records it, its log line and run.json "
                            f"show the best so far and its step, and "
                            f"checkpoint_best.npz names the best checkpoint (default: none)")
    group.add_argument("--keep-best", type=integer(0), default=0, metavar="N",
                       help="also keep the checkpoints of the N best validations, which the "
                            "rotation of the last ones never deletes (needs --best-metric; "
                            "default 0)")
    group.add_argument("--patience", type=integer(0), default=0, metavar="N",
                       help=f"stop after N validations (every {valid_option}) without a better "
                            f"--best-metric (a tie is no improvement); the run ends as done, "
                            f"exit status 0 (default 0: never)")


def check_validation_options(parser: argparse.ArgumentParser, args: argparse.Namespace,
                             valid_every: int, valid_option: str = "--valid-every") -> None:
    """The choosing options fit together; ``valid_every``: the steps between validations."""
    if args.best_metric is None:
        for name in ("keep_best", "patience"):
            if getattr(args, name):
                parser.error(f"--{name.replace('_', '-')} ranks validations by --best-metric: "
                             f"give that too (e.g. --best-metric loss)")
    if args.patience and not valid_every:
        parser.error(f"--patience counts validations: give {valid_option} N (> 0)")


def validation_options(args: argparse.Namespace) -> dict:
    """The TrainOptions fields of ``--best-metric``, ``--keep-best`` and ``--patience``."""
    return dict(best_metric=BEST_METRICS.get(args.best_metric), keep_best=args.keep_best,
                patience=args.patience)


def add_max_epochs_option(group, epoch: str) -> None:
    """``--max-epochs``: a budget in passes over the data; ``epoch``: what one pass is, in
    updates."""
    group.add_argument("--max-epochs", type=number(0, low_open=True), metavar="N",
                       help=f"stop after N passes over the training data ({epoch}), or at the "
                            f"step or time limit if that comes first")


def add_logging_options(group, *, valid_every: tuple[int | None, str],
                        valid_option: str = "--valid-every", log_every: bool = False) -> None:
    """``--valid-every`` (or the command's ``valid_option``; ``(default, words)``) and where the
    command has it ``--log-every``."""
    if log_every:
        group.add_argument("--log-every", type=positive_int, default=10,
                           help="steps between log lines (default 10)")
    group.add_argument(valid_option, type=integer(0), default=valid_every[0],
                       help=f"steps between validations ({valid_every[1]})")


def add_seed_option(group, what: str = "") -> None:
    group.add_argument("--seed", type=integer(0), default=0,
                       help=f"seeds {what or 'initialisation, dropout and the data'} (default 0)")


def add_precision_option(group) -> None:
    """``--precision fp32|tf32|fp16`` (backend.set_precision, minitfm.mixed) and
    ``--loss-scale``, the initial loss scale of fp16 (minitfm.gradscale)."""
    group.add_argument("--precision", choices=backend.PRECISIONS,
                       help="matrix products: tf32 on a GPU's tensor cores (compute capability "
                            "8.0 or higher; batched products, attention's, stay float32), plain "
                            "fp32, or fp16: mixed precision, float16 operands summed in float32 "
                            "with float32 master weights and a dynamic loss scale (on the CPU "
                            "too, slowly) (default: tf32 on such a GPU, else fp32)")
    group.add_argument("--loss-scale", type=number(0, low_open=True),
                       default=gradscale.INITIAL_SCALE, metavar="S",
                       help=f"fp16: the initial loss scale, halved at every update whose "
                            f"gradients overflow (skipped) and doubled after "
                            f"{gradscale.GROWTH_INTERVAL} finite ones (default 2^16)")


def precision_options(args: argparse.Namespace) -> dict:
    """The TrainOptions fields of the precision options (``--loss-scale``)."""
    return {"loss_scale": args.loss_scale}


def add_kernels_option(group) -> None:
    """``--kernels plain|fused``: the array code or the fused GPU kernels (minitfm.fused)."""
    group.add_argument("--kernels", choices=fused.CHOICES,
                       help="on a GPU: fused kernels (softmax, LayerNorm, dropout, loss, Adam "
                            "... each in one launch) or the plain array code NumPy runs too "
                            "(default plain: fused becomes the default once a GPU run has shown "
                            "every kernel equal to its plain twin)")


def add_search_options(group) -> None:
    """``--beam``, ``--lenpen``, ``--lenpen-form`` and ``--stopping``: the settings of
    ``beam.beam_search`` (its module docstring says what each does)."""
    group.add_argument("--beam", type=positive_int, default=4, help="beam size (default 4)")
    group.add_argument("--lenpen", type=number(0), default=0.6,
                       help="length penalty alpha: a finished translation Y scores "
                            "log P(Y) / lp(|Y|) (default 0.6)")
    group.add_argument("--lenpen-form", choices=beam.LENGTH_PENALTIES, default="gnmt",
                       help="lp: gnmt, ((5 + |Y|) / 6)^alpha, the paper's; power, |Y|^alpha, "
                            "as CTranslate2, fairseq and Marian (|Y| counts the EOS; default "
                            "gnmt)")
    group.add_argument("--stopping", choices=beam.STOPPING_RULES, default="auto",
                       help="when a sentence is done: exact, once no live hypothesis can beat "
                            "the best finished one (the N best with --nbest) within the length "
                            "limit; first-k, once --beam hypotheses have finished; auto, exact "
                            "with --lenpen 0 and first-k otherwise, as chosen on validation "
                            "(default auto)")
