"""Dependencies point down: the import floors of the package, read from the source with ``ast``.

A module may import modules of its own floor or of the floors below it, never of a floor above.
Within the models' floor each model imports only the models' shared base: neither model imports
the other. The floors are listed here, once (docs/layout.md, "The code", shows them).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FLOORS = [      # top to bottom: (name, the modules and packages on it)
    ("front ends", ["train_toy", "train_wmt", "train_lm", "minitfm.cli", "minitfm.exits",
                    "minitfm.translate", "minitfm.average", "minitfm.plot", "minitfm.gradcheck",
                    "minitfm.kernelcheck",
                    "minitfm.wmt", "minitfm.export.__main__", "minitfm.limits",
                    "minitfm.options"]),
    ("training, decoding, sampling, export",
     ["minitfm.train", "minitfm.trainstate", "minitfm.rundir", "minitfm.stops",
      "minitfm.validating", "minitfm.validation", "minitfm.phases",
      "minitfm.divergence", "minitfm.decode", "minitfm.beam", "minitfm.sampling", "minitfm.generation",
      "minitfm.export", "minitfm.checkpoint", "minitfm.usable", "minitfm.optim",
      "minitfm.gradscale",
      "minitfm.distributed",
      "minitfm.placement", "minitfm.devices", "minitfm.bleu"]),
    ("models", ["minitfm.models"]),
    ("layers, data, special ids", ["minitfm.layers", "minitfm.data", "minitfm.ids",
                                   "minitfm.tasks", "minitfm.flat"]),
    ("backend", ["minitfm.backend", "minitfm"]),
]
MODEL_BASE = "minitfm.models.base"      # what a model may import from its own floor


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    files = [*ROOT.glob("minitfm/**/*.py"), *ROOT.glob("train_*.py")]
    return {module_name(path): path for path in files}


MODULES = sources()


def floor_of(name: str) -> int:
    """The floor of a module: that of the longest listed name it is or lies inside."""
    best, floor = -1, None
    for i, (_, members) in enumerate(FLOORS):
        for member in members:
            if (name == member or name.startswith(member + ".")) and len(member) > best:
                best, floor = len(member), i
    if floor is None:
        raise LookupError(f"{name} is on no floor: add it to FLOORS in tests/test_layering.py")
    return floor


def imports(name: str) -> set[str]:
    """The package modules ``name`` imports (anywhere in it, lazy imports included)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:       # "from minitfm import models": a module itself
                whole = f"{base}.{alias.name}"
                found.add(whole if whole in MODULES else base)
    return {m for m in found if m == "minitfm" or m.startswith("minitfm.")}


def test_every_module_is_on_a_floor():
    assert len(MODULES) > 40
    for name in MODULES:
        floor_of(name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_upward(name):
    upward = [f"{imported} ({FLOORS[floor_of(imported)][0]})" for imported in sorted(imports(name))
              if floor_of(imported) < floor_of(name)]
    assert not upward, (f"{name} ({FLOORS[floor_of(name)][0]}) imports a floor above it: "
                        + ", ".join(upward))


@pytest.mark.parametrize("name", sorted(n for n in MODULES
                                        if n.startswith("minitfm.models.") and n != MODEL_BASE))
def test_a_model_imports_no_other_model(name):
    others = {m for m in imports(name) if floor_of(m) == floor_of(name) and m != MODEL_BASE}
    assert not others, (f"{name} imports {sorted(others)}: shared pieces go to {MODEL_BASE} "
                        f"or layers/")


def test_the_scan_sees_upward_and_relative_imports(tmp_path):
    """The reader itself: data/vocab.py's relative import is resolved, and the old upward import
    of the special ids from the translation model would be caught."""
    assert "minitfm.data.corpus" in imports("minitfm.data.vocab")
    assert floor_of("minitfm.models.translator") < floor_of("minitfm.data.vocab")
    assert floor_of("minitfm.train") < floor_of("minitfm.models.lm")
    with pytest.raises(LookupError, match="on no floor"):
        floor_of("elsewhere.module")
