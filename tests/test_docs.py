"""The documentation stays true to the code: every file of minitfm/layers/ has its section on the
gradients page, every function a section pulls in exists, and every check command it gives runs
at least one gradient check. Also the README's promises: short, a licence, the data's sources.
Reads the page sources only (no site build: that is CI's job, and the browser check's)."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

from minitfm.gradcheck.cases import CASES, MODEL_CASES

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "gradients.md"
LAYER_FILES = sorted(p.stem for p in (ROOT / "minitfm" / "layers").glob("*.py")
                     if p.name != "__init__.py")


def sections() -> dict[str, str]:
    """The gradients page cut at its second-level headings, keyed by the layer file each names
    (``## Title: `layers/NAME.py` ``)."""
    found = {}
    for part in re.split(r"^## ", PAGE.read_text(), flags=re.M)[1:]:
        heading = part.split("\n", 1)[0]
        match = re.search(r"`layers/(\w+)\.py`", heading)
        assert match, f"a section of {PAGE.name} names no layer file: {heading!r}"
        assert match.group(1) not in found, f"two sections for layers/{match.group(1)}.py"
        found[match.group(1)] = part
    return found


def test_every_layer_file_has_a_section():
    missing = sorted(set(LAYER_FILES) - set(sections()))
    assert not missing, (f"{PAGE.relative_to(ROOT)} has no section for layers/{missing[0]}.py: add "
                         "one with its docstring, code, derivation and check command")
    stale = sorted(set(sections()) - set(LAYER_FILES))
    assert not stale, f"{PAGE.name} has a section for layers/{stale[0]}.py, which no longer exists"


@pytest.mark.parametrize("name", LAYER_FILES)
def test_section_pulls_in_its_own_file(name):
    text = sections().get(name, "")
    assert f"```{{docstring}} minitfm.layers.{name}\n" in text, f"{name}: no docstring directive"
    includes = re.findall(r"```\{literalinclude\} (\S+)\n:pyobject: (\S+)\n", text)
    assert includes, f"{name}: the section includes no code"
    module = importlib.import_module(f"minitfm.layers.{name}")
    for path, obj in includes:
        assert path == f"../minitfm/layers/{name}.py", f"{name}: includes {path}"
        target = module
        for part in obj.split("."):
            assert hasattr(target, part), (f"the gradients page shows {name}.{obj}, which no "
                                           f"longer exists in minitfm/layers/{name}.py")
            target = getattr(target, part)
        assert callable(target)
    assert any(obj.endswith(("backward", "forward_backward")) for _, obj in includes), (
        f"{name}: the section shows no backward pass")


@pytest.mark.parametrize("name", LAYER_FILES)
def test_section_check_command_runs_checks(name):
    text = sections().get(name, "")
    commands = re.findall(r"^python -m minitfm\.gradcheck (.+)$", text, flags=re.M)
    assert commands, f"{name}: the section gives no gradient-check command"
    names = [case.name.lower() for case in CASES + MODEL_CASES]
    for command in commands:
        (only,) = shlex.split(command)
        assert any(only.lower() in case for case in names), (
            f"{name}: `python -m minitfm.gradcheck {command}` matches no check")
    assert "$$" in text, f"{name}: no typeset derivation"


def test_readme_is_short_and_says_where_the_data_comes_from():
    readme = (ROOT / "README.md").read_text()
    lines = readme.split("\n")
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; at most 250"
    first = "\n".join(lines[:80])
    assert "## Results" in first and "| task | result |" in first, "no results table in 80 lines"
    for source in ("Multi30k", "WMT14", "tiny Shakespeare", "Licence", "public domain"):
        assert source in readme, f"README.md says nothing of {source}"
    assert 'pip install -e ".[test,mpi,export]" && pytest' in readme
    assert "pip install -e . && python train_toy.py" in readme
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License") and "the minitfm authors" in license_text
