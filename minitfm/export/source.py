"""What every export reads and writes: a checked model from a checkpoint, and whole outputs.

Reading. A checkpoint records the kind of model it holds, which names its model in the registry
(:mod:`minitfm.models`: config class, parameter names and shapes). Every model read goes through
the check every command uses, :mod:`minitfm.usable` (:func:`check_loadable`), before anything is
written: the kind is known, the config parses, every parameter the config needs is there (and
nothing else) with its shape, in float32 or float64, and every value is finite. A model that
fails it raises ``usable.UnusableCheckpoint`` (a ``checkpoint.CheckpointError``).

Writing. An export is never left half-written: a directory is built under a temporary name
beside its destination and renamed into place when complete (:func:`output_directory`); a single
file is written to a temporary file, flushed, then renamed (:func:`output_file`). A failure on
the way removes the temporary and leaves an existing destination as it was.

Host-side code: weights are read and written as NumPy arrays on purpose.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass

import numpy

from minitfm import checkpoint, files, usable
# The formats' own layouts are written for the two built-in models (ctranslate2.py)
from minitfm.models import lm, translator as model   # noqa: F401  (imported by the mappings)

class ExportError(RuntimeError):
    """The model cannot be exported (or imported) as asked; the message says why and what to do."""


@dataclass
class Loaded:
    """A checked model: its kind, config object and host parameters, and the checkpoint's
    vocabulary (identifier and serialized tokenizer), step and extra values."""

    kind: str
    config: object                      # model.Config or lm.LMConfig
    params: dict[str, numpy.ndarray]    # in the order of the config's parameter_shapes
    vocab_id: str | None
    vocab_model: bytes | None
    step: int
    extra: dict


def check_loadable(ckpt: checkpoint.Checkpoint) -> Loaded:
    """The checked model of ``ckpt`` (kind, config, names, shapes, dtypes, finite values; see
    :mod:`minitfm.usable`), or ``usable.UnusableCheckpoint`` naming the first problem."""
    return _loaded(usable.check(ckpt))


def read_checkpoint(path: str) -> Loaded:
    """The checked model of a checkpoint file (without its optimizer state)."""
    try:
        return _loaded(usable.load(path, with_optimizer=False))
    except FileNotFoundError:
        raise ExportError(f"checkpoint {path} does not exist") from None


def _loaded(checked: usable.Usable) -> Loaded:
    ckpt = checked.ckpt
    shapes = checked.model.parameter_shapes(checked.config)
    params = {name: numpy.asarray(ckpt.params[name]) for name in shapes}
    return Loaded(ckpt.kind, checked.config, params, ckpt.vocab_id, ckpt.vocab_model, ckpt.step,
                  ckpt.extra)


def _refuse_existing(path: str, force: bool) -> None:
    if os.path.lexists(path) and not force:
        raise ExportError(f"{path} exists already: choose another output or pass --force to "
                          f"replace it")


@contextlib.contextmanager
def output_directory(path: str, force: bool = False) -> Iterator[str]:
    """Yield a new empty directory to fill; on success it replaces ``path`` (only with
    ``force`` when ``path`` exists); on any error it is removed and ``path`` is untouched."""
    _refuse_existing(path, force)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = files.temporary_beside(path)
    os.mkdir(tmp)
    try:
        yield tmp
        if os.path.lexists(path):                 # --force: move the old one aside first
            old = files.temporary_beside(path)
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old) if os.path.isdir(old) else os.remove(old)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def output_file(path: str, force: bool = False) -> Iterator[str]:
    """Yield a temporary file name to write; on success it is fsync'ed and renamed to ``path``;
    on any error it is removed and ``path`` is untouched."""
    _refuse_existing(path, force)
    if os.path.isdir(path):
        raise ExportError(f"{path} is a directory: name the output file")
    with files.replacing(path) as tmp:
        yield tmp
