"""The learner's workshop folder: the exercise files, the old attempts, and the progress.
Host-only code (files and text).

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
import importlib
import json
import textwrap
from pathlib import Path

from minitfm import backend, files
from minitfm.data import DataError
from minitfm.learn import kernels, learner, source, todo
from minitfm.learn.cases import ALL_CASES, case_sizes, constants, gradients, run_case
from minitfm.learn.exercises import EXERCISES, Exercise

__all__ = ["Workshop", "STATES", "header", "make", "hint"]

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
        if ex.kind == "kernel":
            return "started" if kernels.unwritten(path) else "written"
        try:
            left = learner.unwritten(path, ex.write)
        except SyntaxError:
            return "written"
        return "started" if len(left) == len(ex.write) else "written"

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
        return k, hint(ex, k)


def digest(path: Path) -> str:
    return hashlib.sha256(learner.bytes_of(path)).hexdigest()


# ---- the text of an exercise ------------------------------------------------------------

def header(ex: Exercise, hard: bool) -> str:
    write = ", ".join(ex.write)
    return textwrap.dedent(f"""\
        # Exercise {ex.number:02d}, {ex.name}: {ex.title}.
        # Write the body of {write} where it says TODO; the rest is the library's own code
        # ({ex.module}){', its derivation left out (--hard)' if hard else ''}.
        #   check it:  python -m minitfm.learn check {ex.name}
        #   a hint:    python -m minitfm.learn hint {ex.name}
        """)


def make(ex: Exercise, hard: bool = False) -> str:
    """The exercise's file, from the library's source as it is now."""
    if ex.kind == "kernel":
        return kernels.make(ex, hard)
    todos = {name: todo.todo_lines(ex, name, call) for name, call in todo.calls(ex).items()}
    for name, words in ex.todo.items():
        todos[name] = [line for w in words for line in textwrap.wrap(w, todo.WIDTH)] + \
            [f"Check it: python -m minitfm.learn check {ex.name}"]
    return source.blanked(ex.module, ex.write, ex.keep, hard=hard, todos=todos,
                          header=header(ex, hard), borrow=ex.borrow)


def hint(ex: Exercise, k: int) -> str:
    """Hint ``k`` of an exercise (see :meth:`Workshop.next_hint`)."""
    if k == 1:
        return shapes_hint(ex)
    if k == 2:
        return ex.step
    if ex.kind == "kernel":
        return kernels.third_hint(ex)
    lines = [" ".join(line.split()) for line in source.derivation(ex.module) if line.strip()]
    first = ex.derivation or "; ".join(lines[:2])
    return f"the derivation starts: {first}"


def shapes_hint(ex: Exercise) -> str:
    """Each gradient has the shape of what it differentiates: the shapes of the first case."""
    if ex.kind == "optim":
        return ("m, v and p keep their shapes; the step size and v's scale are numbers: "
                "coefficients returns (b1, b2, step_size, v_scale, keep), with lr m_hat / "
                "(sqrt(v_hat) + eps) == step_size * m / (sqrt(v) * v_scale + eps)")
    if ex.kind == "kernel":
        return kernels.shapes_hint(ex)
    if ex.kind == "model":
        return ("out holds one array per parameter, of the parameter's shape: write each "
                "gradient there (out[tgt_name] holds the output projection's already, and the "
                "embeddings' backward passes add to it)")
    library = importlib.import_module(ex.module)
    case = ALL_CASES[ex.cases[0]]
    with backend.using("numpy"), constants(ex, library):
        arrays, _, _, result = run_case(case, case_sizes(ex, case), 0, library, {})
    grads = gradients(case, result)
    pairs = "; ".join(f"{name} {todo.value_text(arrays[name])} -> d{name} "
                      f"{todo.value_text(g)}"
                      for name, g in grads.items())
    return (f"in the case \"{case.name}\": {pairs}. A gradient has the shape of what it "
            f"differentiates; where a parameter meets every row, its gradient sums over the "
            f"rows")
