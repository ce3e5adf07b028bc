"""What an exercise file tells the learner is right: each TODO describes the call their code
gets (the backward pass's, with its outputs, and what ``out`` is in a model), in rows whose
columns line up, with numbers and types as a reader writes them; a file made with ``--hard``
points at nothing it left out; and no exercise's file holds another exercise's solution."""

import ast
import difflib
import functools
import inspect
import re

import pytest

from minitfm.learn import kernels, source
from minitfm.learn.exercises import EXERCISES, by_name, make
from minitfm.learn.kinds import KERNEL, LAYER

PYTHON = [e for e in EXERCISES if e.kind is not KERNEL]
LAYERS = [e for e in EXERCISES if e.kind is LAYER]
BOTH = [(ex, hard) for ex in EXERCISES for hard in (False, True)]


def _id(pair) -> str:
    ex, hard = pair
    return ex.name + (" --hard" if hard else "")


@functools.lru_cache(maxsize=None)
def made(name: str, hard: bool = False) -> str:
    return make(by_name(name), hard)


def todos(text: str) -> dict[str, list[str]]:
    """The TODOs of an exercise file, each line without its comment's "# ", by the function
    each says to write (by its first line where it does not say "write NAME")."""
    found, block = {}, None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# TODO:"):
            words = stripped.split()
            key = words[3].rstrip(".") if words[2] == "write" else stripped
            block = found.setdefault(key, [])
        elif block is not None and not stripped.startswith("#"):
            block = None
        if block is not None:
            block.append(stripped[2:])
    return found


def columns(line: str) -> list[int]:
    """Where the fields of a row start: its first character, and each after two spaces or
    more."""
    return [m.start(1) for m in re.finditer(r"(?:^ *| {2,})(\S)", line)]


def rows(todo: list[str]) -> dict[str, tuple[str, str]]:
    """A TODO's rows by name: (value, words), the words of the lines under a row joined."""
    found, last = {}, None
    words_at = min((c[2] for c in map(columns, todo) if len(c) > 2), default=None)
    for line in todo:
        if not line.startswith("  "):
            last = None
        elif words_at is not None and columns(line)[0] >= words_at and last:
            value, words = found[last]
            found[last] = (value, f"{words} {line.strip()}")
        else:
            name, value, *words = re.split(r" {2,}", line.strip())
            last = name
            found[name] = (value, " ".join(words))
    return found


# ---- what a TODO says ----------------------------------------------------------------------------

def test_the_output_todo_describes_the_backward_call():
    todo = todos(made("output"))["forward_backward"]
    found = rows(todo)
    assert found["dloss"][0] == "0-d array" and "Given" in found["dloss"][1]
    assert "and returns ((loss_sum, nll_sum), dh, grads):" in todo
    assert found["dh"][0] == "(11, 6)" and "gradient of h" in found["dh"][1]
    assert found['["table"]'][0] == "(7, 6)" and '{"table": dE}' in found["grads"][1]
    assert found["h"][1].startswith("the decoder's output"), "h is the input, not a gradient"


def test_the_model_todo_says_every_gradient_is_written_into_out():
    todo = todos(made("model"))["stacks_backward"]
    value, words = rows(todo)["out"]
    assert value.startswith("dict, ") and value.endswith(" arrays")
    assert "write every gradient into it" in words
    assert "out[tgt_name] holds the output projection's gradient already" in words
    assert "and returns None: every gradient is written into out." in todo
    assert "leave it" not in " ".join(todo)


@pytest.mark.parametrize("ex", LAYERS, ids=lambda e: e.name)
def test_a_layer_todo_says_what_out_is_in_a_model(ex):
    for function, todo in todos(made(ex.name)).items():
        found = rows(todo)
        if "out" not in found:
            continue
        value, words = found["out"]
        assert value == "None" and words.startswith("None in the check"), (function, words)
        assert "In a model" in words and "minitfm/layers/__init__.py" in words, words
        if ex.name in ("embedding", "inputs"):
            assert "add the" in words and "exception" in words, words


