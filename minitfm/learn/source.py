"""An exercise made from the library's own source: a module's text with some function bodies
blanked, and the pieces the workshop shows (a function's plain source, a docstring's
derivation). Host-only code: it reads and writes text.

What an exercise file keeps of its module, in the module's order: the docstring (with ``hard``
without the derivation of the backward pass, and without its pointer to the module's fast paths
in ``minitfm/speed/``, which are not part of an exercise), the imports the kept code uses, and
the top-level definitions that the functions to write and the forward passes beside them need,
found by following the names they use. A function to write keeps its signature (and, unless
``hard``, its docstring); its body becomes a TODO that names every input, cache field and output
with its shape, then ``raise NotImplementedError(TODO)``, so an untouched exercise says that it
is not written.
"""

from __future__ import annotations

import ast
import importlib
import numbers
import re
import textwrap
from pathlib import Path

__all__ = ["TODO", "module_source", "blanked", "plain_source", "derivation", "find_definition",
           "is_docstring", "number"]

TODO = "not written yet: replace this line with your code"
# where a docstring points at its module's fast paths: an exercise has the plain code alone
SPEED = re.compile(r"\bminitfm[./]speed\b")
DERIVATION_HEADS = ("Backward", "Backward:")


def module_source(module: str) -> str:
    """The text of a module of the library (``minitfm.layers.layernorm``)."""
    return Path(importlib.import_module(module).__file__).read_text(encoding="utf-8")


def number(value) -> str:
    """A number as an exercise shows it: an integer whole, a real to five significant digits
    (1.4286; 0.1 for float32's 0.100000001), a truth value as Python writes it."""
    if isinstance(value, bool) or type(value).__name__ in ("bool", "bool_"):
        return str(bool(value))
    if isinstance(value, numbers.Integral):
        return str(int(value))
    return f"{float(value):.5g}"


def _paragraphs(text: str) -> list[str]:
    return re.split(r"\n[ \t]*\n", text.strip("\n"))


def docstring_for_exercise(doc: str, hard: bool) -> str:
    """A module docstring without the paragraph that points at its fast paths (in
    ``minitfm/speed/``), and with ``hard`` without the derivation of the backward pass."""
    paragraphs = [p for p in _paragraphs(doc) if not SPEED.search(p)]
    if hard:
        paragraphs = _without_derivation(paragraphs)
    return "\n\n".join(p for p in paragraphs if p.strip())


def _without_derivation(paragraphs: list[str]) -> list[str]:
    """The paragraphs without the derivation: a paragraph that starts with "Backward" and the
    indented ones after it (but its closing prose on something else), and the backward lines
    of a paragraph that gives both passes."""
    kept, dropping = [], False
    for paragraph in paragraphs:
        starts = paragraph.lstrip("\n")
        if not starts[:1].isspace():
            dropping = starts.startswith(DERIVATION_HEADS)
            if dropping:
                kept.append(_closing_prose(paragraph))
                continue
        if not dropping:
            kept.append(_without_backward_lines(paragraph))
    return kept


# words of the backward pass: prose that closes a derivation and speaks of them is part of it
BACKWARD_WORDS = re.compile(r"backward|gradient|jacobian|derivative|\bd\w+/d", re.I)


def _closing_prose(paragraph: str) -> str:
    """The prose that closes a derivation paragraph after its formulas, where it speaks of
    something else (attention's: "Attention dropout (...) zeroes whole weights", to which the
    forward formulas point with "see below"); "" where there is none, where it goes on with a
    sentence of the derivation, or where it speaks of the backward pass."""
    lines = paragraph.strip("\n").splitlines()
    indented = [i for i, line in enumerate(lines) if line[:1].isspace()]
    tail = lines[(indented[-1] if indented else 0) + 1:]
    text = " ".join(line.strip() for line in tail)
    if not text or not text[0].isupper() or BACKWARD_WORDS.search(text):
        return ""
    return "\n".join(tail)


