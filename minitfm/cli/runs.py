"""What the training commands share about a run: its directory (``--out``), held for the run's
whole length so that a second run on it is refused at once (:func:`run_directory`,
:class:`minitfm.training.rundir.RunDirectory`); the model config from the options; and the line
that says how to continue a run a signal stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import signal
import sys
import time

from minitfm.workers import distributed
from minitfm.cli import limits
from minitfm.cli.exits import UsageError
from minitfm.models.translator import Config
from minitfm.cli.options import Words
from minitfm.training.rundir import RunDirectory
from minitfm.training.state import TrainState, config_field
from minitfm.training.stops import describe_signal

__all__ = ["run_defaults", "default_run_dir", "run_directory", "model_config", "stopped"]


# ---- the run directory -----------------------------------------------------------------------

def run_defaults(kind: str) -> dict:
    """The default words of ``--out`` for a command whose runs are ``runs/KIND-<time>``."""
    return {"out": Words(f"runs/{kind}-<time>; with --resume, the newest runs/{kind}-*")}


def default_run_dir(kind: str, resume: bool) -> str:
    """A new ``runs/KIND-<time>``, or with ``resume`` the newest existing ``runs/KIND-*``."""
    if resume:
        existing = sorted(glob.glob(os.path.join("runs", f"{kind}-*")))
        if not existing:
            raise UsageError(f"--resume: no run directory runs/{kind}-* to resume; pass --out DIR")
        return existing[-1]
    return os.path.join("runs", f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}")


@contextlib.contextmanager
def run_directory(args: argparse.Namespace, kind: str):
    """Hold the run directory ``args.out`` (default :func:`default_run_dir`) for the block, from
    before anything in it is read or written to the end: one run per directory. Rank 0 takes it
    (and decides ``args.out``); the other workers go on once it has."""
    world = distributed.world()
    held = None
    if world.is_root:
        args.out = args.out or default_run_dir(kind, args.resume)
        held = RunDirectory.open(args.out, lock=not args.no_lock)
        if held.stale_removed:
            print(f"removed {held.stale_removed} temporary file(s) that a killed run left in "
                  f"{args.out}", file=sys.stderr, flush=True)
    try:
        args.out = world.broadcast_text(args.out or "")
        yield
    finally:
        if held is not None:
            held.close()


def model_config(preset: str, vocab_size: int, args: argparse.Namespace) -> Config:
    """The preset's config for a joint vocabulary of ``vocab_size``, with the model options given
    on the command line (``--layers``, ``--d-model``, ``--d-ff``, ``--heads``, ``--max-len``,
    ``--dropout``, ``--attention-dropout``, ``--relu-dropout``, ``--word-dropout``,
    ``--label-smoothing``, ``--pre-ln``; absent or None: the preset's value). A ``--max-len``
    whose position table cannot be held in memory is refused (:func:`limits.check_positions`):
    no sentence that long could be read, nor the model exported."""
    options = ("layers", "d_model", "d_ff", "heads", "max_len", "dropout", "attention_dropout",
               "relu_dropout", "word_dropout", "label_smoothing", "pre_ln")
    overrides = {config_field(option): getattr(args, option) for option in options
                 if getattr(args, option, None) is not None}
    try:
        cfg = Config.preset(preset, src_vocab=vocab_size, tgt_vocab=vocab_size, **overrides)
    except ValueError as exc:
        raise UsageError(f"model options: {exc}") from exc
    if "max_len" in overrides:
        limits.check_positions(cfg, f"--max-len {cfg.max_len}: the model's position table "
                                    f"({cfg.max_len} positions x --d-model {cfg.d_model}: the "
                                    f"rows a sentence that long reads, and the whole table an "
                                    f"export writes)", "--max-len")
    return cfg


def stopped(state: TrainState, out: str) -> int:
    """Say how to continue a run stopped by a signal; return its exit status, 128 + signal."""
    signum = state.stop_signal or signal.SIGINT
    how = describe_signal(signum)
    saved = (f"checkpoint {state.last_checkpoint} saved" if state.last_checkpoint
             else "no checkpoint saved")
    if distributed.world().is_root:
        print(f"{how} at step {state.step}; {saved}; continue with the same options and "
              f"--out {out} --resume", flush=True)
    return 128 + signum

