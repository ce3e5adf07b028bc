"""What every export reads and writes: a checked model from a checkpoint, and whole outputs.

Reading. A checkpoint records the kind of model it holds, which names its model in the registry
(:mod:`minitfm.models`: config class, parameter names and shapes). Every model read goes through
the check every command uses, :mod:`minitfm.usable` (:func:`check_loadable`), before anything is
written: the kind is known, the config parses, every parameter the config needs is there (and
nothing else) with its shape, in float32 or float64, and every value is finite. A model that
fails it raises ``usable.UnusableCheckpoint`` (a ``checkpoint.CheckpointError``).

Writing. An export is never left half-written: a directory is built under a temporary name
beside its destination and renamed into place when complete (:func:`output_directory`); a single
file is written to a temporary file, flushed, then renamed (:func:`output_file`); both through
:mod:`minitfm.files`, so a full disk names the folder and the space free there. A failure on the
way removes the temporary and leaves an existing destination as it was; the temporaries of an
export that was killed are removed by the next export to the same destination.

Host-side code: weights are read and written as NumPy arrays on purpose.
"""

from __future__ import annotations

import contextlib
import os
import sys
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
    ``force`` when ``path`` exists); on any error it is removed and ``path`` is untouched
    (``files.replacing_directory``). Temporaries that earlier exports to ``path`` left when
    killed are removed first (``files.remove_stale_temporaries``)."""
    _refuse_existing(path, force)
    _remove_stale(path)
    with files.replacing_directory(path) as tmp:
        yield tmp


@contextlib.contextmanager
def output_file(path: str, force: bool = False) -> Iterator[str]:
    """Yield a temporary file name to write; on success it is fsync'ed and renamed to ``path``;
    on any error it is removed and ``path`` is untouched. Stale temporaries go first, as for
    :func:`output_directory`."""
    _refuse_existing(path, force)
    if os.path.isdir(path):
        raise ExportError(f"{path} is a directory: name the output file")
    _remove_stale(path)
    with files.replacing(path) as tmp:
        yield tmp


def _remove_stale(path: str) -> None:
    folder, name = os.path.split(os.path.abspath(path))
    removed = files.remove_stale_temporaries(folder, name)
    if removed:
        print(f"removed {removed} temporar{'y' if removed == 1 else 'ies'} that killed exports "
              f"to {path} left in {folder}", file=sys.stderr, flush=True)
