"""Checkpoint averaging: the parameters of the last k checkpoints of a run, averaged.

Section 6.1 of the paper: "For the base models, we used a single model obtained by averaging the
last 5 checkpoints, which were written at 10-minute intervals. For the big models, we averaged
the last 20 checkpoints."

Averaging is host-side work on checkpoint files, so it uses numpy directly. Sums accumulate in
float64 and the mean is cast back to each parameter's stored dtype. Only checkpoints of one model
can be averaged: the same config, vocabulary and parameter names, shapes and dtypes.

Command line::

    python -m minitfm.average --inputs runs/base/ --last 5 --output runs/base/averaged.npz

``--inputs`` takes directories (their ``checkpoint_*.npz`` files, in step order) and files (in
the order given); the last ``--last`` of them are averaged. The output is a checkpoint with the
config and vocabulary of the inputs, the step of the last one, and no optimizer state.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import numpy

from minitfm import checkpoint
from minitfm.checkpoint import Checkpoint, CheckpointError
from minitfm.cli import positive_int, report_errors
from minitfm.rundir import WriteFailed

__all__ = ["average", "average_checkpoints", "save_average", "main"]


def _check_same_model(reference: Checkpoint, other: Checkpoint) -> None:
    """Raise a CheckpointError saying how ``other`` differs from ``reference``, if it does."""
    problems = [f"config field {key!r}: {saved} vs {current}" for key, saved, current
                in checkpoint.config_differences(reference.config, other.config)]
    if reference.kind != other.kind:
        problems.append(f"model kind: {reference.kind!r} vs {other.kind!r}")
    if (reference.vocab_id, reference.vocab_model) != (other.vocab_id, other.vocab_model):
        problems.append(f"vocabulary: {reference.vocab_id!r} vs {other.vocab_id!r}"
                        + (" (same id, different model bytes)"
                           if reference.vocab_id == other.vocab_id else ""))
    if list(reference.params) != list(other.params):
        missing = sorted(reference.params.keys() - other.params.keys())
        extra = sorted(other.params.keys() - reference.params.keys())
        problems.append(f"parameter names: {missing} only in the first, {extra} only in the other"
                        if missing or extra else "parameter order differs")
    problems += [f"parameter {name!r}: {array.shape} {array.dtype} vs "
                 f"{other.params[name].shape} {other.params[name].dtype}"
                 for name, array in reference.params.items()
                 if name in other.params and (array.shape, array.dtype)
                 != (other.params[name].shape, other.params[name].dtype)]
    if problems:
        raise CheckpointError(
            f"cannot average {other.path} with {reference.path}, they are different models:\n  "
            + "\n  ".join(problems) + "\nAverage only checkpoints of one training run")


def average_checkpoints(paths: Sequence[str | os.PathLike]) -> tuple[dict[str, numpy.ndarray],
                                                                     Checkpoint]:
    """The averaged parameters of ``paths`` and the last checkpoint read (for its metadata)."""
    if not paths:
        raise ValueError("no checkpoints to average: give at least one path")
    first = last = checkpoint.load(paths[0], with_optimizer=False)
    not_float = [name for name, a in first.params.items()
                 if not numpy.issubdtype(a.dtype, numpy.floating)]
    if not_float:
        raise CheckpointError(f"{first.path}: parameters {not_float} are not floating point "
                              f"and cannot be averaged")
    sums = {name: a.astype(numpy.float64) for name, a in first.params.items()}
    for path in paths[1:]:
        last = checkpoint.load(path, with_optimizer=False)    # one checkpoint in memory at a time
        _check_same_model(first, last)
        for name, total in sums.items():
            total += last.params[name]
    params = {name: (total / len(paths)).astype(first.params[name].dtype)
              for name, total in sums.items()}
    return params, last


def average(paths: Sequence[str | os.PathLike]) -> dict[str, numpy.ndarray]:
    """The element-wise mean of the parameters of the checkpoints at ``paths`` (host arrays)."""
    return average_checkpoints(paths)[0]


def save_average(paths: Sequence[str | os.PathLike], output: str | os.PathLike
                 ) -> tuple[dict[str, numpy.ndarray], Checkpoint]:
    """Average ``paths`` and save the result to ``output``: the config and vocabulary of the
    inputs, the step of the last one, no optimizer state, and ``extra["averaged_from"]`` naming
    the inputs. Returns the averaged parameters (host arrays) and the last input read."""
    params, last = average_checkpoints(paths)
    checkpoint.save(output, params, step=last.step, config=last.config, vocab_id=last.vocab_id,
                    vocab_model=last.vocab_model, kind=last.kind,
                    extra={**last.extra, "averaged_from": [os.path.basename(p) for p in paths]})
    return params, last


def _collect_inputs(inputs: Sequence[str]) -> list[str]:
    """Directories expand to their checkpoints in step order; files are kept in the order given."""
    paths: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            found = [path for _, path in checkpoint.list_checkpoints(item)]
            if not found:
                raise FileNotFoundError(f"directory {item} holds no checkpoint_*.npz files")
            paths += found
        elif os.path.isfile(item):
            paths.append(item)
        else:
            raise FileNotFoundError(f"input {item} is neither a checkpoint file nor a directory")
    return list(dict.fromkeys(paths))          # drop repeats, keep order


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m minitfm.average",
        description="Average the parameters of the last checkpoints of a run into one checkpoint.")
    parser.add_argument("--inputs", nargs="+", required=True, metavar="DIR_OR_FILE",
                        help="directories (their checkpoint_*.npz, in step order) and/or files")
    parser.add_argument("--last", type=positive_int, default=5,
                        help="average the last N inputs (default 5, as for the paper's base model)")
    parser.add_argument("--output", required=True, help="the averaged checkpoint to write")
    args = parser.parse_args(argv)
    if checkpoint.ROTATED_NAME.fullmatch(os.path.basename(args.output)):
        parser.error(f"--output {args.output}: checkpoint_*.npz names are rotated and resumed "
                     f"from by training; choose another name, e.g. averaged.npz")
    return report_errors(lambda: run(args))


def run(args: argparse.Namespace) -> int:
    """Average as ``args`` say; a signal on the way leaves no output (nor a part of one)."""
    paths = _collect_inputs(args.inputs)[-args.last:]
    try:
        save_average(paths, args.output)
    except (FileNotFoundError, CheckpointError):
        raise
    except OSError as exc:          # disk full, file too large, read-only, a directory
        raise WriteFailed(f"cannot write the averaged checkpoint {args.output}: "
                          f"{exc.strerror or exc}; the input checkpoints, and any earlier "
                          f"{args.output}, are unchanged") from exc
    if len(paths) < args.last:
        print(f"note: only {len(paths)} checkpoint(s) found, fewer than --last {args.last}",
              file=sys.stderr)
    names = [os.path.basename(p) for p in paths]
    print(f"averaged {len(paths)} checkpoint(s) ({', '.join(names)}) into {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
