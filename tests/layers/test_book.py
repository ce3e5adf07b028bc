"""``minitfm/layers/`` is the textbook alone: read with ``ast`` and as text, no file of it imports
the fast paths or their machinery, and none speaks of kernels, CUDA, Numba, float16 or row passes
(each file's fast paths are in ``minitfm/speed/``, which it names once)."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = sorted((ROOT / "minitfm" / "layers").glob("*.py"))
MACHINE = ("minitfm.speed", "minitfm.cudahost", "numba", "cupy")
WORDS = re.compile(r"(?<!-)\bkernels?\b|\bCUDA\b|\bNumba\b|\bfloat16\b|\bfp16\b|\brow pass",
                   re.IGNORECASE)


def imports_of(source: str) -> list[str]:
    """Every module an import of ``source`` names (``from a import b``: ``a`` and ``a.b``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return found


def machine_imports(source: str) -> list[str]:
    return [name for name in imports_of(source)
            if any(name == m or name.startswith(m + ".") for m in MACHINE)]


def machine_words(source: str) -> list[str]:
    return [f"line {source.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
            for m in WORDS.finditer(source)]


@pytest.mark.parametrize("path", BOOK, ids=lambda p: p.name)
def test_a_layer_file_imports_nothing_of_the_machine(path):
    found = machine_imports(path.read_text(encoding="utf-8"))
    assert not found, f"layers/{path.name} imports {found}: the fast paths belong in minitfm/speed/"


@pytest.mark.parametrize("path", BOOK, ids=lambda p: p.name)
def test_a_layer_file_speaks_of_the_math_alone(path):
    found = machine_words(path.read_text(encoding="utf-8"))
    assert not found, f"layers/{path.name} speaks of the machine: {found}"


@pytest.mark.parametrize("source, imports, words", [
    ("from minitfm.speed import fused\n", ["minitfm.speed", "minitfm.speed.fused"], []),
    ("from minitfm import speed\n", ["minitfm.speed"], []),
    ("import numba\n", ["numba"], ["line 1: numba"]),
    ("from minitfm import backend\n", [], []),
    ('"""A fused kernel each way."""\n', [], ["line 1: kernel"]),
    ('"""Row passes on blocks; Numba loops"""\n', [], ["line 1: Row pass", "line 1: Numba"]),
    ('"""--kernels plain; float16 copies"""\n', [], ["line 1: float16"]),
], ids=["speed module", "speed package", "numba", "backend", "kernel", "row pass", "option"])
def test_the_scans_find_what_they_look_for(source, imports, words):
    assert machine_imports(source) == imports
    assert machine_words(source) == words
