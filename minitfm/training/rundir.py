"""The run directory of a training run: what is in it, and how each file is written.

Layout of ``out_dir``:

- ``checkpoint_{step:08d}.npz``: the last ``keep_last`` checkpoints (:mod:`minitfm.checkpoint`
  names, writes and rotates them; a save leaves the previous one intact), and those rotation is
  told to spare (the best few, :mod:`minitfm.training.validation`);
- ``checkpoint_best.npz`` (``BEST_NAME``): a second name (a hard link, else a copy) of the
  checkpoint of the best validation so far, swapped in atomically; a checkpoint like any other
  (``--checkpoint``, averaging, translating), which resuming and rotation never take for one of
  theirs;
- ``log.jsonl`` (``LOG_NAME``): one JSON object per line, a logged step or a validation, each
  with its ``step``, appended; a resumed run first cuts it back (rewritten whole, atomically) to
  its complete lines up to its checkpoint's step (dropping a line a crash cut short, and moving
  those of the steps it will redo to ``log.replaced.jsonl``, ``REPLACED_NAME``, appended to its
  earlier lines: that file too is rewritten whole; :mod:`minitfm.training.runlog`);
- ``run.json`` (``RUN_INFO_NAME``): the record of the run (:mod:`minitfm.training.record`: the
  start as written, every resume appended, each session's outcome, the best validation),
  written once the checks of a new or resumed run have passed.

Whole files (checkpoints, ``run.json``, the cut log and the lines it replaced) are written by
``files.replacing``. A file that cannot be written (disk full, file too large, read-only file
system) raises :class:`WriteFailed` naming the file, the reason, its folder with the space free
there, and the checkpoint left intact: this session's latest, else the newest of the directory
that passes the checkpoint check (:mod:`minitfm.usable`), or that there is none.

- ``run.lock`` (``LOCK_NAME``): the lock file of one run per directory, and ``run.lock.json``
  (``HOLDER_NAME``): who holds it (pid, host, start time, command).

One run per directory. A run takes its directory with :meth:`RunDirectory.open` before anything
in it is read or written: that takes an OS lock (``flock``, through ``filelock``) on
``run.lock``, which the OS releases when the process ends, however it ends (``kill -9``
included), so no stale lock outlives a run. A second process opening the directory meanwhile is
refused at once with :class:`RunDirectoryBusy`, naming the holder from ``run.lock.json`` (written
after the lock is taken: ``filelock`` owns the lock file's contents). On a file system without
file locks, :class:`LockUnsupported` says so; ``lock=False`` (``--no-lock``) opens without one.
Within one process the directory is taken once: opening it again (the command line, then the
training loop) shares that hold, and the last :meth:`RunDirectory.close` releases it. Before
anything is written, a directory in which one of these names (``RUN_FILES``, or a checkpoint's)
is not a regular file (a named pipe, a device, a folder) is refused with
:class:`NotARunDirectory`: a pipe would hold the run forever at its first read or write. A directory
the open created and the run left empty (a run refused on bad input) is removed again. Taking it
removes the temporaries that writes of a killed run left there, those whose writer is gone
(:meth:`RunDirectory.stale_removed` says how many).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
from collections.abc import Callable, Collection

import filelock

from minitfm import checkpoint, files, usable
from minitfm.training.record import RunRecord, command_line, timestamp
from minitfm.training.runlog import REPLACED_NAME, cut_log

__all__ = ["LOG_NAME", "REPLACED_NAME", "RUN_INFO_NAME", "BEST_NAME", "LOCK_NAME", "HOLDER_NAME",
           "RUN_FILES", "WriteFailed", "RunDirectoryBusy", "LockUnsupported", "NotARunDirectory",
           "RunDirectory", "write_failed"]

LOG_NAME = "log.jsonl"
RUN_INFO_NAME = "run.json"
BEST_NAME = "checkpoint_best.npz"
LOCK_NAME = "run.lock"
HOLDER_NAME = "run.lock.json"
RUN_FILES = (RUN_INFO_NAME, LOG_NAME, REPLACED_NAME, BEST_NAME, LOCK_NAME, HOLDER_NAME)
# what flock says on a file system that cannot lock (NFS without a lock daemon, some FUSE mounts)
_NO_LOCKS = {errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL}


class WriteFailed(RuntimeError):
    """A checkpoint or log line could not be written; the message names the intact checkpoint."""


class RunDirectoryBusy(RuntimeError):
    """Another process holds the run directory; the message names it and what to do."""


class LockUnsupported(RuntimeError):
    """The run directory's file system cannot lock files."""


