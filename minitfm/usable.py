"""The one check a checkpoint passes before any command uses its model.

Resuming (all three trainers), translating, sampling, averaging and exporting read checkpoints;
each reads them through :func:`load`, which refuses a file unless:

- it holds a model of a kind this minitfm knows, and the kind the command needs;
- its config is one that model accepts;
- every parameter the config needs is there, and nothing else, each with its shape;
- every parameter is float32 or float64, all of them the same one;
- every value is finite;
- where the optimizer state is read (resuming), Adam's two moments pass the same checks.

Arrays a file holds beyond its model and the checkpoint's layout (written by another program)
do not fail the check, but are named in one warning line on stderr: they are never read, so
nothing written from the checkpoint holds them, and that is said rather than done in silence.

float16 is refused even where every value is finite: minitfm trains and decodes only in float32
or float64 (``backend.set_float_dtype``), and a float16 file was not written by it (its values
may well have overflowed to Inf on the way).

The error, :class:`UnusableCheckpoint` (a ``checkpoint.CheckpointError``, so every command
reports it as bad input), names the file, the first array that fails (or the kind or config), and
the newest ``checkpoint_*.npz`` of the same directory that passes the same check, or says that
none does: the one to resume, translate or sample from instead. A damaged file (truncated, not a
checkpoint) is refused the same way.

Host-side code: it checks the NumPy arrays :func:`checkpoint.load` returns, before any of them
is copied to a device.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy

from minitfm import checkpoint, files, models
from minitfm.checkpoint import Checkpoint, CheckpointError

__all__ = ["FLOAT_DTYPES", "UnusableCheckpoint", "Usable", "problem", "check", "load",
           "newest_usable"]

FLOAT_DTYPES = (numpy.dtype(numpy.float32), numpy.dtype(numpy.float64))


class UnusableCheckpoint(CheckpointError):
    """A checkpoint that fails the check: ``path``, the first offending ``array`` (None when the
    kind, the config or the file itself is the problem) and ``last_good``, the newest checkpoint
    of its directory that passes (None if none does)."""

    def __init__(self, message: str, path: str, array: str | None,
                 last_good: str | None) -> None:
        super().__init__(message)
        self.path, self.array, self.last_good = path, array, last_good


@dataclass
class Usable:
    """A checkpoint that passed the check, with its parsed config."""

    ckpt: Checkpoint
    config: object          # the model's Config (translator.Config, lm.LMConfig)

    @property
    def model(self) -> models.Model:
        return models.get(self.ckpt.kind)


def _array_problem(value: numpy.ndarray, shape: tuple, dtype) -> str | None:
    """What is wrong with one array, in words, or None."""
    if tuple(value.shape) != tuple(shape):
        return f"has shape {tuple(value.shape)}, its config needs {tuple(shape)}"
    if value.dtype not in FLOAT_DTYPES:
        return (f"is {value.dtype}; parameters are float32 or float64, the dtypes minitfm trains "
                f"in")
    if dtype is not None and value.dtype != dtype:
        return f"is {value.dtype} but the parameters before it are {dtype}: one dtype for all"
    if not numpy.isfinite(value).all():
        return "holds NaN or Inf"
    return None


def problem(ckpt: Checkpoint, kind: str | None = None) -> tuple[str | None, str] | None:
    """``(array, what is wrong)`` for the first problem of ``ckpt`` (array None for the kind or
    the config), or None when it passes. ``kind``: the kind the caller needs (None: any known)."""
    if ckpt.kind not in models.kinds():
        return None, (f"it holds {models.describe(ckpt.kind)}; this minitfm knows "
                      f"{', '.join(map(repr, models.kinds()))}: use the version that wrote it")
    if kind is not None and ckpt.kind != kind:
        return None, (f"it holds {models.describe(ckpt.kind)}, but this needs "
                      f"{models.describe(kind)}")
    trained = models.get(ckpt.kind)
    try:
        cfg = trained.Config.from_dict(ckpt.config)
    except (TypeError, ValueError, KeyError) as exc:
        return None, f"its config is not a valid config of {models.describe(ckpt.kind)}: {exc}"
    shapes = trained.parameter_shapes(cfg)
    missing = [name for name in shapes if name not in ckpt.params]
    unexpected = [name for name in ckpt.params if name not in shapes]
    if missing:
        instead = f" (it has {unexpected[0]!r} instead, which this model does not)" \
            if unexpected else ""
        return f"parameter {missing[0]!r}", f"is missing{instead}"
    if unexpected:
        return f"parameter {unexpected[0]!r}", "is not a parameter of this model"
    dtype = None
    for name, shape in shapes.items():
        found = _array_problem(ckpt.params[name], shape, dtype)
        if found:
            return f"parameter {name!r}", found
        dtype = ckpt.params[name].dtype
    if ckpt.optimizer_state is not None:
        for moment, what in (("m", "first"), ("v", "second")):
            arrays = ckpt.optimizer_state[moment]
            for name, shape in shapes.items():
                label = f"Adam's {what} moment of {name!r}"
                if name not in arrays:
                    return label, "is missing"
                found = _array_problem(arrays[name], shape, dtype)
                if found:
                    return label, found
    return None


def _config(ckpt: Checkpoint):
    return models.get(ckpt.kind).Config.from_dict(ckpt.config)


def newest_usable(directory: str, kind: str | None = None, *, with_optimizer: bool = False,
                  skip: str | None = None) -> str | None:
    """The newest ``checkpoint_*.npz`` of ``directory`` that passes the check (but ``skip``), or
    None. ``with_optimizer``: its optimizer state must be there and pass too (to resume)."""
    skipped = os.path.realpath(skip) if skip else None
    for _, path in reversed(checkpoint.list_checkpoints(directory)):
        if os.path.realpath(path) == skipped:
            continue
        try:
            ckpt = checkpoint.load(path, with_optimizer=with_optimizer)
        except (CheckpointError, OSError):
            continue
        if with_optimizer and ckpt.optimizer_state is None:
            continue
        if problem(ckpt, kind) is None:
            return path
    return None


def _refuse(path: str, array: str | None, what: str, kind: str | None,
            with_optimizer: bool, advise: bool = True) -> UnusableCheckpoint:
    directory = os.path.dirname(os.path.abspath(path))
    good = newest_usable(directory, kind, with_optimizer=with_optimizer, skip=path)
    if good:
        advice = f"the newest checkpoint of {directory} that passes the check is {good}"
        if advise:
            advice += (": use that one (to resume from it, move the newer ones aside, e.g. "
                       "rename them to .npz.bad: --resume takes the newest checkpoint_*.npz)")
    else:
        advice = (f"no checkpoint of {directory} passes the check: use a checkpoint of another "
                  f"run, or train again")
    return UnusableCheckpoint(f"{what}. {advice[0].upper()}{advice[1:]}", path, array, good)


def check(ckpt: Checkpoint, kind: str | None = None) -> Usable:
    """``ckpt`` with its parsed config, if it passes the check; else :class:`UnusableCheckpoint`.

    The optimizer moments are checked when ``ckpt`` holds them."""
    found = problem(ckpt, kind)
    if found is not None:
        array, what = found
        text = f"checkpoint {ckpt.path} cannot be used: " \
            + (f"{array} {what}" if array else what)
        raise _refuse(ckpt.path, array, text, kind, ckpt.optimizer_state is not None)
    return Usable(ckpt, _config(ckpt))


def load(path: str | os.PathLike, kind: str | None = None, *,
         with_optimizer: bool = True) -> Usable:
    """Read the checkpoint at ``path`` (:func:`checkpoint.load`) and check it (:func:`check`).

    A damaged file is refused as :class:`UnusableCheckpoint` too, naming the newest good one;
    a path that is no file (a directory, a pipe, a symbolic link that leads nowhere) as the
    ``CheckpointError`` that says what it is; ``FileNotFoundError`` if there is nothing at all."""
    path = os.fspath(path)
    try:
        ckpt = checkpoint.load(path, with_optimizer=with_optimizer)
    except UnusableCheckpoint:
        raise
    except CheckpointError as exc:
        if files.kind_of(path) is not None or files.link_trouble(path) is not None:
            raise                       # a directory, a pipe, a link to nowhere: said as it is
        # its message says already how to move it aside
        raise _refuse(path, None, str(exc).rstrip("."), kind, with_optimizer,
                      advise=False) from exc
    checked = check(ckpt, kind)
    if ckpt.unknown:
        _warn_unknown(ckpt)
    return checked


def _warn_unknown(ckpt: Checkpoint) -> None:
    """One warning line naming the arrays of ``ckpt`` that no part of a minitfm checkpoint is:
    they are never read, so nothing written from the checkpoint (a resumed run's checkpoints, an
    average, an export) holds them; the file itself is left as it is."""
    shown = ", ".join(map(repr, ckpt.unknown[:5])) + (
        f" and {len(ckpt.unknown) - 5} more" if len(ckpt.unknown) > 5 else "")
    print(f"warning: checkpoint {ckpt.path} holds {len(ckpt.unknown)} "
          f"array{'s' if len(ckpt.unknown) > 1 else ''} that no parameter of its model and no "
          f"part of a minitfm checkpoint is ({shown}): not read, so nothing this command writes "
          f"holds {'them' if len(ckpt.unknown) > 1 else 'it'}. The file is not changed; keep a "
          f"copy of it if they matter (a training run removes its older checkpoints in time)",
          file=sys.stderr, flush=True)
