"""The log of a run directory cut back for a resume: ``log.jsonl`` keeps its complete lines up to
the checkpoint's step, and those of the steps the resumed run makes again are kept in
``log.replaced.jsonl`` (``REPLACED_NAME``), each file written whole (``files.replacing``).
The rest of the run directory: :mod:`minitfm.training.rundir`.
"""

from __future__ import annotations

import json
import os

from minitfm import files

__all__ = ["REPLACED_NAME", "logged_step", "cut_log"]

REPLACED_NAME = "log.replaced.jsonl"   # the log lines of steps a resumed run made again


def logged_step(line: str) -> int | None:
    """The step of a log line, or None for a line a crash cut short."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def cut_log(path: str, step: int) -> tuple[int, int]:
    """Keep the complete log lines up to ``step``: a resumed run rewrites the steps lost since its
    checkpoint, and a line a crash cut short (no newline, or not JSON) is dropped, so the next
    line appended starts a line of its own. The complete lines of the steps after ``step`` are
    not lost: they are appended to ``log.replaced.jsonl`` (``REPLACED_NAME``) beside the log.
    Returns how many lines were cut short, and how many were kept there."""
    if not os.path.exists(path):
        return 0, 0
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [(line, logged_step(line) if line.endswith("\n") else None) for line in f]
    replaced = [line for line, logged in lines if logged is not None and logged > step]
    if replaced:
        _append_whole(os.path.join(os.path.dirname(path), REPLACED_NAME), replaced)
    with files.replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.writelines(line for line, logged in lines if logged is not None and logged <= step)
    return sum(logged is None for _, logged in lines), len(replaced)


def _append_whole(path: str, lines: list[str]) -> None:
    """Add ``lines`` at the end of the file ``path`` by writing it again whole (files.replacing):
    a write that fails (a full disk) leaves it as it was, with no line cut short, and raises a
    ``files.WriteError`` that names it."""
    try:
        with open(path, "rb") as f:
            before = f.read()
    except FileNotFoundError:
        before = b""
    with files.replacing(path) as tmp, open(tmp, "wb") as f:
        f.write(before)
        f.writelines(line.encode("utf-8") for line in lines)