def test_a_todo_names_what_each_call_returns():
    residual = rows(todos(made("residual"))["backward"])
    assert residual["dx"][0] == "(3, 5, 6)" and residual["rest"][0] == "dict, 1 array"
    assert residual['["gamma"]'][0] == "(6,)"
    assert rows(todos(made("softmax"))["backward"])["ds"][0] == "(3, 4, 5, 6)"
    assert "the ids are integers" in rows(todos(made("embedding"))["backward"])["None"][1]


@pytest.mark.parametrize("pair", BOTH, ids=_id)
def test_the_rows_of_a_todo_line_up(pair):
    ex, hard = pair
    for function, todo in todos(made(ex.name, hard)).items():
        row_lines = [line for line in todo if line.startswith("  ")]
        if not row_lines:           # words alone (Adam's)
            continue
        starts = [columns(line) for line in row_lines]
        value_at = {c[1] for c in starts if len(c) > 1}
        words_at = {c[2] for c in starts if len(c) > 2}
        assert len(value_at) == 1 and len(words_at) <= 1, (function, row_lines)
        assert not [c for c in starts if len(c) > 3], (function, row_lines)
        under = [line for c, line in zip(starts, row_lines) if len(c) == 1]
        assert all(columns(line)[0] == min(words_at) for line in under), (function, under)


def _shown(ex, text: str) -> str:
    """What the workshop writes of its own in an exercise file: the TODOs, or a kernel's
    head."""
    if ex.kind is KERNEL:
        lines = text.splitlines()
        return "\n".join(lines[:next(k for k, line in enumerate(lines)
                                      if not line.startswith("//"))])
    return "\n".join(line for todo in todos(text).values() for line in todo)


@pytest.mark.parametrize("pair", BOTH, ids=_id)
def test_numbers_and_types_read_as_a_reader_writes_them(pair):
    ex, hard = pair
    shown = _shown(ex, made(ex.name, hard))
    for number in re.findall(r"(?<![\w.])\d+\.\d+", shown):
        digits = number.replace(".", "").lstrip("0")
        assert len(digits) <= 6, f"{number}: more digits than a reader reads"
    assert not re.search(r"DType|dtype\(|<class|numpy\.", shown), shown


# ---- --hard -------------------------------------------------------------------------------------

# every "above" and "below" that a --hard file keeps, with the text it points at
POINTERS = {
    ("feedforward", "see below"): "ReLU dropout (fairseq's",
    ("attention", "see below"): "Attention dropout (Tensor2Tensor's",
    ("attention", "as above"): "``p_drop``, ``rng``:",
    ("encoder", "names as above"): "Parameter names, relative to the stack",
    ("decoder_only", "see above"): "the encoder stack's,",
}
# words by which a text points at another (the header says what --hard left out)
POINTING = re.compile(r"\b(above|below|derivation|docstring)\b|\bthe equation\b(?! \()", re.I)


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.name)
def test_a_todo_stands_alone_in_both_modes(ex):
    easy, hard = made(ex.name), made(ex.name, True)
    assert _shown(ex, easy) == _shown(ex, hard)
    assert not POINTING.search(_shown(ex, easy)), POINTING.search(_shown(ex, easy))


