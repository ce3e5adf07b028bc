"""A kernel's CUDA C source read as text, every index and line kept: comments and strings
blanked to spaces of the same length, brackets matched, top-level lists split, edits made by
span. What :mod:`minitfm.cudahost.rewrite` and :mod:`minitfm.cudahost.refused` read the source
with. Host-only code (it reads text)."""

from __future__ import annotations

import re

__all__ = ["Unsupported", "blank_comments", "line_of", "matching", "blank_strings",
           "split_top", "edited"]


class Unsupported(ValueError):
    """The source uses something the host execution does not model (the message names it)."""


def blank_comments(source: str) -> str:
    """``source`` with every comment replaced by spaces (newlines kept), strings left alone."""
    out, i, n = [], 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            j = source.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif source.startswith("/*", i):
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", source[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and source[j] != c:
                j += 2 if source[j] == "\\" else 1
            out.append(source[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def line_of(text: str, at: int) -> int:
    """The line, from 1, of index ``at`` of ``text``."""
    return text.count("\n", 0, at) + 1


def matching(text: str, opening: int, pair: str = "()") -> int:
    """The index of the parenthesis (``pair``: the two characters) that closes the one at
    ``opening``."""
    depth = 0
    for i in range(opening, len(text)):
        if text[i] == pair[0]:
            depth += 1
        elif text[i] == pair[1]:
            depth -= 1
            if depth == 0:
                return i
    what = "a parenthesis" if pair == "()" else f"a {pair[0]}"
    raise Unsupported(f"line {line_of(text, opening)}: {what} is never closed")


def blank_strings(text: str) -> str:
    """``text`` (comments already blank) with what every string and character literal holds
    replaced by spaces: the same length, so that an index found in it is one in ``text``."""
    return re.sub(r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'""",
                  lambda m: m.group(0)[0] + " " * (len(m.group(0)) - 2) + m.group(0)[-1], text)


def split_top(text: str, start: int, end: int, separator: str) -> list[tuple[int, int]]:
    """The spans of ``text[start:end]`` between the ``separator``s outside any brackets."""
    spans, depth, last = [], 0, start
    for i in range(start, end):
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == separator and depth == 0:
            spans.append((last, i))
            last = i + 1
    return spans + [(last, end)]


def edited(text: str, edits: list[tuple[int, int, str]]) -> str:
    """``text`` with each ``(start, end, new)`` of ``edits`` made (spans that do not overlap;
    an insertion is a span of no characters)."""
    out, last = [], 0
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1])):
        out += [text[last:start], new]
        last = end
    return "".join(out) + text[last:]