class NotARunDirectory(RuntimeError):
    """``--out`` names something that is not a directory (a file, a pipe), or a directory where
    one of the run's files is not a regular file (a named pipe called ``run.json``)."""


def write_failed(what: str, exc: OSError, last_checkpoint: str | None,
                 directory: str) -> WriteFailed:
    """The error for ``what`` (e.g. "the log PATH") that failed with ``exc``; the reason names
    the folder and its free space (``files.write_error``) when ``exc`` names its file. The
    checkpoint kept: ``last_checkpoint``, this session's newest (written or resumed from, so
    known whole); without one, the newest checkpoint of the run directory ``directory`` that
    passes the check (:func:`minitfm.usable.newest_usable`), or that none does."""
    if exc.filename is not None:
        exc = files.write_error(exc.filename, exc)
    reason = exc.strerror or str(exc)
    newest = None if last_checkpoint else usable.newest_usable(directory, with_optimizer=True)
    then = "continue with --resume"
    if last_checkpoint:
        kept = f"the previous checkpoint {last_checkpoint} is intact"
    elif newest:
        kept = f"the newest checkpoint that passes the checkpoint check, {newest}, is intact"
        if newest != checkpoint.latest(directory):
            then = ("continue from it with --resume once the newer ones are moved aside (e.g. "
                    "renamed to .npz.bad: --resume takes the newest checkpoint_*.npz)")
    elif checkpoint.list_checkpoints(directory):
        kept = f"no checkpoint in {directory} can be resumed (none passes the checkpoint check)"
        then = "run the command again"
    else:
        kept, then = "no checkpoint of this run was written yet", "run the command again"
    return WriteFailed(f"cannot write {what}: {reason}; {kept}. Free space (or make the "
                       f"directory writable) and {then}")


