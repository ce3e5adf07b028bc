"""The result of checking an exercise, and its words: what ``check`` prints. Host-only code.

A failing report fits on a screen: the arrays of a case that share a diagnosis are said once
("all 48 d(enc.*) ... all zero"), a case wrong in the same way as one above takes one line, and
a case that is right takes one line; :data:`LINES` bounds a report of one mistake."""

from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from minitfm.learn.exercise import Exercise

__all__ = ["ArrayResult", "CaseResult", "Report", "describe", "LINES"]

LINES = 40              # the most lines a failing report takes (a case's exception apart)
WIDTH = 96              # the width the diagnoses are wrapped to
COMPILER = re.compile(r"\S+:\d+:\d+: ")     # a compiler's message: file:line:column:
SHOWN = 8               # a case with more arrays shows its wrong ones only, by diagnosis


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
    confirmed: str | None = None        # finite differences' verdict on a right case

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


def _listed(names: list[str]) -> str:
    shown = names if len(names) <= 4 else names[:3] + [f"{len(names) - 3} more"]
    return ", ".join(shown[:-1]) + (" and " if len(shown) > 1 else "") + shown[-1]


def _wrapped(text: str, indent: int, first: str = "") -> list[str]:
    return textwrap.wrap(first + text, WIDTH - indent, initial_indent=" " * indent,
                         subsequent_indent=" " * (indent + 2), break_on_hyphens=False)


def _covering(names: list[str], everything: list[str], depth: int = 1) -> list[str]:
    """``names`` said briefly: "enc.*" for all of everything's names under "enc.", else by
    layer ("enc.0.*"), else one by one."""
    said: list[str] = []
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(".".join(name.split(".")[:depth]), []).append(name)
    for prefix, members in groups.items():
        under = [n for n in everything if n.startswith(prefix + ".")]
        if len(members) > 1 and len(members) == len(under) and "." in members[0]:
            said.append(prefix + ".*")
        elif len(members) > 1 and depth < 2:
            said += _covering(members, everything, depth + 1)
        else:
            said += members
    return said


def _group_label(names: list[str], everything: list[str], label) -> str:
    if len(names) == 1:
        return label(names[0])
    if len(names) == len(everything):
        return f"all {len(names)}"
    said = _covering(names, everything)
    if len(said) == 1 and said[0].endswith(".*"):
        return f"all {len(names)} {label(said[0])}"
    shown = _listed([label(n) for n in said])
    return shown if said == names and len(said) <= 4 else f"{shown} ({len(names)} in all)"


def _one(a: ArrayResult, label, width: int, reference: str, same_as: str | None) -> list[str]:
    """An array's lines: its name, error and mark, its first wrong element, its diagnosis (one
    line only where the diagnosis is ``same_as``'s, shown above)."""
    error = (f"relative error {a.error:.1e}" if a.error != math.inf else
             f"shape {a.shape}" if a.shape is not None else "not compared")
    lines = [f"    {label(a.name):<{width}}  {error:<24}{'ok' if a.ok else 'WRONG'}"]
    if same_as:
        return [lines[0] + f", the same diagnosis as {same_as}"]
    if a.first is not None:
        index, yours, numeric = a.first
        lines.append(f"    {'':<{width}}  first wrong element {list(index)}: yours "
                     f"{yours:.6g}, {reference} {numeric:.6g}")
    if a.diagnosis:
        lines += textwrap.indent(textwrap.fill("diagnosis: " + a.diagnosis, WIDTH - width),
                                 " " * (width + 6)).splitlines()
    return lines


def _fitted(head: list[str], entries: list, room: float, label) -> list[str]:
    """``head``, then the entries ``(arrays, lines)`` in order while they fit in ``room`` lines;
    the arrays of those that do not, in one line ([] where not one fits)."""
    lines, left = list(head), []
    for k, (arrays, more) in enumerate(entries):
        last = k == len(entries) - 1
        if left or len(lines) + len(more) > room - (not last):
            left += arrays
        else:
            lines += more
    if len(lines) == len(head):
        return []                   # not one of them: the case is said in a line
    wrong = [label(a.name) for a in left if not a.ok]
    right = len(left) - len(wrong)
    said = ([f"{_listed(wrong)} wrong"] if wrong else []) + ([f"{right} more right"] if right
                                                              else [])
    return lines + ([f"    and {', '.join(said)} (not shown: a screen is full)"] if said else [])


