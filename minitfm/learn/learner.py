"""The learner's side: their file read (its bytes, its text as UTF-8, which of its functions
still hold the TODO, read without running it), run in place of the library's code (loaded, its
errors at its own lines, its functions put in the library's modules for a while, in memory
only), and the library's functions recorded as they are called. Host-only code."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path

from minitfm import files
from minitfm.data import reading
from minitfm.learn import source
from minitfm.learn.exercise import Exercise

__all__ = ["NotUTF8", "bytes_of", "text_of", "unwritten", "unwritten_text", "undefined",
           "LearnerError", "NotWritten", "location", "where_in", "load", "substituted",
           "functions_of", "defined_in", "lookup", "not_written", "unwritten_name", "recorders"]


# ---- the file, read ----------------------------------------------------------------------

class NotUTF8(SyntaxError):
    """The learner's file is not UTF-8 text (saved as UTF-16 by an editor, or in an 8-bit
    encoding): a ``SyntaxError``, as Python's own for such a source, whose message says what
    the file seems to be and how to save it."""


def bytes_of(path: Path) -> bytes:
    """The bytes of the learner's file ``path``; a read the disk fails is a
    ``files.ReadError`` (an I/O error: the file not judged), never taken for its contents, and
    a named pipe or a device there a ``DataError``, never waited on."""
    kind = files.kind_of(path)
    if kind is not None:                        # a pipe would be waited on
        raise reading.DataError(f"{path} is {kind}, where the exercise's file should be: move "
                                f"it aside and start the exercise again")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        files.raise_if_read_failed(path, exc)
        raise


def text_of(path: Path) -> str:
    """The text of the learner's file ``path``: UTF-8, a byte-order mark dropped; a file in
    UTF-16 or UTF-32 (``reading.wide_encoding``) or with a line that is not UTF-8 raises
    :class:`NotUTF8`, naming the file, the line and the fix."""
    path = Path(path)
    data = bytes_of(path)
    wide = reading.wide_encoding(data[:reading.HEAD_BYTES])
    fix = "save it as UTF-8 (the encoding setting of your editor's Save As)"
    if wide is not None:
        encoding, evidence = wide
        raise NotUTF8(f"{encoding} text, not UTF-8 ({evidence}): {fix}, or "
                      f"convert it (iconv -f {encoding} -t UTF-8 {path.name} > utf8.py && mv "
                      f"utf8.py {path.name})", (str(path), 1, 1, ""))
    if data.startswith(reading.UTF8_BOM):
        data = data[len(reading.UTF8_BOM):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise NotUTF8(f"not UTF-8 ({exc.reason} at byte {exc.start + 1} of the file): {fix}",
                      (str(path), line, 1, "")) from None


def unwritten(path: Path, names: tuple[str, ...]) -> list[str]:
    """Which of the functions ``names`` in the exercise file ``path`` still hold the TODO's
    raise (read, not run: a file that does not parse, or is not UTF-8, raises SyntaxError)."""
    return unwritten_text(text_of(path), names, str(path))


def unwritten_text(text: str, names: tuple[str, ...], filename: str = "<exercise>") -> list[str]:
    """:func:`unwritten` of an exercise file's text."""
    tree = ast.parse(text, filename=filename)
    left = []
    for name in names:
        try:
            fn = source.find_definition(tree, name)
        except LookupError:
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                    and getattr(node.exc.func, "id", "") == "NotImplementedError" \
                    and any(isinstance(a, ast.Constant) and a.value == source.TODO
                            for a in node.exc.args):
                left.append(name)
                break
    return left


def undefined(path: Path, names: tuple[str, ...]) -> list[str]:
    """Which of the functions ``names`` (``name`` or ``Class.method``) the exercise file
    ``path`` does not define (read, not run: SyntaxError as :func:`unwritten`)."""
    tree = ast.parse(text_of(path), filename=str(path))
    missing = []
    for name in names:
        try:
            source.find_definition(tree, name)
        except LookupError:
            missing.append(name)
    return missing



# ---- the file, run -----------------------------------------------------------------------

class LearnerError(Exception):
    """The learner's file could not be run: the message says where (its line) and what."""


def location(exc: BaseException, path) -> str:
    """Where in the learner's file an exception came from (the last frame there), with the
    line's text: ``"01_linear.py, line 52, in backward:\n    dx = ..."``; "" where no frame
    is theirs."""
    path = Path(path).resolve()
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if Path(f.filename).resolve() == path]
    if not frames:
        return ""
    f = frames[-1]
    return f"{path.name}, line {f.lineno}, in {f.name}:\n    {(f.line or '').strip()}"


