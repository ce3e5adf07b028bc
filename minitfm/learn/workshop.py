"""The learner's workshop folder: the exercise files, the old attempts, and the progress (what
is in an exercise's file is its kind's to make: ``kinds.py``). Host-only code (files).

    workshop/
        01_linear.py ... 17_model.py, 18_kernel_dropout.cu ...   the exercises, as started
        attempts/06_layernorm.1.py                               an attempt kept by ``reset``
        progress.json                                            what passed, hints, the current

An exercise's state: "not started" (no file), "started" (its functions still hold the TODO),
"written" (written, not passing as it stands) or "passing" (it passed its check as the file is
now: the file's hash is the one that passed). Nothing here writes outside the folder, and each
file is written whole or not at all.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from pathlib import Path

from minitfm import files
from minitfm.data import DataError
from minitfm.learn import learner
from minitfm.learn.exercise import Exercise
from minitfm.learn.exercises import EXERCISES, make

__all__ = ["Workshop", "STATES", "digest"]

STATES = ("not started", "started", "written", "passing")
PROGRESS = "progress.json"
ATTEMPTS = "attempts"
EMPTY = {"passed": {}, "hints": {}, "current": None, "hard": {}}
# progress.json's fields: exercise name -> what each holds, and its test
FIELDS = {"passed": ("the hash of the file that passed (a string)", lambda v: isinstance(v, str)),
          "hints": ("a count of hints (a whole number of 0 or more)",
                    lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
          "hard": ("true or false", lambda v: isinstance(v, bool))}
NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
NO_RIGHTS = {errno.EACCES, errno.EPERM}


class Workshop:
    """The folder ``path`` and its progress."""

    def __init__(self, path: str | Path = "workshop"):
        self.path = Path(path)

    def check_folder(self) -> None:
        """Refuse (``DataError``) a folder that is not one: a file, a device, a link that leads
        nowhere, a path through a file; a folder not made yet is fine (``start`` makes it)."""
        fix = "give --dir the workshop's folder, or a path where none is yet (start makes it)"
        trouble = files.link_trouble(self.path)
        if trouble is not None:
            raise DataError(f"--dir {self.path} is {trouble}: {fix}")
        kind = _not_a_folder(self.path)
        if kind is not None:
            raise DataError(f"--dir {self.path} is {kind}, not a folder: {fix}")
        for above in self.path.parents:
            if above.exists() and not above.is_dir():
                raise DataError(f"--dir {self.path} passes through {above}, which is a file, "
                                f"not a folder: {fix}")

    # ---- progress ------------------------------------------------------------------------
    def progress(self) -> dict:
        file = self.path / PROGRESS
        fix = "move it aside and the workshop starts a new one (the exercise files stay)"
        trouble = files.link_trouble(file)
        if trouble is not None:
            raise DataError(f"{file} is {trouble}, where the workshop keeps its progress: {fix}")
        if not file.exists():
            return json.loads(json.dumps(EMPTY))
        kind = files.kind_of(file)
        if kind is not None:                    # a pipe would be waited on
            raise DataError(f"{file} is {kind}, where the workshop keeps its progress: {fix}")
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            files.raise_if_read_failed(file, exc)   # the disk failed the read: not judged
            raise DataError(f"{file} cannot be read ({exc.strerror or exc}): {fix}") from None
        except ValueError as exc:
            raise DataError(f"{file} is damaged ({exc}): {fix}") from None
        return _checked(data, file, fix)

    def save(self, data: dict, what: str = "the progress") -> None:
        with self._writing(what), files.replacing(self.path / PROGRESS) as tmp:
            Path(tmp).write_text(_dumped(data), encoding="utf-8")

    def file(self, ex: Exercise) -> Path:
        return self.path / ex.filename

    def exists(self, ex: Exercise) -> bool:
        """Whether the exercise's file is there (a link to a file too); ``DataError`` where
        something else is in its place: a link that leads nowhere, a folder, a pipe, a
        device."""
        path = self.file(ex)
        if not os.path.lexists(path):
            return False
        trouble = files.link_trouble(path)
        if trouble is not None:
            raise DataError(f"{path} is {trouble}, where the exercise's file should be: remove "
                            f"the link (rm {path}) or point it at your file")
        kind = files.kind_of(path)
        if kind is not None:
            raise DataError(f"{path} is {kind}, where the exercise's file should be: move it "
                            f"aside and start the exercise again")
        return True

    def state(self, ex: Exercise, data: dict | None = None) -> str:
        path = self.file(ex)
        if not self.exists(ex):
            return "not started"
        data = self.progress() if data is None else data
        if data["passed"].get(ex.name) == digest(path):
            return "passing"
        return "started" if ex.kind.started(ex, path) else "written"

    def record_pass(self, ex: Exercise) -> None:
        """Record that ``ex`` passes as its file is now (its hash in the progress)."""
        data = self.progress()
        data["passed"][ex.name] = digest(self.file(ex))
        self.save(data, f"that {ex.name} passes (the verdict above stands)")

    def set_current(self, ex: Exercise) -> None:
        data = self.progress()
        data["current"] = ex.name
        self.save(data, f"{ex.name} as the current exercise")

    def current(self) -> Exercise | None:
        name = self.progress()["current"]
        return next((e for e in EXERCISES if e.name == name), None)

    def next_after(self, ex: Exercise) -> Exercise | None:
        """The first exercise after ``ex`` that is not passing."""
        data = self.progress()
        later = EXERCISES[EXERCISES.index(ex) + 1:] + EXERCISES[:EXERCISES.index(ex)]
        return next((e for e in later if self.state(e, data) != "passing"), None)

    # ---- files -----------------------------------------------------------------------------
    def start(self, ex: Exercise, hard: bool = False) -> Path:
        """Write the exercise's file (refused where it exists: ``reset`` starts over)."""
        path = self.file(ex)
        if self.exists(ex):
            raise FileExistsError(f"{path} exists already: edit it, or start over with "
                                  f"`python -m minitfm.learn reset {ex.name}` (your attempt is "
                                  f"kept in {self.path / ATTEMPTS})")
        return self._write(ex, hard, self.progress(), None, f"{ex.name}'s file")

    def reset(self, ex: Exercise, hard: bool | None = None) -> tuple[Path, Path | None]:
        """Start ``ex`` over, its old file kept as ``attempts/NN_name.K.py``: (new, kept)."""
        data = self.progress()
        if hard is None:
            hard = bool(data["hard"].get(ex.name, False))
        data["hints"].pop(ex.name, None)
        kept = self._attempt(ex) if self.exists(ex) else None
        return self._write(ex, hard, data, kept, f"the fresh copy of {ex.name}"), kept

    def next_hint(self, ex: Exercise) -> tuple[int, str]:
        """The next of the exercise's hints (1: the shapes, 2: the chain-rule step, 3: the
        derivation's first line), counted in the progress; the last one again after that."""
        data = self.progress()
        k = min(data["hints"].get(ex.name, 0) + 1, 3)
        data["hints"][ex.name] = k
        self.save(data, f"the count of {ex.name}'s hints")
        return k, ex.kind.hint(ex, k)

    def _attempt(self, ex: Exercise) -> Path:
        """The name the exercise's file is kept under by ``reset``: the first free
        ``attempts/NN_name.K.py``."""
        attempts, path = self.path / ATTEMPTS, self.file(ex)
        trouble = files.link_trouble(attempts) or _not_a_folder(attempts)
        if trouble is not None:
            raise DataError(f"{attempts} is {trouble}, where the workshop keeps your old "
                            f"attempts: move it aside, then reset again")
        k = 1
        while os.path.lexists(attempts / f"{path.stem}.{k}{path.suffix}"):
            k += 1
        return attempts / f"{path.stem}.{k}{path.suffix}"

    def _write(self, ex: Exercise, hard: bool, data: dict, keep: Path | None,
               what: str) -> Path:
        """The exercise's file made afresh, and the progress naming it current, written
        together, whole or not at all; the old file first copied whole to ``keep``. Where
        anything fails, the exercise's file and the progress are as they were."""
        path = self.file(ex)
        text = make(ex, hard)
        data["current"], data["hard"][ex.name] = ex.name, hard
        data["passed"].pop(ex.name, None)
        with self._writing(what), files.replacing_together(
                [self.path / PROGRESS, path]) as (progress, exercise):
            Path(exercise).write_text(text, encoding="utf-8")
            Path(progress).write_text(_dumped(data), encoding="utf-8")
            if keep is not None:
                with files.replacing(keep) as tmp:
                    Path(tmp).write_bytes(learner.bytes_of(path))
        return path

    @contextlib.contextmanager
    def _writing(self, what: str):
        """Writes into the folder: one that fails for want of room or rights is a
        ``files.WriteError`` that says so, that nothing was changed, and what to do."""
        try:
            yield
        except OSError as exc:
            if exc.errno not in NO_ROOM | NO_RIGHTS | {errno.EROFS}:
                raise
            raise self._cannot_write(exc, what) from exc

    def _cannot_write(self, exc: OSError, what: str) -> files.WriteError:
        folder = self.path
        name = Path(os.fsdecode(exc.filename)) if exc.filename is not None else folder
        reason = os.strerror(exc.errno)
        def elsewhere(that: str) -> str:
            return f"or copy {folder} to a folder that {that} and give it with --dir"
        if exc.errno in NO_ROOM:
            reason = files.write_error(name, exc).strerror    # with the space free there
            fix = f"make room on that disk, {elsewhere('has room')}"
        elif exc.errno == errno.EROFS:
            fix = f"{folder} is on a read-only mount: mount it read-write, " \
                  f"{elsewhere('can be written')}"
        else:
            fix = (f"this user may not write there: give yourself the right (chmod u+w "
                   f"{name.parent}), {elsewhere('can be written')}")
        return files.WriteError(exc.errno, f"{reason}: {what} was not saved, and nothing in "
                                           f"{folder} was changed; {fix}", str(name))


