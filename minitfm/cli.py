"""What the command lines share: the run directory, the model config from options, and the way
``main()`` reports errors.

``train_toy.py`` and ``train_wmt.py`` are thin front ends over the library; the glue they have in
common lives here once, so that both behave alike: a user error prints one ``error:`` line and
exits with the script's error status, Ctrl-C outside training prints ``interrupted`` and exits
with 130, the shell's code for it.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from collections.abc import Callable

from minitfm import backend, checkpoint, train
from minitfm.data import DataError
from minitfm.model import Config

__all__ = ["EXIT_INTERRUPTED", "UsageError", "USER_ERRORS", "default_run_dir", "model_config",
           "report_errors"]

EXIT_INTERRUPTED = 130   # the shell's code for a process stopped by Ctrl-C


class UsageError(Exception):
    """Options that do not fit together; the message says what to change."""


# what a user can cause: reported as one line, without a traceback
USER_ERRORS = (UsageError, DataError, checkpoint.CheckpointError, backend.BackendError,
               train.TrainingDiverged, FileExistsError, FileNotFoundError)


def default_run_dir(kind: str, resume: bool) -> str:
    """A new ``runs/KIND-<time>``, or with ``resume`` the newest existing ``runs/KIND-*``."""
    if resume:
        existing = sorted(glob.glob(os.path.join("runs", f"{kind}-*")))
        if not existing:
            raise UsageError(f"--resume: no run directory runs/{kind}-* to resume; pass --out DIR")
        return existing[-1]
    return os.path.join("runs", f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}")


def model_config(preset: str, vocab_size: int, args: argparse.Namespace) -> Config:
    """The preset's config for a joint vocabulary of ``vocab_size``, with the model options given
    on the command line (``--layers``, ``--d-model``, ``--d-ff``, ``--heads``, ``--dropout``,
    ``--label-smoothing``; absent or None: the preset's value)."""
    options = {"n_layers": "layers", "d_model": "d_model", "d_ff": "d_ff", "n_heads": "heads",
               "dropout": "dropout", "label_smoothing": "label_smoothing"}
    overrides = {field: getattr(args, option) for field, option in options.items()
                 if getattr(args, option, None) is not None}
    try:
        return Config.preset(preset, src_vocab=vocab_size, tgt_vocab=vocab_size, **overrides)
    except ValueError as exc:
        raise UsageError(f"model options: {exc}") from exc


def report_errors(run: Callable[[], int], exit_error: int) -> int:
    """``run()``'s exit status; a user error prints ``error: ...`` and gives ``exit_error``."""
    try:
        return run()
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_error
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