def where_in(exc: BaseException, path: Path) -> str:
    """An exception as the learner should see it: the line of their file it came from (the
    last frame there), then the error; no frames of the library."""
    what = f"{type(exc).__name__}: {exc}"
    where = location(exc, path)
    return f"{where}\n{what}" if where else what


def load(path: Path, name: str):
    """The learner's file as a fresh module (``LearnerError`` with its line if it does not
    compile or its top level fails)."""
    path = Path(path)
    try:
        code = compile(text_of(path), str(path.resolve()), "exec")
    except SyntaxError as exc:
        line = (exc.text or "").rstrip("\n")
        raise LearnerError(f"{path.name}, line {exc.lineno}: {exc.msg}\n    {line.strip()}") \
            from None
    module_name = f"minitfm_workshop_{name}"
    spec = importlib.util.spec_from_loader(module_name, loader=None, origin=str(path))
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path.resolve())
    sys.modules[module_name] = module          # NamedTuple and dataclasses look it up
    try:
        exec(code, module.__dict__)
    except Exception as exc:
        raise LearnerError(where_in(exc, path)) from None
    return module


@contextlib.contextmanager
def substituted(module, functions: dict):
    """``module``'s attributes ``functions`` (name -> function) set for the block, then put
    back: in memory only."""
    old = {name: getattr(module, name) for name in functions}
    try:
        for name, fn in functions.items():
            setattr(module, name, fn)
        yield
    finally:
        for name, fn in old.items():
            setattr(module, name, fn)


class NotWritten(LookupError):
    """A function to write that the learner's file does not define itself (an empty file, a
    deleted function, a name imported from the library): the message says which."""


def defined_in(fn, path) -> bool:
    """Whether function ``fn`` was defined in the file ``path`` (not imported into it)."""
    code = getattr(fn, "__code__", None)
    return code is not None and Path(code.co_filename).resolve() == Path(path).resolve()


def lookup(module, dotted: str):
    """``module``'s ``name`` or ``Class.method`` (a method of the class's own), or None."""
    target = module
    for i, part in enumerate(dotted.split(".")):
        scope = vars(target) if i and isinstance(target, type) else None
        target = scope.get(part) if scope is not None else getattr(target, part, None)
        if target is None:
            return None
    return target


def functions_of(ex: Exercise, learner, path) -> dict:
    """The learner's functions that stand in for the library's: those to write (each must be
    defined in their file, else :class:`NotWritten`) and the kept functions (the forward
    passes) where the file has them; not classes, not methods."""
    for name in ex.write:
        if not defined_in(lookup(learner, name), path):
            raise NotWritten(f"{Path(path).name} does not define {name}: it is not written "
                             f"(`python -m minitfm.learn reset {ex.name}` gives a fresh copy)")
    names = [n for n in (*ex.write, *ex.keep) if "." not in n]
    return {n: getattr(learner, n) for n in names
            if callable(getattr(learner, n, None)) and not isinstance(getattr(learner, n), type)}


def not_written(exc: BaseException) -> bool:
    """Whether an exception is the TODO's raise of a function not written yet."""
    return isinstance(exc, NotImplementedError) and source.TODO in str(exc)


def unwritten_name(exc: BaseException, ex: Exercise) -> str:
    """Which of the exercise's functions raised the TODO (all of them, if no frame says)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.name in {w.split(".")[-1] for w in ex.write}:
            return frame.name
    return ", ".join(ex.write)


def recorders(library, names, tag=lambda: None) -> tuple[dict, dict]:
    """The library's functions ``names`` wrapped to keep every call: ``(functions, seen)``,
    ``functions`` to put in the library's module (:func:`substituted`), ``seen`` filled with
    name -> [(``tag()`` at the call, the call's arguments by name with the defaults, its
    result)], in the order of the calls."""
    seen: dict = {}

    def recorder(name, fn):
        def run(*args, **kwargs):
            bound = inspect.signature(fn).bind(*args, **kwargs)
            bound.apply_defaults()
            arguments, mark = dict(bound.arguments), tag()
            result = fn(*args, **kwargs)
            seen.setdefault(name, []).append((mark, arguments, result))
            return result
        return run
    return {n: recorder(n, getattr(library, n)) for n in names}, seen