def _not_a_folder(path: Path) -> str | None:
    """What ``path`` is, in words, where something other than a folder is there (a device, a
    pipe, a file); None for a folder, or nothing."""
    kind = files.kind_of(path) or (
        "a file" if os.path.lexists(path) and not path.is_dir() else None)
    return None if kind == "a directory" else kind


def _dumped(data: dict) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def _checked(data, file: Path, fix: str) -> dict:
    """The progress read from ``file``, its fields filled in where missing; ``DataError``
    naming the first field of the wrong shape (names of no exercise are let be)."""
    if not isinstance(data, dict):
        raise DataError(f"{file} is damaged (a JSON {_json_type(data)}, not an object): {fix}")
    for key, empty in EMPTY.items():
        data.setdefault(key, json.loads(json.dumps(empty)))
    if data["current"] is not None and not isinstance(data["current"], str):
        raise DataError(f"{file} is damaged (its \"current\" is a JSON "
                        f"{_json_type(data['current'])}, not an exercise's name): {fix}")
    for key, (holds, fits) in FIELDS.items():
        if not isinstance(data[key], dict):
            raise DataError(f"{file} is damaged (its \"{key}\" is a JSON "
                            f"{_json_type(data[key])}, not an object): {fix}")
        for name, value in data[key].items():
            if not fits(value):
                raise DataError(f"{file} is damaged (its \"{key}\" of {name} is "
                                f"{json.dumps(value)[:40]}, not {holds}): {fix}")
    return data


def _json_type(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "true or false",
            type(None): "null"}.get(type(value), "number")


def digest(path: Path) -> str:
    return hashlib.sha256(learner.bytes_of(path)).hexdigest()
