"""Average the parameters of checkpoints into one (:mod:`minitfm.averaging`):
``python -m minitfm.average``. A refused input exits with status 2.

Command line::

    python -m minitfm.average --inputs runs/base/ --last 5 --output runs/base/averaged.npz

    python -m minitfm.average --inputs runs/base/ --best 5 --output runs/base/best5.npz

``--inputs`` takes directories (their ``checkpoint_*.npz`` files, in step order) and files (in
the order given); the last ``--last`` of them are averaged. ``--best N`` averages instead the N
best by the validation metric each checkpoint records (a run with ``--best-metric`` records it
in the checkpoints saved at its validations; a directory's ``checkpoint_best.npz`` counts too):
a directory's checkpoints without one are passed over, a file named without one is refused
(exit status 2). The output is a checkpoint with the config and vocabulary of the inputs, the
step of the last (newest) one, and no optimizer state.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from minitfm import checkpoint, files
from minitfm.averaging import best_checkpoints, collect_inputs, save_average
from minitfm.checkpoint import CheckpointError
from minitfm.cli.argtypes import Parser, positive_int
from minitfm.cli.exits import UsageError
from minitfm.cli.reporting import report_errors
from minitfm.training import validation
from minitfm.training.rundir import WriteFailed

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="python -m minitfm.average",
        description="Average the parameters of the last checkpoints of a run into one checkpoint.")
    parser.add_argument("--inputs", nargs="+", required=True, metavar="DIR_OR_FILE",
                        help="directories (their checkpoint_*.npz, in step order) and/or files")
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--last", type=positive_int,
                        help="average the last N inputs (default 5, as for the paper's base model)")
    chosen.add_argument("--best", type=positive_int, metavar="N",
                        help="average the N best inputs by the validation metric their run "
                             "recorded (--best-metric); checkpoints without one are passed over "
                             "in directories and refused when named")
    parser.add_argument("--output", required=True, help="the averaged checkpoint to write")
    args = parser.parse_args(argv)
    if checkpoint.ROTATED_NAME.fullmatch(os.path.basename(args.output)):
        parser.error(f"--output {args.output}: checkpoint_*.npz names are rotated and resumed "
                     f"from by training; choose another name, e.g. averaged.npz")
    return report_errors(lambda: run(args))


def run(args: argparse.Namespace) -> int:
    """Average as ``args`` say; a signal on the way leaves no output (nor a part of one)."""
    wanted = args.best or args.last or 5
    if args.best:           # a checkpoint without a recorded metric: CheckpointError, status 2
        best = best_checkpoints(args.inputs, args.best)
        metric = validation.recorded_metric(best[0])[0]
        print(f"the {len(best)} best by {metric}: " + ", ".join(
            f"{os.path.basename(c.path)} ({validation.recorded_metric(c)[1]:.4g})"
            for c in best))
        paths = [c.path for c in sorted(best, key=lambda c: c.step)]
    else:
        paths = collect_inputs(args.inputs)[-wanted:]
    try:
        save_average(paths, args.output)
    except (FileNotFoundError, CheckpointError, files.ReadError):
        raise                       # an input that cannot be used, or whose read failed
    except OSError as exc:          # disk full, file too large, read-only, a directory
        trouble = files.link_trouble(args.output)
        if trouble is not None:     # the output, or a folder on its way, a link to nowhere
            raise UsageError(f"--output {args.output} is {trouble}: mend the link, or give "
                             f"another path for the averaged checkpoint") from exc
        raise WriteFailed(f"cannot write the averaged checkpoint {args.output}: "
                          f"{exc.strerror or exc}; the input checkpoints, and any earlier "
                          f"{args.output}, are unchanged") from exc
    if len(paths) < wanted:
        print(f"note: only {len(paths)} checkpoint(s) found, fewer than "
              f"--{'best' if args.best else 'last'} {wanted}", file=sys.stderr)
    names = [os.path.basename(p) for p in paths]
    print(f"averaged {len(paths)} checkpoint(s) ({', '.join(names)}) into {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
