"""The exercises are made from the library: every layer with a backward pass has one, every
name and gradient check an exercise names exists, every named mistake's text is the library's,
and an exercise file holds the forward pass but not the solution."""

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from minitfm.gradcheck.cases import CASES, MODEL_CASES
from minitfm.learn import kernels, learner, source
from minitfm.learn.exercises import EXERCISES, by_name, make
from minitfm.learn.kinds import KERNEL, LAYER, MODEL, OPTIM

LAYERS = Path(__file__).resolve().parents[2] / "minitfm" / "layers"
# a layer's functions that are not a backward pass of their own: forward then backward in one
# call (the loss's fast paths choose there), and the fast paths, named by their kind
NOT_EXERCISES = {"loss.forward_backward"}
FAST = ("rows_", "fused_", "loops_", "half_", "_")
FAST_PATH = re.compile(r"\b(fused\.(active|Kernel|use)|rows\.(active|compiled|chosen|map_rows|run)"
                       r"|compiled\.kernel|@paths|\.chooser)\b")


def backward_passes(path: Path) -> list[str]:
    """The public functions of a layer file whose names say they are a backward pass."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef)
            and (node.name == "backward" or node.name.endswith("_backward")
                 or node.name == "forward_backward") and not node.name.startswith(FAST)]


def test_every_layer_with_a_backward_pass_has_an_exercise():
    written = {(ex.module, name) for ex in EXERCISES for name in ex.write}
    found = []
    for path in sorted(LAYERS.glob("*.py")):
        module = f"minitfm.layers.{path.stem}"
        for name in backward_passes(path):
            if f"{path.stem}.{name}" not in NOT_EXERCISES and (module, name) not in written:
                found.append(f"{module}.{name}")
    assert not found, f"backward passes without an exercise (add one to EXERCISES): {found}"


def test_the_scan_finds_a_new_layer(tmp_path):
    new = tmp_path / "rmsnorm.py"
    new.write_text("def forward(x, p):\n    pass\n\n\ndef backward(dy, cache):\n    pass\n\n\n"
                   "def rows_backward(dy, cache):\n    pass\n")
    assert backward_passes(new) == ["backward"]


def test_every_name_an_exercise_gives_exists():
    cases = {case.name for case in [*CASES, *MODEL_CASES]}
    for ex in EXERCISES:
        module = importlib.import_module(ex.module)
        if ex.kind is KERNEL:
            assert kernels.kernel_of(ex).name == ex.write[0]
        for name in (*(ex.write if ex.kind is not KERNEL else ()), *ex.keep, *ex.borrow):
            target = module
            for part in name.split("."):
                target = getattr(target, part)
        assert set(ex.cases) <= cases, ex.name
        assert ex.kind in (LAYER, OPTIM, MODEL, KERNEL) and ex.hints, ex.name
        assert by_name(ex.name) is ex and by_name(str(ex.number)) is ex


def test_every_named_mistake_is_the_librarys_text():
    for ex in EXERCISES:
        for mistake in ex.mistakes:
            code = (kernels.kernel_of(ex).source if ex.kind is KERNEL
                    else source.plain_source(ex.module, mistake.function))
            assert code.count(mistake.old) == 1, (ex.name, mistake.old)


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.name)
def test_an_exercise_keeps_the_forward_pass_and_holds_no_solution(ex):
    text = make(ex)
    if ex.kind is KERNEL:
        kernel = kernels.kernel_of(ex)
        assert kernels.unwritten_text(text)
        solution = kernels.body_of(kernel.source, kernel.name)
        elsewhere = kernel.source.replace(solution, "")
    else:
        assert source.TODO in text and ast.parse(text).body
        for name in ex.keep:                        # kept whole, but a class with a method to write
            if not any(w.startswith(name + ".") for w in ex.write):
                assert source.plain_source(ex.module, name).splitlines()[-1].strip() in text
        solution = "\n".join(line for name in ex.write
                             for line in _body(source.plain_source(ex.module, name)))
        elsewhere = source.module_source(ex.module)
        for name in ex.write:
            elsewhere = elsewhere.replace(source.plain_source(ex.module, name).strip(), "")
        assert not FAST_PATH.search(text), FAST_PATH.search(text)
    others = {line.strip() for line in elsewhere.splitlines()}
    lines = [line.strip() for line in solution.splitlines()
             if len(line.strip()) > 12 and line.strip() not in others]
    assert lines, ex.name
    assert not [line for line in lines if line in text], "a line of the solution is in the file"


def _body(code: str) -> list[str]:
    """A function's lines after its signature and docstring."""
    fn = ast.parse(code).body[0]
    first = fn.body[1] if source.is_docstring(fn.body[0]) and len(fn.body) > 1 else fn.body[0]
    return code.splitlines()[first.lineno - 1:]


def test_an_exercise_names_every_input_cache_field_and_output_with_its_shape():
    text = make(by_name("layernorm"))
    todo = text[text.index("# TODO"):]
    for words in ("dy", "(3, 5, 6)", ".xhat", ".rstd", "(3, 5, 1)", ".gamma", "(6,)", "out",
                  "and returns (dx, grads):", '["gamma"]', '["beta"]',
                  "python -m minitfm.learn check layernorm"):
        assert words in todo, words


def test_hard_leaves_the_derivation_out():
    easy, hard = make(by_name("layernorm")), make(by_name("layernorm"), hard=True)
    assert "term 2: -mean(g)" in easy and "term 2" not in hard
    assert "Forward" in hard and "xhat = (x - mu) * rstd" in hard
    assert '"""Return ``(dx, {"gamma": dgamma, "beta": dbeta})``."""' not in hard
    soft_easy, soft_hard = make(by_name("softmax")), make(by_name("softmax"), hard=True)
    assert "dS = P * (dP - rowsum(dP * P))" in soft_easy
    assert "rowsum" not in soft_hard


def test_the_fast_paths_text_is_left_out_of_the_docstring():
    text = make(by_name("layernorm"))
    assert "Row passes" not in text and "Fused" not in text


def test_an_exercise_follows_the_library(monkeypatch):
    """Made from the source as it is: a changed forward pass is the exercise's forward pass."""
    real = source.module_source

    def changed(module):
        text = real(module)
        return text.replace("y += p[\"beta\"]", "y += p[\"beta\"]  # the shift") \
            if module.endswith("layernorm") else text
    monkeypatch.setattr(source, "module_source", changed)
    assert 'y += p["beta"]  # the shift' in make(by_name("layernorm"))


def test_the_exercise_files_are_read_as_written():
    for ex in EXERCISES:
        if ex.kind is not KERNEL:
            assert learner.unwritten_text(make(ex), ex.write) == list(ex.write)
    assert inspect.getdoc(source)