def _backward_line(line: str) -> bool:
    """Whether a line inside a paragraph starts the backward pass's formulas ("Backward: ...",
    or "backward: ..." under a forward formula)."""
    text = line.lstrip()
    return text.startswith(DERIVATION_HEADS) or text.startswith("backward:")


def _without_backward_lines(paragraph: str) -> str:
    """A paragraph that mixes the forward and backward formulas (a backward line inside it, as
    :func:`_backward_line` says), cut before the backward ones."""
    lines = paragraph.splitlines()
    for i, line in enumerate(lines):
        if i and _backward_line(line):
            return "\n".join(lines[:i]).rstrip()
    return paragraph


def derivation(module: str) -> list[str]:
    """The derivation's lines in a module's docstring: the paragraph that starts with
    "Backward" and the indented lines under it ([] when there is none)."""
    doc = ast.get_docstring(ast.parse(module_source(module))) or ""
    found, inside = [], False
    for paragraph in _paragraphs(doc):
        at_margin = not paragraph[:1].isspace()
        if at_margin:
            inside = paragraph.startswith(DERIVATION_HEADS)
            if not inside:
                for k, line in enumerate(paragraph.splitlines()):   # "Backward:" inside one
                    if k and _backward_line(line):
                        found += paragraph.splitlines()[k:]
                        break
        if inside:
            found += paragraph.splitlines()
    return found


# ---- following names --------------------------------------------------------------------------

def _defined(node: ast.stmt) -> set[str]:
    """The top-level names a statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    names = set()
    targets = node.targets if isinstance(node, ast.Assign) else \
        [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
    for target in targets:
        names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _used(node: ast.AST) -> set[str]:
    """The names a definition reads, outside its annotations."""
    skip: set[int] = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for a in [*n.args.args, *n.args.kwonlyargs, *n.args.posonlyargs,
                      n.args.vararg, n.args.kwarg]:
                if a is not None and a.annotation is not None:
                    skip |= {id(x) for x in ast.walk(a.annotation)}
            if n.returns is not None:
                skip |= {id(x) for x in ast.walk(n.returns)}
        if isinstance(n, ast.AnnAssign) and not isinstance(node, ast.ClassDef):
            skip |= {id(x) for x in ast.walk(n.annotation)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in skip}


def _kept(tree: ast.Module, roots: set[str], borrow: tuple[str, ...] = ()) -> list[ast.stmt]:
    """The module's top-level statements that the definitions ``roots`` need, in order
    (``borrow``: names not followed, imported from the library instead)."""
    body = [n for n in tree.body if not is_docstring(n) and not _is_future(n)]
    by_name: dict[str, list[ast.stmt]] = {}
    for node in body:
        for name in _defined(node) - set(borrow):
            by_name.setdefault(name, []).append(node)
    keep: set[int] = set()
    todo = [node for name in roots for node in by_name.get(name, [])]
    if len(todo) < len(roots):
        missing = sorted(r for r in roots if r not in by_name)
        raise LookupError(f"no top-level definition of {', '.join(missing)}")
    while todo:
        node = todo.pop()
        if id(node) in keep:
            continue
        keep.add(id(node))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        for name in _used(node):
            todo += [n for n in by_name.get(name, []) if id(n) not in keep]
    kept = [n for n in body if id(n) in keep]
    used = set().union(*(_used(n) for n in kept if not isinstance(n, (ast.Import,
                                                                       ast.ImportFrom))))
    return [_pruned_import(n, used) if isinstance(n, (ast.Import, ast.ImportFrom)) else n
            for n in kept if not isinstance(n, (ast.Import, ast.ImportFrom))
            or _pruned_import(n, used) is not None]


def _pruned_import(node, used: set[str]):
    names = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
    if not names:
        return None
    copy = ast.ImportFrom(node.module, names, node.level) if isinstance(node, ast.ImportFrom) \
        else ast.Import(names)
    return ast.copy_location(copy, node)


def is_docstring(node) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
        and isinstance(node.value.value, str)


def _is_future(node) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == "__future__"


# ---- the text -------------------------------------------------------------------------------

def _segment(lines: list[str], node: ast.AST) -> str:
    """A definition's source lines, its decorators first."""
    return "\n".join(lines[_decorator_start(node) - 1:node.end_lineno])


