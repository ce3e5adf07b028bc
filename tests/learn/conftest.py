"""What the workshop's tests share: an exercise written into a folder of the test's own, as the
library writes it, with mistakes planted where asked."""

import ast
import textwrap

import pytest

from minitfm.learn import kernels, source
from minitfm.learn.exercises import make
from minitfm.learn.kinds import KERNEL
from minitfm.learn.workshop import Workshop


def write_exercise(folder, ex, edits=None, text=None):
    """The exercise ``ex`` in ``folder`` (a workshop), its functions written with the library's
    code, ``edits`` (function -> [(old, new)]) planted in it; its path."""
    workshop = Workshop(folder)
    path = workshop.file(ex)
    if not path.exists():
        workshop.start(ex)
    text = text if text is not None else make(ex)
    if ex.kind is KERNEL:
        kernel = kernels.kernel_of(ex)
        body = kernels.body_of(kernel.source, kernel.name)
        for old, new in (edits or {}).get(kernel.name, []):
            assert body.count(old) == 1, old
            body = body.replace(old, new)
        path.write_text(with_body(text, kernel.name, body), encoding="utf-8")
    else:
        path.write_text(filled(text, ex.module, ex.write, edits), encoding="utf-8")
    return path


def filled(text: str, module: str, write: tuple[str, ...], edits: dict | None = None) -> str:
    """An exercise file's ``text`` with the functions ``write`` written as the library writes
    them (``edits``: function -> (old, new) pairs applied to its code first): what a learner
    who wrote the library's code would have."""
    for name in write:
        tree, lines = ast.parse(text), text.splitlines()
        fn = source.find_definition(tree, name)
        start = min([d.lineno for d in fn.decorator_list] + [fn.lineno])
        code = source.plain_source(module, name)
        for old, new in (edits or {}).get(name, []):
            if code.count(old) != 1:
                raise LookupError(f"{module}.{name} has {code.count(old)} copies of {old!r}")
            code = code.replace(old, new)
        lines[start - 1:fn.end_lineno] = textwrap.indent(code, " " * fn.col_offset).splitlines()
        text = "\n".join(lines) + "\n"
    return text


def with_body(text: str, name: str, body: str) -> str:
    """A ``.cu`` file's ``text`` with the body of kernel ``name`` replaced by ``body`` (between
    its braces)."""
    _, open_, close = kernels.kernel_span(text, name)
    return text[:open_] + body + text[close:]


@pytest.fixture
def folder(tmp_path, numpy_backend):
    return tmp_path / "workshop"