def _arrays(case: CaseResult, label, reference: str, room: float) -> list[str]:
    """A case's arrays in at most ``room`` lines: each one where there are few, else the wrong
    ones by diagnosis."""
    width = max((len(label(a.name)) for a in case.arrays), default=0)
    wrong = [a for a in case.arrays if not a.ok]
    if len(case.arrays) <= SHOWN:
        entries, first_with = [], {}
        for a in case.arrays:
            same_as = first_with.get(a.diagnosis) if a.diagnosis else None
            entries.append(([a], _one(a, label, width, reference, same_as and label(same_as))))
            if not a.ok and a.diagnosis:
                first_with.setdefault(a.diagnosis, a.name)
        return _fitted([], entries, room, label)
    right = len(case.arrays) - len(wrong)
    if not wrong:
        return [f"    {right} of {len(case.arrays)} right, the worst relative error "
                f"{max(a.error for a in case.arrays):.1e}"]
    groups: dict = {}
    for a in wrong:
        groups.setdefault(a.diagnosis, []).append(a)
    width = max(len(label(g[0].name)) for g in groups.values() if len(g) == 1) \
        if any(len(g) == 1 for g in groups.values()) else width
    everything = [a.name for a in case.arrays]
    entries = []
    for diagnosis, group in groups.items():
        if len(group) == 1:
            entries.append((group, _one(group[0], label, width, reference, None)))
            continue
        low, high = (f"{e:.1e}" for e in (min(a.error for a in group),
                                           max(a.error for a in group)))
        errors = f"relative error {low}" if low == high else f"relative errors {low} to {high}"
        more = _wrapped(f"{_group_label([a.name for a in group], everything, label)}: "
                        f"WRONG, {errors}", 4)
        entries.append((group, more + (_wrapped(diagnosis, 6, "diagnosis: ") if diagnosis
                                       else [])))
    return _fitted([f"    {right} of {len(case.arrays)} right; the wrong ones:"], entries, room,
                   label)


def _head(case: CaseResult) -> str:
    sizes = ", ".join(f"{k}={v}" for k, v in case.sizes.items() if not isinstance(v, bool))
    return case.name + (f" ({sizes})" if sizes else "")


def _remarks(case: CaseResult, with_confirmed: bool) -> list[str]:
    lines = []
    if case.changed:
        lines += _wrapped(f"WRONG: your backward changes {_listed(case.changed)} in place: a "
                          f"backward must leave its gradient and its cache as they were (a model "
                          f"reads them again: the residual adds dy once more, the cache's arrays "
                          f"are the inputs and the parameters); compute into new arrays", 4)
    said = [case.note] + ([case.confirmed] if with_confirmed else [])
    if any(said):
        lines += _wrapped("; ".join(s for s in said if s), 4)
    return lines


def _short(case: CaseResult, label) -> list[str]:
    """A case in a line or two: a problem's words, what is right, or what is wrong."""
    if case.problem:
        return _wrapped(_head(case), 2) + [textwrap.indent(case.problem, "    ")]
    wrong = [a.name for a in case.arrays if not a.ok]
    if not wrong and not case.changed:
        return _wrapped(f"{case.name}: all {len(case.arrays)} right", 2) + \
            _remarks(case, with_confirmed=False)
    what = [f"{_group_label(wrong, [a.name for a in case.arrays], label)} wrong"] if wrong \
        else []
    what += ["changes its arguments in place"] if case.changed else []
    return _wrapped(f"{case.name}: {' and '.join(what)} (diagnosed once the cases above pass)",
                    2)


def _message(message: str, indent: str) -> list[str]:
    """A message's lines indented, its prose wrapped to the screen; lines of code (indented
    already, or a compiler's) kept as they are."""
    out = []
    for line in message.splitlines():
        if line[:1].isspace() or len(line) + len(indent) <= WIDTH or COMPILER.match(line):
            out.append((indent + line).rstrip())
        else:
            out += textwrap.wrap(line, WIDTH, initial_indent=indent, subsequent_indent=indent,
                                 break_on_hyphens=False, break_long_words=False)
    return out


def describe(report: Report) -> str:
    """The report as the learner reads it: a failing one in at most :data:`LINES` lines, where
    its cases' problems do not take more themselves."""
    ex = report.exercise
    failing = report.status == "fail"
    label = ex.kind.label
    lines = [f"{ex.number:02d} {ex.name}: {ex.title} ({report.path})"]
    if report.message:
        lines += ["", *_message(report.message, "  ")]
    shorts = [_short(case, label) for case in report.cases]
    said: set = set()               # the diagnoses of the wrong arrays shown above
    for k, case in enumerate(report.cases):
        wrong = [a for a in case.arrays if not a.ok]
        seen = {a.diagnosis for a in wrong}
        room = LINES - 1 - len(lines) - sum(len(s) for s in shorts[k + 1:]) if failing \
            else math.inf
        if case.problem or failing and case.ok:
            lines += shorts[k]
            continue
        if failing and wrong and None not in seen and seen <= said and not case.changed:
            names = _group_label([a.name for a in wrong], [a.name for a in case.arrays], label)
            lines += _wrapped(f"{case.name}: {names} wrong, as above", 2)
            continue
        head, remarks = _wrapped(_head(case), 2), _remarks(case, with_confirmed=True)
        if room - len(head) - len(remarks) < 4:           # not even one array's lines
            lines += shorts[k]
            continue
        shown = _arrays(case, label, ex.kind.reference, room - len(head) - len(remarks))
        if not shown:
            lines += shorts[k]
            continue
        said |= seen
        lines += head + shown + remarks
    verdict = {"pass": "passed", "fail": "failed", "not written": "not written yet",
               "error": "could not run", "cancelled": "cancelled"}[report.status]
    lines.append(f"{ex.name}: {verdict} ({report.seconds:.1f} s)")
    return "\n".join(lines)
