"""Reading a callable's parameters, from its signature or, for a compiled (Cython) function,
from the first line of its docstring, so that the CuPy double's can be compared with CuPy's
(tests/test_cupy_conformance.py)."""

from __future__ import annotations

import inspect
import re

NO_DEFAULT = "<required>"


def default_text(value) -> str:
    if value is inspect.Parameter.empty:
        return NO_DEFAULT
    if isinstance(value, type):
        return value.__name__ if value.__module__ == "builtins" else f"numpy.{value.__name__}"
    return repr(value)


def split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return parts + ([current] if current.strip() else [])


def doc_parameters(doc: str) -> list[tuple[str, str]]:
    """Parameters from the first line of a Cython docstring (``embedsignature``):
    ``_ndarray_base.sum(self, axis=None, dtype=None, out=None, keepdims=False) -> ...``; Cython
    types (``int axis=-1``, ``_ndarray_base b``) are dropped, ``u'C'`` read as ``'C'``."""
    first = doc.strip().splitlines()[0].replace("\\*", "*")
    match = re.match(r"^[\w.]+\((.*)\)(\s*->.*)?$", first)
    assert match, f"no signature in the docstring line {first!r}"
    result = []
    for part in split_top_level(match.group(1)):
        part = part.strip()
        if part in ("/", "self", ""):
            continue
        if part.startswith("**") or part.startswith("*"):
            result.append((part.split()[-1], "*"))
            continue
        head, eq, default = part.partition("=")
        name = head.split()[-1]
        if eq:
            default = re.sub(r"^u'", "'", default.strip())
            default = {"float": "float"}.get(default, default)
        result.append((name, default if eq else NO_DEFAULT))
    return result


def parameters(function) -> list[tuple[str, str]]:
    """``(name, default)`` of each parameter, ``self`` and positional-only markers left out;
    ``*args``, ``**kwargs`` and the keyword-only marker ``*`` as ``(name, "*")``."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return doc_parameters(function.__doc__ or "")
    result, star = [], False
    for p in signature.parameters.values():
        if p.name == "self":
            continue
        if p.kind is p.VAR_POSITIONAL:
            result.append(("*" + p.name, "*"))
            star = True
        elif p.kind is p.VAR_KEYWORD:
            result.append(("**" + p.name, "*"))
        else:
            if p.kind is p.KEYWORD_ONLY and not star:
                result.append(("*", "*"))
                star = True
            result.append((p.name, default_text(p.default)))
    return result


def same_parameters(mine, theirs, what: str) -> list[str]:
    a, b = parameters(mine), parameters(theirs)
    return [] if a == b else [f"{what}: the double has {a}, CuPy has {b}"]
