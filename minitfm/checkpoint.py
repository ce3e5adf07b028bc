"""Checkpoints: one ``.npz`` file holding parameters, optimizer state and metadata.

This is host-side file I/O, so it imports numpy directly; arrays are copied to the host with
``backend.to_host`` before writing, and :func:`load` returns NumPy arrays. Moving them to the
active backend is the caller's choice: :func:`params_to_device` for the parameters,
``Adam.load_state_dict`` for the optimizer state.

File layout (a plain, uncompressed ``numpy.savez`` archive, read with ``allow_pickle=False``)::

    meta               uint8  UTF-8 JSON: {"format": "minitfm-checkpoint", "version": 1,
                              "kind", "step", "config", "vocab_id", "extra", "param_names",
                              "optimizer_step" (null without optimizer state)}
    param/<name>       one array per parameter, in its own dtype and shape
    adam_m/<name>      Adam's first moment   (only with optimizer state)
    adam_v/<name>      Adam's second moment  (only with optimizer state)
    vocab_model        uint8  the serialized tokenizer model (only when given)

``kind`` names the model a file holds, a kind of the model registry (:mod:`minitfm.models`):
the encoder-decoder Transformer ("transformer") or the decoder-only language model ("lm"). Files
written before kinds existed hold a Transformer (``FIRST_KIND``). A command that needs one kind
refuses the others through :mod:`minitfm.usable`, the one check of a loaded checkpoint.

Random state needs no arrays: dropout masks derive from ``(seed, step)``, so a run stores its seed
as an int in ``extra`` and ``step`` completes it.

Writes are atomic: the archive goes to a temporary file in the destination directory, is flushed
and fsync'ed, then renamed over the destination with ``os.replace``. A crash or a full disk during
a save leaves the previous checkpoint intact. A signal (Ctrl-C, SIGTERM, SIGHUP) is held back while
zipfile's own code runs, which a KeyboardInterrupt raised inside it can leave half-built (its
clean-up then fails with an error of its own), and stops the save at the archive's next write:
the temporary is removed, the destination untouched (a training run holds its saves to the end).
Rotation (:func:`keep_last`, :func:`latest`) works on files named ``checkpoint_{step:08d}.npz``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import zipfile
from dataclasses import dataclass, field

import numpy

from minitfm import backend, files, flat, models
from minitfm.training import stops

__all__ = [
    "NonFiniteError",
    "FORMAT_VERSION", "ROTATED_NAME", "FIRST_KIND", "CheckpointError", "Checkpoint", "save", "load",
    "params_to_device", "config_differences", "check_compatible",
    "checkpoint_path", "list_checkpoints", "latest", "keep_last",
]

FORMAT_NAME = "minitfm-checkpoint"
FORMAT_VERSION = 1
ROTATED_NAME = re.compile(r"checkpoint_(\d{8,})\.npz")   # what keep_last() rotates
FIRST_KIND = "transformer"    # the kind of the files written before kinds were recorded


class NonFiniteError(ValueError):
    """An array to be saved holds NaN or Inf (``what``: the first such array, in words)."""

    def __init__(self, message: str, what: str) -> None:
        super().__init__(message)
        self.what = what


class CheckpointError(RuntimeError):
    """A checkpoint file is damaged, of an unknown format, or does not fit the current run."""


@dataclass
class Checkpoint:
    """The contents of one checkpoint file; every array is a NumPy array on the host."""

    path: str
    params: dict[str, numpy.ndarray]
    step: int
    config: dict
    vocab_id: str | None = None
    vocab_model: bytes | None = None
    optimizer_state: dict | None = None   # {"step": int, "m": {name: array}, "v": {...}}
    extra: dict = field(default_factory=dict)
    kind: str = FIRST_KIND                # which model: a kind of the registry (models.get)
    unknown: tuple[str, ...] = ()         # arrays of the file that no part of the format is


def _json_bytes(meta: dict) -> numpy.ndarray:
    try:
        text = json.dumps(meta, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"checkpoint metadata must be plain JSON values (dicts, lists, str, int, float, bool, "
            f"None): pass config.to_dict(), and ints/strings in extra ({exc})") from exc
    return numpy.frombuffer(text.encode("utf-8"), dtype=numpy.uint8)


def _check_optimizer_state(optimizer_state: dict, params: dict) -> None:
    if not isinstance(optimizer_state, dict) or set(optimizer_state) != {"step", "m", "v"}:
        raise ValueError("optimizer_state must be Adam.state_dict(): a dict with keys step, m, v")
    for moment in ("m", "v"):
        if optimizer_state[moment].keys() != params.keys():
            raise ValueError(f"optimizer_state[{moment!r}] has other names than params: the "
                             f"optimizer was created for a different parameter dict")


def _arrays_to_write(params: dict, optimizer_state: dict | None, vocab_model: bytes | None,
                     meta: dict) -> dict[str, numpy.ndarray]:
    arrays = {"meta": _json_bytes(meta)}
    # one device-to-host copy per flat buffer (parameters, the two Adam moments), then checked
    arrays.update({f"param/{name}": a for name, a in flat.to_host(params).items()})
    if optimizer_state is not None:
        for moment in ("m", "v"):
            arrays.update({f"adam_{moment}/{name}": a
                           for name, a in flat.to_host(optimizer_state[moment]).items()})
    for key, a in arrays.items():
        if a.dtype.kind == "f" and not numpy.isfinite(a).all():
            kind, _, name = key.partition("/")
            what = (f"parameter {name!r}" if kind == "param"
                    else f"Adam's {kind[-1]} moment of {name!r}")
            raise NonFiniteError(f"{what} holds NaN or Inf: a model with non-finite values is "
                                 f"never written", what)
    if vocab_model is not None:
        arrays["vocab_model"] = numpy.frombuffer(bytes(vocab_model), dtype=numpy.uint8)
    return arrays


def save(path: str | os.PathLike, params: dict, *, optimizer_state: dict | None = None,
         step: int, config: dict, vocab_id: str | None, vocab_model: bytes | None = None,
         extra: dict | None = None, kind: str = FIRST_KIND) -> str:
    """Write a checkpoint to ``path`` atomically; return the path written.

    ``config`` is the model config as a dict (``Config.to_dict()``), ``extra`` any JSON values the
    caller wants back (e.g. ``{"seed": 1234}``), ``kind`` the model's (its ``KIND``, a kind of
    the registry). Parent directories are created.
    """
    models.get(kind)                                  # refuses a kind nothing can read
    if not isinstance(config, dict):
        raise TypeError(
            f"config must be a dict, got {type(config).__name__}: pass config.to_dict()")
    bad = [name for name in params if not isinstance(name, str) or not name]
    if bad:
        raise ValueError(f"parameter names must be non-empty strings, got {bad!r}")
    if optimizer_state is not None:
        _check_optimizer_state(optimizer_state, params)
    meta = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "kind": kind,
        "step": int(step),
        "config": config,
        "vocab_id": vocab_id,
        "extra": dict(extra or {}),
        "param_names": list(params),
        "optimizer_step": None if optimizer_state is None else int(optimizer_state["step"]),
    }
    arrays = _arrays_to_write(params, optimizer_state, vocab_model, meta)

    path = os.fspath(path)
    # a hidden name ending in .tmp: never mistaken for a checkpoint by latest() or keep_last()
    with files.replacing(path) as tmp, open(tmp, "wb") as f:
        _write_archive(f, arrays)
    return path


def _write_archive(f, arrays: dict[str, numpy.ndarray]) -> None:
    """``numpy.savez`` of ``arrays`` into the open file ``f``. Signals are held back while it
    runs and stop it at its next write to ``f`` (:class:`_StopPointAtEachWrite`): zipfile copes
    with a write that fails, as it must with a full disk, but not with a KeyboardInterrupt
    between any two of its lines (one inside ``ZipFile()`` leaves an object whose clean-up
    fails with AttributeError: 'ZipFile' object has no attribute '_writing')."""
    with stops.interrupts_deferred(stop_points=True):
        numpy.savez(_StopPointAtEachWrite(f), **arrays)


class _StopPointAtEachWrite:
    """A file whose every write is first a stop point (:func:`stops.stop_point`): a signal held
    back while the archive is built stops it there, within one write of numpy's (16 MiB at
    most) rather than once the whole archive is written."""

    def __init__(self, file) -> None:
        self.file = file

    def write(self, data) -> int:
        stops.stop_point()
        return self.file.write(data)

    def __getattr__(self, name: str):
        return getattr(self.file, name)


def _damaged(path: str, reason: object) -> CheckpointError:
    return CheckpointError(
        f"checkpoint file {path} is damaged (truncated or corrupt) and cannot be read: {reason}. "
        f"Move it aside (e.g. rename it to .npz.bad) and resume from an earlier one: --resume "
        f"takes the newest remaining checkpoint_*.npz of its directory")


def _read_meta(archive, path: str) -> dict:
    if "meta" not in archive.files:
        raise CheckpointError(
            f"{path} is an .npz file but not a minitfm checkpoint (no 'meta' entry)")
    meta = json.loads(archive["meta"].tobytes().decode("utf-8"))
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise CheckpointError(
            f"{path} is an .npz file but not a minitfm checkpoint (format {found!r})")
    if meta.get("version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {meta.get('version')!r}, but this minitfm reads "
            f"only version {FORMAT_VERSION}: load it with the minitfm version that wrote it")
    return meta


def _read_group(archive, prefix: str, names: list[str], path: str) -> dict[str, numpy.ndarray]:
    missing = [n for n in names if f"{prefix}/{n}" not in archive.files]
    if missing:
        listed = ", ".join(f"{prefix}/{n}" for n in missing[:5])
        raise _damaged(path, f"arrays listed in its metadata are missing ({listed})")
    return {n: archive[f"{prefix}/{n}"] for n in names}


def load(path: str | os.PathLike, *, with_optimizer: bool = True) -> Checkpoint:
    """Read a checkpoint written by :func:`save`; all arrays come back as NumPy host arrays.

    ``with_optimizer=False`` skips the optimizer moments (two thirds of a training checkpoint),
    for decoding or averaging. Arrays of the file that no part of the layout above is (added by
    another program) are not read: their names are in ``unknown``. Raises
    :class:`CheckpointError` if the file is damaged, is not a checkpoint, or has an unknown format
    version, or if ``path`` is not a file (a directory, a pipe, a symbolic link that leads
    nowhere: a loop, a missing target); ``FileNotFoundError`` if there is nothing at all.
    """
    path = os.fspath(path)
    kind = files.kind_of(path)
    if kind == "a directory":
        raise CheckpointError(
            f"{path} is a directory: pass a checkpoint file, e.g. {checkpoint_path(path, 1)} "
            f"(or use --resume / python -m minitfm.average for run directories)")
    if kind is not None:
        raise CheckpointError(
            f"{path} is {kind}, not a file: a checkpoint is read out of order (an .npz is a "
            f"zip archive), which a pipe cannot do; save it to a file and give that")
    trouble = files.link_trouble(path)
    if trouble is not None:
        raise CheckpointError(f"checkpoint {path} is {trouble}: point it at a checkpoint file, "
                              f"or give the file itself")
    try:
        with numpy.load(path, allow_pickle=False) as archive:
            meta = _read_meta(archive, path)
            names = meta["param_names"]
            params = _read_group(archive, "param", names, path)
            optimizer_state = None
            if with_optimizer and meta["optimizer_step"] is not None:
                optimizer_state = {"step": meta["optimizer_step"],
                                   "m": _read_group(archive, "adam_m", names, path),
                                   "v": _read_group(archive, "adam_v", names, path)}
            vocab_model = (archive["vocab_model"].tobytes()
                           if "vocab_model" in archive.files else None)
            kind = meta.get("kind", FIRST_KIND)
            known = {"meta", "vocab_model", *(f"{group}/{name}" for name in names
                                              for group in ("param", "adam_m", "adam_v"))}
            return Checkpoint(path=path, params=params, step=meta["step"],
                              config=_with_later_fields(meta["config"], kind),
                              vocab_id=meta["vocab_id"], vocab_model=vocab_model,
                              optimizer_state=optimizer_state, extra=meta["extra"], kind=kind,
                              unknown=tuple(n for n in archive.files if n not in known))
    except (FileNotFoundError, CheckpointError):
        raise
    except ValueError as exc:
        if "Object arrays cannot be loaded" in str(exc):    # numpy: they need pickle
            raise CheckpointError(
                f"{path} holds Python objects, which minitfm checkpoints never do; refused "
                f"without unpickling (unpickling runs code from the file)") from exc
        raise _damaged(path, f"{type(exc).__name__}: {exc}") from exc
    except OSError as exc:
        files.raise_if_read_failed(path, exc)   # the disk failed the read: the file not judged
        raise _damaged(path, f"{type(exc).__name__}: {exc}") from exc
    except (zipfile.BadZipFile, EOFError, ValueError, KeyError, TypeError) as exc:
        # BadZipFile: truncated archive or CRC mismatch; ValueError: bad .npy header or JSON
        raise _damaged(path, f"{type(exc).__name__}: {exc}") from exc


def _with_later_fields(config: dict, kind: str) -> dict:
    """A config saved before its model gained fields (the model's ``LATER_FIELDS``): with them,
    each at the value that reproduces the model as it was saved. Only a config that has every
    other field of the model's config is completed; any other is returned as it is."""
    model = models.get(kind) if kind in models.kinds() else None
    later = getattr(model, "LATER_FIELDS", {})
    if not later or not dataclasses.is_dataclass(model.Config):
        return config
    fields = {f.name for f in dataclasses.fields(model.Config)}
    return {**later, **config} if fields - set(config) <= set(later) else config


def params_to_device(params: dict[str, numpy.ndarray]) -> dict:
    """Copy host parameters to the active backend (NumPy: the same arrays), keeping dtypes."""
    return {name: backend.to_device(array) for name, array in params.items()}


def config_differences(saved: dict, current: dict, *,
                       ignore: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    """``(field, saved value, current value)`` for every field that differs, values as reprs.

    ``current`` goes through JSON first (tuples become lists, as in a saved config); a field only
    one side has shows as "no such field".
    """
    current = json.loads(json.dumps(current))
    absent = object()

    def show(d: dict, key: str) -> str:
        return repr(d[key]) if key in d else "no such field"

    return [(key, show(saved, key), show(current, key))
            for key in sorted(saved.keys() | current.keys())
            if key not in ignore and saved.get(key, absent) != current.get(key, absent)]


def check_compatible(ckpt: Checkpoint, config: dict, vocab_id: str | None, *,
                     ignore: tuple[str, ...] = ()) -> None:
    """Raise a CheckpointError listing every difference between ``ckpt`` and the current run.

    ``config`` is the current ``Config.to_dict()``; fields named in ``ignore`` (e.g. ``dropout``
    when decoding) are not compared. The vocabulary must be the same one: a model trained on other
    token ids produces garbage.
    """
    problems = [f"config field {key!r}: checkpoint has {saved}, current run has {current}"
                for key, saved, current in config_differences(ckpt.config, config, ignore=ignore)]
    if ckpt.vocab_id != vocab_id:
        problems.append(f"vocabulary differs: checkpoint was trained with {ckpt.vocab_id!r}, "
                        f"current run uses {vocab_id!r}")
    if problems:
        raise CheckpointError(
            f"checkpoint {ckpt.path} does not fit the current run:\n  " + "\n  ".join(problems)
            + "\nUse the config and vocabulary it was trained with, or start from scratch")


def checkpoint_path(directory: str | os.PathLike, step: int) -> str:
    """``directory/checkpoint_{step:08d}.npz``, the name rotation and :func:`latest` look for."""
    return os.path.join(os.fspath(directory), f"checkpoint_{int(step):08d}.npz")


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, str]]:
    """``(step, path)`` of every ``checkpoint_*.npz`` in ``directory``, oldest first."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return []
    found = [(int(m.group(1)), os.path.join(directory, entry))
             for entry in os.listdir(directory) if (m := ROTATED_NAME.fullmatch(entry))]
    return sorted(found)


def latest(directory: str | os.PathLike) -> str | None:
    """The path of the checkpoint with the highest step in ``directory``, or None if none."""
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def keep_last(directory: str | os.PathLike, k: int, *, spare=()) -> list[str]:
    """Delete all but the ``k`` newest ``checkpoint_*.npz`` files and those of the steps in
    ``spare``; return the deleted paths.

    Other files in the directory (an averaged model, temporary files) are left alone.
    """
    if k < 1:
        raise ValueError(f"keep_last needs k >= 1 (keep at least the newest checkpoint), got {k}")
    spare = set(spare)
    doomed = [path for step, path in list_checkpoints(directory)[:-k] if step not in spare]
    for path in doomed:
        os.remove(path)
    return doomed
