"""The result of checking an exercise, and its words: what ``check`` prints. Host-only code."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from minitfm.learn.exercises import Exercise

__all__ = ["ArrayResult", "CaseResult", "Report", "describe"]


@dataclass
class ArrayResult:
    """One gradient (or output) of a case: its relative error, whether it passes, the first
    wrong element ``(index, yours, numerical)`` and the diagnosis."""
    name: str
    error: float
    ok: bool
    first: tuple | None = None
    diagnosis: str | None = None
    shape: tuple | None = None          # the learner's array's, where it is not the right one


@dataclass
class CaseResult:
    name: str
    sizes: dict
    arrays: list[ArrayResult] = field(default_factory=list)
    problem: str | None = None          # an exception, a result of the wrong form
    note: str | None = None             # a remark that does not fail the case
    changed: list[str] = field(default_factory=list)    # what the backward changed in place

    @property
    def ok(self) -> bool:
        return self.problem is None and not self.changed and all(a.ok for a in self.arrays)


@dataclass
class Report:
    """The check of an exercise: ``status`` "pass", "fail", "not written", "error" (the file
    does not load) or "cancelled" (``watch``: the file saved again during the check);
    ``message`` says why where there are no cases to show."""
    exercise: Exercise
    path: Path
    status: str
    cases: list[CaseResult] = field(default_factory=list)
    message: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "pass"


REFERENCE = {"layer": "the library's", "model": "the library's", "optim": "the library's",
             "kernel": "the twin's"}


def _gradient_label(name: str) -> str:
    """How a gradient is named: dx, dgamma, d(enc.0.ln1.gamma)."""
    return f"d{name}" if name.isidentifier() else f"d({name})"


def _listed(names: list[str]) -> str:
    shown = names[:3] + ([f"{len(names) - 3} more"] if len(names) > 3 else [])
    return ", ".join(shown[:-1]) + (" and " if len(shown) > 1 else "") + shown[-1]


def describe(report: Report) -> str:
    """The report as the learner reads it."""
    ex = report.exercise
    lines = [f"{ex.number:02d} {ex.name}: {ex.title} ({report.path})"]
    if report.message:
        lines += ["", textwrap.indent(report.message, "  ")]
    for case in report.cases:
        sizes = ", ".join(f"{k}={v}" for k, v in case.sizes.items() if not isinstance(v, bool))
        lines.append(f"  {case.name}" + (f" ({sizes})" if sizes else ""))
        if case.problem:
            lines.append(textwrap.indent(case.problem, "    "))
            continue
        label = _gradient_label if ex.kind in ("layer", "model") else str
        width = max((len(label(a.name)) for a in case.arrays), default=0)
        shown = case.arrays if len(case.arrays) <= 8 else [a for a in case.arrays if not a.ok]
        if len(shown) < len(case.arrays):
            right = sum(a.ok for a in case.arrays)
            lines.append(f"    {right} of {len(case.arrays)} right" +
                         (f", the worst relative error {max(a.error for a in case.arrays):.1e}"
                          if right == len(case.arrays) else "; the wrong ones:"))
        for a in shown:
            mark = "ok" if a.ok else "WRONG"
            error = (f"relative error {a.error:.1e}" if a.error != math.inf else
                     f"shape {a.shape}" if a.shape is not None else "not compared")
            lines.append(f"    {label(a.name):<{width}}  {error:<24}{mark}")
            if a.first is not None:
                index, yours, numeric = a.first
                lines.append(f"    {'':<{width}}  first wrong element {list(index)}: yours "
                             f"{yours:.6g}, {REFERENCE[ex.kind]} {numeric:.6g}")
            if a.diagnosis:
                lines.append(textwrap.indent(textwrap.fill(
                    "diagnosis: " + a.diagnosis, 96 - width), " " * (width + 6)))
        if case.changed:
            lines.append(textwrap.indent(textwrap.fill(
                f"WRONG: your backward changes {_listed(case.changed)} in place: a backward "
                f"must leave its gradient and its cache as they were (a model reads them again: "
                f"the residual adds dy once more, the cache's arrays are the inputs and the "
                f"parameters); compute into new arrays", 92), "    "))
        if case.note:
            lines.append(textwrap.indent(textwrap.fill(case.note, 92), "    "))
    verdict = {"pass": "passed", "fail": "failed", "not written": "not written yet",
               "error": "could not run", "cancelled": "cancelled"}[report.status]
    lines.append(f"{ex.name}: {verdict} ({report.seconds:.1f} s)")
    return "\n".join(lines)
