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

import hashlib
import json
from pathlib import Path

from minitfm import files
from minitfm.data import DataError
from minitfm.learn import learner
from minitfm.learn.exercise import Exercise
from minitfm.learn.exercises import EXERCISES, make

__all__ = ["Workshop", "STATES", "digest"]

STATES = ("not started", "started", "written", "passing")
PROGRESS = "progress.json"


class Workshop:
    """The folder ``path`` and its progress."""

    def __init__(self, path: str | Path = "workshop"):
        self.path = Path(path)

    # ---- progress ------------------------------------------------------------------------
    def progress(self) -> dict:
        file = self.path / PROGRESS
        if not file.exists():
            return {"passed": {}, "hints": {}, "current": None, "hard": {}}
        fix = "move it aside and the workshop starts a new one (the exercise files stay)"
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
        if not isinstance(data, dict):
            raise DataError(f"{file} is damaged (a JSON {type(data).__name__}, not an "
                            f"object): {fix}")
        for key, empty in (("passed", {}), ("hints", {}), ("current", None), ("hard", {})):
            data.setdefault(key, empty)
        return data

    def save(self, data: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        with files.replacing(self.path / PROGRESS) as tmp:
            Path(tmp).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n",
                                 encoding="utf-8")

    def file(self, ex: Exercise) -> Path:
        return self.path / ex.filename

    def state(self, ex: Exercise, data: dict | None = None) -> str:
        path = self.file(ex)
        if not path.exists():
            return "not started"
        data = self.progress() if data is None else data
        if data["passed"].get(ex.name) == digest(path):
            return "passing"
        return "started" if ex.kind.started(ex, path) else "written"

    def record_pass(self, ex: Exercise) -> None:
        """Record that ``ex`` passes as its file is now (its hash in the progress)."""
        data = self.progress()
        data["passed"][ex.name] = digest(self.file(ex))
        self.save(data)

    def set_current(self, ex: Exercise) -> None:
        data = self.progress()
        data["current"] = ex.name
        self.save(data)

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
        if path.exists():
            raise FileExistsError(f"{path} exists already: edit it, or start over with "
                                  f"`python -m minitfm.learn reset {ex.name}` (your attempt is "
                                  f"kept in {self.path / 'attempts'})")
        text = make(ex, hard)
        self.path.mkdir(parents=True, exist_ok=True)
        with files.replacing(path) as tmp:
            Path(tmp).write_text(text, encoding="utf-8")
        data = self.progress()
        data["current"], data["hard"][ex.name] = ex.name, hard
        data["passed"].pop(ex.name, None)
        self.save(data)
        return path

    def reset(self, ex: Exercise, hard: bool | None = None) -> tuple[Path, Path | None]:
        """Start ``ex`` over, its old file kept as ``attempts/NN_name.K.py``: (new, kept)."""
        path, kept = self.file(ex), None
        data = self.progress()
        if hard is None:
            hard = bool(data["hard"].get(ex.name, False))
        if path.exists():
            attempts = self.path / "attempts"
            attempts.mkdir(parents=True, exist_ok=True)
            k = 1
            while (attempts / f"{path.stem}.{k}{path.suffix}").exists():
                k += 1
            kept = attempts / f"{path.stem}.{k}{path.suffix}"
            path.replace(kept)
        data["hints"].pop(ex.name, None)
        self.save(data)
        return self.start(ex, hard), kept

    def next_hint(self, ex: Exercise) -> tuple[int, str]:
        """The next of the exercise's hints (1: the shapes, 2: the chain-rule step, 3: the
        derivation's first line), counted in the progress; the last one again after that."""
        data = self.progress()
        k = min(int(data["hints"].get(ex.name, 0)) + 1, 3)
        data["hints"][ex.name] = k
        self.save(data)
        return k, ex.kind.hint(ex, k)


def digest(path: Path) -> str:
    return hashlib.sha256(learner.bytes_of(path)).hexdigest()
