"""The run directory of a training run: what is in it, and how each file is written.

Layout of ``out_dir``:

- ``checkpoint_{step:08d}.npz``: the last ``keep_last`` checkpoints (:mod:`minitfm.checkpoint`
  names, writes and rotates them; a save leaves the previous one intact), and those rotation is
  told to spare (the best few, :mod:`minitfm.validation`);
- ``checkpoint_best.npz`` (``BEST_NAME``): a second name (a hard link, else a copy) of the
  checkpoint of the best validation so far, swapped in atomically; a checkpoint like any other
  (``--checkpoint``, averaging, translating), which resuming and rotation never take for one of
  theirs;
- ``log.jsonl`` (``LOG_NAME``): one JSON object per line, a logged step or a validation, each
  with its ``step``, appended; a resumed run first cuts it back (rewritten whole, atomically) to
  its complete lines up to its checkpoint's step (dropping those of the steps it will redo, and a
  line a crash cut short);
- ``run.json`` (``RUN_INFO_NAME``): what the caller says about the run (its command line), written
  once the checks of a new or resumed run have passed; with a best metric, also ``"best"``: the
  metric, its best value so far and the step of that validation.

Whole files (checkpoints, ``run.json``, the cut log) are written by ``files.replacing``. A file
that cannot be written (disk full, file too large, read-only file system) raises
:class:`WriteFailed` naming the file, the reason, its folder with the space free there, and the
latest checkpoint, which is left intact.

A run takes its directory with :meth:`RunDirectory.open` before anything in it is read or written:
the one place where a run-directory lock (one run per directory) is to be taken.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Collection

from minitfm import checkpoint, files

__all__ = ["LOG_NAME", "RUN_INFO_NAME", "BEST_NAME", "WriteFailed", "RunDirectory",
           "write_failed"]

LOG_NAME = "log.jsonl"
RUN_INFO_NAME = "run.json"
BEST_NAME = "checkpoint_best.npz"


class WriteFailed(RuntimeError):
    """A checkpoint or log line could not be written; the message names the intact checkpoint."""


def write_failed(what: str, exc: OSError, last_checkpoint: str | None) -> WriteFailed:
    """The error for ``what`` (e.g. "the log PATH") that failed with ``exc``; the reason names
    the folder and its free space (``files.write_error``) when ``exc`` names its file."""
    if exc.filename is not None:
        exc = files.write_error(exc.filename, exc)
    reason = exc.strerror or str(exc)
    kept = (f"the previous checkpoint {last_checkpoint} is intact" if last_checkpoint
            else "no checkpoint of this run was written yet")
    return WriteFailed(f"cannot write {what}: {reason}; {kept}. Free space (or make the "
                       f"directory writable) and continue with --resume")


class RunDirectory:
    """The files of one run in ``path``; ``keep_last``: the checkpoints kept."""

    def __init__(self, path: str | os.PathLike, keep_last: int = 5) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 (keep at least the newest checkpoint), "
                             f"got {keep_last}")
        self.path = os.fspath(path)
        self.keep_last = keep_last
        self.log_path = os.path.join(self.path, LOG_NAME)
        self.run_info_path = os.path.join(self.path, RUN_INFO_NAME)

    @classmethod
    def open(cls, path: str | os.PathLike, keep_last: int = 5) -> RunDirectory:
        """Take ``path`` for this run, before anything in it is read or written: the place for
        the run-directory lock (one process per directory), when it is added."""
        return cls(path, keep_last)

    def latest_checkpoint(self) -> str | None:
        return checkpoint.latest(self.path)

    def checkpoint_path(self, step: int) -> str:
        return checkpoint.checkpoint_path(self.path, step)

    def prepare(self, step: int, run_info: dict | None,
                last_checkpoint: str | None = None) -> None:
        """Ready the directory for a run at ``step``: create it, cut the log back to ``step``,
        write ``run.json`` (when ``run_info`` is given)."""
        try:
            os.makedirs(self.path, exist_ok=True)
            cut_log(self.log_path, step)
            if run_info is not None:
                _write_json(self.run_info_path, run_info)
        except OSError as exc:
            raise write_failed(f"the run directory {self.path} ({exc.filename})", exc,
                               last_checkpoint) from exc

    def append_log(self, record: dict, last_checkpoint: str | None = None) -> None:
        """Add ``record`` as one line of the log."""
        try:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as exc:
            raise write_failed(f"the log {self.log_path}", files.write_error(self.log_path, exc),
                               last_checkpoint) from exc

    def save_checkpoint(self, step: int, write: Callable[[str], None],
                        last_checkpoint: str | None = None) -> str:
        """Call ``write(path)`` with the path of the checkpoint of ``step``; return the path.
        Any exception of ``write`` but an ``OSError`` (which becomes :class:`WriteFailed`)
        passes through."""
        path = self.checkpoint_path(step)
        try:
            write(path)
        except OSError as exc:
            raise write_failed(f"checkpoint {path}", exc, last_checkpoint) from exc
        return path

    def rotate(self, last_checkpoint: str | None = None, spare: Collection[int] = ()) -> None:
        """Delete all but the newest ``keep_last`` checkpoints and those of the steps ``spare``."""
        try:
            checkpoint.keep_last(self.path, self.keep_last, spare=spare)
        except OSError as exc:
            raise write_failed(f"checkpoint {exc.filename}", exc, last_checkpoint) from exc

    @property
    def best_path(self) -> str:
        return os.path.join(self.path, BEST_NAME)

    def name_best(self, path: str, last_checkpoint: str | None = None) -> None:
        """Make ``checkpoint_best.npz`` name the checkpoint at ``path``: a hard link (no second
        copy on disk), else a copy, swapped in whole (files.replacing)."""
        if os.path.exists(self.best_path) and os.path.samefile(path, self.best_path):
            return
        try:
            with files.replacing(self.best_path) as tmp:
                try:
                    os.link(path, tmp)
                except OSError:                 # a file system without hard links
                    shutil.copyfile(path, tmp)
        except OSError as exc:
            raise write_failed(f"{self.best_path}", exc, last_checkpoint) from exc

    def record_best(self, record, last_checkpoint: str | None = None) -> None:
        """Set ``run.json``'s ``"best"`` to the metric, best value and step of ``record`` (a
        ``validation.Record``), keeping the rest of the file."""
        try:
            with open(self.run_info_path, encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):
            info = {}
        if not isinstance(info, dict):
            info = {}
        info["best"] = {"metric": record.metric, "value": record.best, "step": record.best_step,
                        "checkpoint": BEST_NAME}
        try:
            _write_json(self.run_info_path, info)
        except OSError as exc:
            raise write_failed(f"{self.run_info_path}", exc, last_checkpoint) from exc


def logged_step(line: str) -> int | None:
    """The step of a log line, or None for a line a crash cut short."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def cut_log(path: str, step: int) -> None:
    """Keep the complete log lines up to ``step``: a resumed run rewrites the steps lost since its
    checkpoint, and a line a crash cut short (no newline, or not JSON) is dropped, so the next
    line appended starts a line of its own."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line for line in f if line.endswith("\n")
                 and (logged := logged_step(line)) is not None and logged <= step]
    with files.replacing(path) as tmp, open(tmp, "x", encoding="utf-8") as f:
        f.writelines(lines)


def _write_json(path: str, info: dict) -> None:
    """Write ``info`` whole or not at all (files.replacing)."""
    with files.replacing(path) as tmp, open(tmp, "x", encoding="utf-8") as f:
        f.write(json.dumps(info, indent=1) + "\n")