def _removed(ex) -> list[str]:
    """The lines of the exercise's file that --hard leaves out."""
    easy, hard = made(ex.name).splitlines(), made(ex.name, True).splitlines()
    matcher = difflib.SequenceMatcher(None, easy, hard, autojunk=False)
    return [line for tag, i, j, _, _ in matcher.get_opcodes() if tag in ("delete", "replace")
            for line in easy[i:j]]


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.name)
def test_hard_leaves_out_the_derivation_alone(ex):
    """What --hard removes is the derivation: the docstring's backward formulas, the docstrings
    of the functions to write, and a kernel's notes."""
    if ex.kind is KERNEL:
        derivation = set()
    else:
        derivation = {line.strip() for line in source.derivation(ex.module)}
        for name in ex.write:
            fn = ast.parse(source.plain_source(ex.module, name)).body[0]
            if source.is_docstring(fn.body[0]):
                derivation |= {line.strip() for line in
                               ast.get_source_segment(source.plain_source(ex.module, name),
                                                      fn.body[0]).splitlines()}
    for line in _removed(ex):
        assert (not line.strip() or line.strip() in derivation or line.startswith("//")
                or line.startswith("# (") and "(--hard)" not in line), line


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.name)
def test_a_hard_file_points_at_nothing_it_left_out(ex):
    text = made(ex.name, True)
    assert not re.search(r"^\s*(Backward\b|backward:)", text, re.M), "a derivation is left"
    lines = text.splitlines()
    for k, line in enumerate(lines[3:], start=3):
        for match in re.finditer(r"\b(above|below)\b", line):
            pointers = [(p, target) for (name, p), target in POINTERS.items()
                        if name == ex.name and p in line]
            assert len(pointers) == 1, f"{ex.name}, line {k + 1}: {line.strip()!r} points " \
                                       f"at something: add it to POINTERS with what it names"
            target = pointers[0][1]
            where = "\n".join(lines[:k] if match.group(1) == "above" else lines[k + 1:])
            assert target in where, f"{ex.name}: {line.strip()!r} points at text left out"
    for label in re.findall(r"\bequation \((\d+)\)", text):
        assert re.search(rf"\({label}\)\s*$", text, re.M), f"equation ({label}) is not there"


# ---- no file holds another exercise's solution ---------------------------------------------------

def _body(code: str) -> list[str]:
    """A function's lines after its signature and docstring."""
    fn = ast.parse(code).body[0]
    first = fn.body[1] if source.is_docstring(fn.body[0]) and len(fn.body) > 1 else fn.body[0]
    return code.splitlines()[first.lineno - 1:]


@functools.lru_cache(maxsize=None)
def solution(name: str) -> frozenset:
    """The lines of the library's code an exercise's learner writes (the bodies of its
    functions, or its kernel's), longer than a few characters and found nowhere else in its
    module."""
    ex = by_name(name)
    if ex.kind is KERNEL:
        kernel = kernels.kernel_of(ex)
        body = kernels.body_of(kernel.source, kernel.name)
        lines, elsewhere = body.splitlines(), kernel.source.replace(body, "")
    else:
        lines = [line for w in ex.write for line in _body(source.plain_source(ex.module, w))]
        elsewhere = source.module_source(ex.module)
        for w in ex.write:
            elsewhere = elsewhere.replace(source.plain_source(ex.module, w).strip(), "")
    others = {line.strip() for line in elsewhere.splitlines()}
    return frozenset(line.strip() for line in lines
                     if len(line.strip()) > 12 and line.strip() not in others)


@functools.lru_cache(maxsize=None)
def its_own(name: str) -> frozenset:
    """The lines an exercise's file may hold as the library has them: its module's (a kernel's:
    its source, its twin and what the twin calls) but the code any exercise writes."""
    ex = by_name(name)
    if ex.kind is KERNEL:
        kernel = kernels.kernel_of(ex)
        text = "\n".join([kernel.source.replace(kernels.body_of(kernel.source, kernel.name), ""),
                          inspect.getsource(kernel.twin),
                          *[source.plain_source(ex.module, name) for name in ex.keep]])
    else:
        text = source.module_source(ex.module)
    for other in PYTHON:
        if other.module == ex.module:
            for w in other.write:
                text = text.replace(source.plain_source(other.module, w).strip(), "")
    return frozenset(line.strip() for line in text.splitlines())


def _lines(text: str) -> set[str]:
    """An exercise file's lines, stripped, code shown in a comment as code."""
    return {re.sub(r"^(//|#)\s*", "", line.strip()) for line in text.splitlines()}


@pytest.mark.parametrize("pair", BOTH, ids=_id)
def test_no_file_holds_another_exercises_solution(pair):
    """A line of another's solution that the file's own module has too (``xp = backend.xp``)
    is the module's."""
    ex, hard = pair
    text = made(ex.name, hard)
    held = _lines(text) - its_own(ex.name)
    for other in EXERCISES:
        if other is not ex:
            assert solution(other.name), other.name
            leaked = sorted(line for line in solution(other.name) if line in held)
            assert not leaked, f"{ex.filename} holds exercise {other.number:02d}'s " \
                               f"({other.name}) solution: {leaked[:3]}"