def find_definition(tree: ast.Module, dotted: str):
    """The definition ``name`` or ``Class.method`` of a module's tree."""
    scope: list = tree.body
    node = None
    for part in dotted.split("."):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            raise LookupError(f"no definition {dotted!r}")
        scope = node.body
    return node


def _blank_body(lines: list[str], fn: ast.FunctionDef, todo_lines: list[str],
                keep_doc: bool) -> str:
    """A function's source with its body replaced by ``todo_lines`` and a raise."""
    first = fn.body[0]
    has_doc = is_docstring(first)
    head_end = (first.end_lineno if has_doc and keep_doc else first.lineno - 1)
    head = lines[fn.lineno - 1:head_end]
    if has_doc and not keep_doc:
        head = lines[fn.lineno - 1:first.lineno - 1]
    indent = " " * (first.col_offset)
    body = [indent + "# " + t if t else indent + "#" for t in todo_lines]
    body.append(f"{indent}raise NotImplementedError({TODO!r})")
    return "\n".join(head + body)


def blanked(module: str, write: tuple[str, ...], keep: tuple[str, ...] = (), *,
            hard: bool = False, todos: dict | None = None, header: str = "",
            borrow: tuple[str, ...] = ()) -> str:
    """The exercise file of ``module``: ``write`` (function names, or ``Class.method``) blanked,
    ``keep`` (the forward passes and what goes with them) kept whole, with what both need
    (see the module's docstring). ``todos``: for each of ``write``, the TODO's lines;
    ``borrow``: names imported from the library, not copied."""
    text = module_source(module)
    tree, lines = ast.parse(text), text.splitlines()
    roots = {w.split(".")[0] for w in (*write, *keep)}
    out = [header.rstrip("\n")] if header else []
    doc = ast.get_docstring(tree, clean=False)
    if doc:
        out.append('"""' + docstring_for_exercise(doc, hard) + '\n"""\n')
    out.append("from __future__ import annotations")
    if borrow:
        out.append(f"from {module} import {', '.join(borrow)}  # the library's: not part of "
                   f"the exercise")
    blank = {w: find_definition(tree, w) for w in write}
    for node in _kept(tree, roots, borrow):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(ast.unparse(node))
            continue
        piece = _segment(lines, node)
        for name, fn in blank.items():
            if node.lineno <= fn.lineno and fn.end_lineno <= node.end_lineno:
                before = "\n".join(lines[_decorator_start(node) - 1:fn.lineno - 1])
                new = _blank_body(lines, fn, (todos or {}).get(name, []), keep_doc=not hard)
                after = "\n".join(lines[fn.end_lineno:node.end_lineno])
                piece = "\n".join(p for p in (before, new, after) if p)
        out.append(piece)
    text = _join(out)
    ast.parse(text)                 # what is written compiles
    return text


def _decorator_start(node) -> int:
    """The first line of a definition's decorators, or of the definition."""
    return min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])


def _join(pieces: list[str]) -> str:
    """Top-level pieces, two blank lines before a definition, one between imports."""
    out = []
    for piece in pieces:
        definition = piece.lstrip().startswith(("def ", "class ", "@"))
        if out:
            out.append("\n\n\n" if definition or out[-1].lstrip().startswith(("def ", "class "))
                       else "\n\n" if not piece.startswith(("import ", "from ")) else "\n")
        out.append(piece)
    return "".join(out) + "\n"


def plain_source(module: str, name: str) -> str:
    """The library's own code of a function (``name`` or ``Class.method``), with its
    decorators: what ``solution`` shows."""
    text = module_source(module)
    fn = find_definition(ast.parse(text), name)
    return textwrap.dedent(_segment(text.splitlines(), fn))
