"""Checkpoint averaging: the parameters of the last k checkpoints of a run, averaged.

Section 6.1 of the paper: "For the base models, we used a single model obtained by averaging the
last 5 checkpoints, which were written at 10-minute intervals. For the big models, we averaged
the last 20 checkpoints."

Averaging is host-side work on checkpoint files, so it uses numpy directly. Sums accumulate in
float64 and the mean is cast back to each parameter's stored dtype. Only checkpoints of one model
can be averaged: the same config, vocabulary and parameter names, shapes and dtypes; and each
input must pass the check of :mod:`minitfm.usable` (float32 or float64, every value finite), so
the average never holds NaN or Inf.

The command that writes an average, ``python -m minitfm.average``, is :mod:`minitfm.cli.average`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy

from minitfm import checkpoint, files, usable
from minitfm.checkpoint import Checkpoint, CheckpointError
from minitfm.training import stops, validation
from minitfm.training.rundir import BEST_NAME

__all__ = ["average", "average_checkpoints", "save_average", "best_checkpoints", "collect_inputs"]


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
    # both passed the check: the same kind and config give the same names and shapes
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
    # every input passes the check (minitfm.usable: sound, finite parameters) before it is added
    first = last = usable.load(paths[0], with_optimizer=False).ckpt
    sums = {name: a.astype(numpy.float64) for name, a in first.params.items()}
    for path in paths[1:]:
        stops.raise_if_lost()
        last = usable.load(path, with_optimizer=False).ckpt    # one checkpoint in memory at a time
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
    extra = {key: value for key, value in last.extra.items()
             if key not in ("valid", "validation")}      # an average was never validated
    checkpoint.save(output, params, step=last.step, config=last.config, vocab_id=last.vocab_id,
                    vocab_model=last.vocab_model, kind=last.kind,
                    extra={**extra, "averaged_from": [os.path.basename(p) for p in paths]})
    return params, last


def best_checkpoints(inputs: Sequence[str], n: int) -> list[Checkpoint]:
    """The ``n`` best checkpoints of ``inputs`` by the validation metric each records, best
    first, as metadata (their ``params`` left out: :func:`average_checkpoints` reads them).
    Directories give their ``checkpoint_*.npz`` and ``checkpoint_best.npz`` (one checkpoint
    counted once), and those without a metric (saved between validations) are passed over; a
    file named without one is refused, as is finding none (:class:`validation.NoRecordedMetric`).
    """
    candidates: list[tuple[str, bool]] = []            # (path, named by the user)
    for item in inputs:
        if os.path.isdir(item):
            candidates += [(path, False) for _, path in checkpoint.list_checkpoints(item)]
            if os.path.isfile(os.path.join(item, BEST_NAME)):
                candidates.append((os.path.join(item, BEST_NAME), False))
        elif os.path.isfile(item):
            candidates.append((item, True))
        else:
            raise _no_input(item)
    found, seen = [], set()
    for path, named in candidates:
        ckpt = checkpoint.load(path, with_optimizer=False)
        ckpt = dataclasses.replace(ckpt, params={})    # only its metadata is needed here
        if validation.recorded_metric(ckpt) is None and not named:
            continue
        place = (os.path.dirname(os.path.abspath(path)), ckpt.step)
        if place not in seen:
            seen.add(place)
            found.append(ckpt)
    if not found:
        raise validation.NoRecordedMetric(
            f"no checkpoint of {', '.join(inputs)} records a validation metric: train with "
            f"--best-metric (every validation then saves a checkpoint that records it), or "
            f"average with --last N")
    return validation.ranked(found)[:n]


def _no_input(item: str) -> Exception:
    """The error for an input that is neither a file nor a directory: a symbolic link that leads
    nowhere (a loop, a missing target) said as what it is, else nothing there."""
    trouble = files.link_trouble(item)
    if trouble is not None:
        return CheckpointError(f"input {item} is {trouble}: point it at a checkpoint file or a "
                               f"run directory, or give that itself")
    return FileNotFoundError(f"input {item} is neither a checkpoint file nor a directory")


def collect_inputs(inputs: Sequence[str]) -> list[str]:
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
            raise _no_input(item)
    return list(dict.fromkeys(paths))          # drop repeats, keep order
