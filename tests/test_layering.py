"""Dependencies point down: the import floors of the package, read from the source with ``ast``.

A module may import modules of its own floor or of the floors below it, never of a floor above.
Within the models' floor each model imports only the models' shared base: neither model imports
the other. No modules import each other, directly or round a longer circle, and no module imports
a private name (``_name``) of another, nor reads one through a module it imported: modules meet
through their public names. The floors are listed here, once (docs/layout.md, "The code", shows
them).
"""

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FLOORS = [      # top to bottom: (name, the modules and packages on it)
    ("front ends", ["train_toy", "train_wmt", "train_lm", "minitfm.commands", "minitfm.cli",
                    "minitfm.translate", "minitfm.average", "minitfm.plot",
                    "minitfm.gradcheck.__main__", "minitfm.kernelcheck", "minitfm.export.__main__",
                    "minitfm.launch", "minitfm.learn"]),
    ("training, decoding, sampling, export",
     ["minitfm.training", "minitfm.decoding", "minitfm.averaging", "minitfm.plotting",
      "minitfm.export", "minitfm.checkpoint", "minitfm.usable", "minitfm.optim",
      "minitfm.gradscale", "minitfm.workers", "minitfm.bleu", "minitfm.speed",
      "minitfm.gradcheck"]),
    ("models", ["minitfm.models"]),
    ("layers, data, special ids", ["minitfm.layers", "minitfm.data", "minitfm.ids",
                                   "minitfm.tasks", "minitfm.flat"]),
    ("backend", ["minitfm.backend", "minitfm.workers.blas", "minitfm"]),
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


def imported_names(name: str) -> list[tuple[str, str | None, str | None]]:
    """``(module, name, bound as)`` for every import of the module ``name`` (anywhere in it, lazy
    imports included): ``name`` None for a module imported itself."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, alias.asname) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:       # "from minitfm import models": a module itself
                whole = f"{base}.{alias.name}"
                found.append((whole, None, alias.asname or alias.name) if whole in MODULES
                             else (base, alias.name, alias.asname or alias.name))
    return found


@functools.cache
def imports(name: str) -> set[str]:
    """The package modules ``name`` imports (anywhere in it, lazy imports included)."""
    return {m for m, _, _ in imported_names(name) if m == "minitfm" or m.startswith("minitfm.")}


def private_uses(name: str) -> list[str]:
    """The private names of other modules that ``name`` imports (``from m import _x``) or reads
    through a module it imported (``m._x``)."""
    ours = [(m, n, bound) for m, n, bound in imported_names(name)
            if m in MODULES and m != name]
    found = [f"{m}.{n}" for m, n, _ in ours if n is not None and n.startswith("_")]
    modules = {bound or m.rpartition(".")[2]: m for m, n, bound in ours if n is None}
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            found.append(f"{modules[node.value.id]}.{node.attr}")
    return sorted(set(found))


def circle_through(name: str) -> list[str] | None:
    """A circle of imports that comes back to ``name`` (the modules on it, in order), or None."""
    path, seen = [name], set()

    def visit(module: str) -> bool:
        for imported in sorted(imports(module) & MODULES.keys()):
            if imported == name:
                return True
            if imported not in seen:
                seen.add(imported)
                path.append(imported)
                if visit(imported):
                    return True
                path.pop()
        return False

    return path + [name] if visit(name) else None


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


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_on_an_import_circle(name):
    circle = circle_through(name)
    assert circle is None, (f"{' -> '.join(circle)}: modules on a circle cannot be read one "
                            f"before the other; move what both need down, or to one of them")


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_uses_a_private_name_of_another(name):
    used = private_uses(name)
    assert not used, (f"{name} uses {', '.join(used)}: private to its module; make it public "
                      f"where it lives, or move it where it is used")


def test_the_scan_sees_circles_and_private_names(tmp_path, monkeypatch, request):
    """The two rules above, on two made-up modules that break them."""
    request.addfinalizer(imports.cache_clear)      # the imports read then are the made-up ones
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from minitfm import b\nfrom minitfm.b import _helper\n")
    b.write_text("from minitfm import a\nimport minitfm.a as first\nfirst._state\n")
    monkeypatch.setitem(MODULES, "minitfm.a", a)
    monkeypatch.setitem(MODULES, "minitfm.b", b)
    assert circle_through("minitfm.a") == ["minitfm.a", "minitfm.b", "minitfm.a"]
    assert private_uses("minitfm.a") == ["minitfm.b._helper"]
    assert private_uses("minitfm.b") == ["minitfm.a._state"]
    assert circle_through("minitfm.ids") is None


def test_the_scan_sees_upward_and_relative_imports(tmp_path):
    """The reader itself: data/vocab.py's relative import is resolved, and the old upward import
    of the special ids from the translation model would be caught."""
    assert "minitfm.data.corpus" in imports("minitfm.data.vocab")
    assert floor_of("minitfm.models.translator") < floor_of("minitfm.data.vocab")
    assert floor_of("minitfm.training.loop") < floor_of("minitfm.models.lm")
    with pytest.raises(LookupError, match="on no floor"):
        floor_of("elsewhere.module")