def _written(exc: OSError, directory: str) -> str:
    """What ``exc`` failed to write, in words: the file it names, else the run directory."""
    if exc.filename is None or os.path.abspath(exc.filename) == os.path.abspath(directory):
        return f"the run directory {directory}"
    return os.fsdecode(exc.filename)


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
        self._taken: str | None = None          # the key of this process's hold, while open
        self.record = RunRecord(self.run_info_path)

    @classmethod
    def open(cls, path: str | os.PathLike, keep_last: int = 5, *,
             lock: bool = True) -> RunDirectory:
        """Take ``path`` for this run, before anything in it is read or written: create it and
        lock it (one process per directory); :meth:`close` (or leaving a ``with`` block) gives
        it back. Raises :class:`RunDirectoryBusy` while another process holds it,
        :class:`LockUnsupported` on a file system without locks (``lock=False``: no lock, for
        such a file system), :class:`WriteFailed` if the directory cannot be made."""
        run_dir = cls(path, keep_last)
        run_dir._taken = _take(run_dir.path, lock)
        return run_dir

    @property
    def stale_removed(self) -> int:
        """How many temporaries of killed writes the take of the directory removed (files.
        remove_stale_temporaries: those whose writer is gone), 0 for a hold this process shares."""
        hold = _holds.get(self._taken) if self._taken else None
        return hold.stale_removed if hold else 0

    def close(self) -> None:
        """Give the directory back (the last hold of this process releases the lock)."""
        if self._taken is not None:
            _give_back(self._taken)
            self._taken = None

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def latest_checkpoint(self) -> str | None:
        return checkpoint.latest(self.path)

    def checkpoint_path(self, step: int) -> str:
        return checkpoint.checkpoint_path(self.path, step)

    def prepare(self, step: int, run_info: dict | None,
                last_checkpoint: str | None = None, *, resumed: bool = False) -> tuple[int, int]:
        """Ready the directory for a run at ``step``: create it, cut the log back to ``step``,
        and record this session in ``run.json`` (when ``run_info`` is given: its ``"args"``,
        ``"config"`` and so on): the start of the run, or with ``resumed`` one more entry of
        ``"resumes"``, the start kept as it is. Returns how many log lines a crash had cut short
        (dropped) and how many of steps after ``step`` were moved to ``log.replaced.jsonl``
        (:func:`cut_log`)."""
        try:
            os.makedirs(self.path, exist_ok=True)
            cut = cut_log(self.log_path, step)
            if run_info is not None:
                self.record.start(step, run_info, resumed)
        except OSError as exc:
            raise write_failed(_written(exc, self.path), exc, last_checkpoint,
                               self.path) from exc
        return cut

    def append_log(self, record: dict, last_checkpoint: str | None = None) -> None:
        """Add ``record`` as one line of the log."""
        try:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as exc:
            raise write_failed(f"the log {self.log_path}", files.write_error(self.log_path, exc),
                               last_checkpoint, self.path) from exc

    def save_checkpoint(self, step: int, write: Callable[[str], None],
                        last_checkpoint: str | None = None) -> str:
        """Call ``write(path)`` with the path of the checkpoint of ``step``; return the path.
        Any exception of ``write`` but an ``OSError`` (which becomes :class:`WriteFailed`)
        passes through."""
        path = self.checkpoint_path(step)
        try:
            write(path)
        except OSError as exc:
            again = " again, with its validation" if path == last_checkpoint else ""
            raise write_failed(f"checkpoint {path}{again}", exc, last_checkpoint,
                               self.path) from exc
        return path

    def rotate(self, last_checkpoint: str | None = None, spare: Collection[int] = ()) -> None:
        """Delete all but the newest ``keep_last`` checkpoints and those of the steps ``spare``."""
        try:
            checkpoint.keep_last(self.path, self.keep_last, spare=spare)
        except OSError as exc:
            raise write_failed(f"checkpoint {exc.filename}", exc, last_checkpoint,
                               self.path) from exc

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
            raise write_failed(self.best_path, exc, last_checkpoint, self.path) from exc

    def record_best(self, record, last_checkpoint: str | None = None) -> None:
        """Set ``run.json``'s ``"best"`` to the metric, best value and step of ``record`` (a
        ``validation.Record``), keeping the rest of the file."""
        try:
            self.record.set_best({"metric": record.metric, "value": record.best,
                                  "step": record.best_step, "checkpoint": BEST_NAME})
        except OSError as exc:
            raise write_failed(self.run_info_path, exc, last_checkpoint, self.path) from exc


# ---- one run per directory -------------------------------------------------------------------

class _Hold:
    """This process's hold of a run directory: its lock (None: taken without one), the opens
    not yet closed, and the first folder the open created (None: it existed)."""

    def __init__(self, path: str, lock: filelock.BaseFileLock | None,
                 created: str | None) -> None:
        self.path, self.lock, self.count, self.created = path, lock, 1, created
        self.stale_removed = files.remove_stale_temporaries(path)      # the lock is ours now


_holds: dict[str, _Hold] = {}        # the run directories this process holds, by real path


def _take(path: str, lock: bool) -> str:
    if os.path.lexists(path) and not os.path.isdir(path):
        what = files.kind_of(path) or files.link_trouble(path) or "a file"
        raise NotARunDirectory(f"--out {path} is {what}, not a run directory: give a directory "
                               f"(a new one, or that of a run to continue with --resume)")
    _check_files(path)
    created = None
    missing = os.path.abspath(path)
    while not os.path.exists(missing) and os.path.dirname(missing) != missing:
        created, missing = missing, os.path.dirname(missing)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise write_failed(_written(exc, path), exc, None, path) from exc
    key = os.path.realpath(path)
    if key in _holds:
        _holds[key].count += 1
        return key
    try:
        _holds[key] = _Hold(path, _lock(path) if lock else None, created)
    except BaseException:
        _remove_if_unused(path, created)
        raise
    return key


def _check_files(path: str) -> None:
    """Refuse the run directory ``path`` if one of its files (``RUN_FILES`` and the checkpoints)
    is not a regular file: a named pipe would hold the run at its first read or write, forever;
    a device would take what is written to it; a folder (or a symbolic link that leads nowhere)
    would be moved aside or replaced by a file."""
    names = [os.path.join(path, name) for name in RUN_FILES]
    for name in [*names, *(found for _, found in checkpoint.list_checkpoints(path))]:
        what = files.kind_of(name) or files.link_trouble(name)
        if what:
            raise NotARunDirectory(
                f"{name} is {what}, where the run keeps a regular file (its record, log, lock "
                f"or a checkpoint): move it out of {path}, or choose another --out")


def _give_back(key: str) -> None:
    hold = _holds[key]
    hold.count -= 1
    if hold.count:
        return
    del _holds[key]
    if hold.lock is not None:
        try:
            os.remove(os.path.join(hold.path, HOLDER_NAME))   # while still holding the lock
        except OSError:
            pass
        if hold.created and os.listdir(hold.path) == [LOCK_NAME]:
            # A peer that opened the file before this unlink sees it unlinked and is refused.
            try:
                os.remove(os.path.join(hold.path, LOCK_NAME))
            except OSError:
                pass
        hold.lock.release()
    _remove_if_unused(hold.path, hold.created)


def _remove_if_unused(path: str, created: str | None) -> None:
    """Remove the folders from ``path`` up to ``created`` that are empty (nothing was written)."""
    if created is None:
        return
    path = os.path.abspath(path)
    while True:
        try:
            os.rmdir(path)
        except OSError:
            return
        if path == created:
            return
        path = os.path.dirname(path)


def _lock(path: str) -> filelock.BaseFileLock:
    """The lock of ``path``, taken without waiting; the holder's details written beside it."""
    lock = filelock.UnixFileLock(os.path.join(path, LOCK_NAME), timeout=0, blocking=False,
                                 thread_local=False, fallback_to_soft=False)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise RunDirectoryBusy(_busy(path)) from None
    except OSError as exc:
        if exc.errno in _NO_LOCKS:
            raise LockUnsupported(
                f"cannot lock the run directory {path}: its file system does not support file "
                f"locks ({exc.strerror or exc}), so a second run on it could not be refused. Use "
                f"a run directory on a local file system, or, if no other run can use this one, "
                f"pass --no-lock") from exc
        raise write_failed(f"the lock file {os.path.join(path, LOCK_NAME)}", exc, None,
                           path) from exc
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": timestamp(),
              "command": command_line()}
    try:
        with files.replacing(os.path.join(path, HOLDER_NAME)) as tmp, \
                open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(holder) + "\n")
    except OSError as exc:
        lock.release()
        raise write_failed(_written(exc, path), exc, None, path) from exc
    except BaseException:
        lock.release()
        raise
    return lock


def _busy(path: str) -> str:
    """Why ``path`` cannot be taken: its holder (from its details file) and what to do."""
    try:
        with open(os.path.join(path, HOLDER_NAME), encoding="utf-8") as f:
            holder = json.load(f)
        who = (f"pid {holder['pid']} on {holder['host']}, started {holder['started']}: "
               f"{holder['command']}")
        stop = f"stop it (kill {holder['pid']} on {holder['host']})"
    except (OSError, ValueError, KeyError, TypeError):
        who = "a process that has not written its details yet"
        stop = "stop it"
    return (f"the run directory {path} is in use by another run ({who}). Wait for that run to "
            f"finish, {stop}, or choose another --out")
