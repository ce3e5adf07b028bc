"""Nothing left behind, and nothing trimmed silently, through the real command lines: the
temporaries that a write killed on the way leaves (``kill -9`` while saving a checkpoint or
exporting) are removed by the next run of the same run directory or export, which says how many,
and only those whose writer is gone; a resumed run whose log a crash cut mid-line says that it
dropped the line. Writers that fail for lack of room name the folder and the space free there,
the export's included; an export without its extra installed is bad usage (2) with the line that
installs it."""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

import pytest

from minitfm import checkpoint, files
from tests import forkserver
from tests.test_exit_statuses import (ENV, ROOT, TOY, assert_error, command,  # noqa: F401
                                      translator_ckpt, vocab)

WRITE_AND_DIE = """
import os, sys
from minitfm import files
path = files.temporary_beside(sys.argv[1])
os.makedirs(path) if sys.argv[2] == "folder" else open(path, "wb").write(b"half a file")
os.kill(os.getpid(), 9)                 # killed while writing: its temporary stays
"""


def killed_while_writing(destination: Path, kind: str = "file") -> Path:
    """The temporary a process killed while writing ``destination`` left (a real one)."""
    before = set(destination.parent.iterdir()) if destination.parent.exists() else set()
    done = forkserver.run([sys.executable, "-c", WRITE_AND_DIE, str(destination), kind],
                          env=ENV, timeout=60)
    assert done.returncode == -9
    [left] = set(destination.parent.iterdir()) - before
    return left


def test_a_resumed_run_removes_what_killed_saves_left_and_says_what_it_dropped(tmp_path):
    out = tmp_path / "run"
    assert command("train_toy.py", *TOY, "--max-steps", 2, "--out", out)[0] == 0
    stale = [killed_while_writing(out / "checkpoint_00000003.npz"),
             killed_while_writing(out / "run.json")]
    live = Path(files.temporary_beside(out / "checkpoint_00000004.npz"))    # this process's
    other = out / ".checkpoint_00000003.npz.another-host.1.abc.tmp"          # another machine's
    for kept in (live, other):
        kept.write_bytes(b"in the making")
    with open(out / "log.jsonl", "a") as log:
        log.write('{"step": 3, "lo')                        # the run died writing this line
    code, _, err = command("train_toy.py", *TOY, "--max-steps", 4, "--out", out, "--resume")
    assert code == 0, err
    assert f"removed 2 temporary file(s) that a killed run left in {out}" in err
    assert f"{out / 'log.jsonl'}: dropped a line cut short (the run ended while writing it); " \
           f"the log goes on from step 2" in err
    assert not any(p.exists() for p in stale) and live.exists() and other.exists()
    assert [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()
            if "loss" in line] == [2, 4]
    assert checkpoint.latest(out).endswith("checkpoint_00000004.npz")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, translator_ckpt):  # noqa: F811
    """The sizes of the two exports of the translator checkpoint, made once."""
    folder = tmp_path_factory.mktemp("exports")
    sizes = {}
    for to, name in (("ctranslate2", "model-ct2"), ("safetensors", "model.safetensors")):
        assert command("-m", "minitfm.export", translator_ckpt, "--to", to,
                       "--out", folder / name)[0] == 0
        path = folder / name
        sizes[to] = max(p.stat().st_size for p in ([path] if path.is_file() else path.iterdir()))
    return sizes


def export(*args, limit_file_size: int | None = None, env: dict | None = None):
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_size, limit_file_size))
    done = forkserver.run([sys.executable, "-m", "minitfm.export", *map(str, args)],
                          capture_output=True, text=True, env={**ENV, **(env or {})},
                          preexec_fn=limit if limit_file_size else None, timeout=300)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("to, name", [("ctranslate2", "model-ct2"),
                                      ("safetensors", "model.safetensors")])
def test_an_export_removes_what_killed_exports_left_and_names_a_full_disk(
        translator_ckpt, exported, tmp_path, to, name):  # noqa: F811
    """Named, with its folder's free space: never "error: a file: No space left on device", nor
    a SafetensorError traceback."""
    out = tmp_path / name
    stale = [killed_while_writing(out, "folder" if to == "ctranslate2" else "file")
             for _ in range(2)]
    unrelated = tmp_path / ".other.safetensors.x.1.y.tmp"
    unrelated.write_bytes(b"not ours")
    code, _, err = export(translator_ckpt, "--to", to, "--out", out,
                          limit_file_size=exported[to] // 2)
    assert_error((code, "", err), 1, f"error: {out}: File too large (",
                 f" free in {tmp_path})")
    assert f"removed 2 temporaries that killed exports to {out} left in {tmp_path}" in err
    assert sorted(tmp_path.iterdir()) == [unrelated]        # nothing half-written, none left
    assert not any(p.exists() for p in stale)


def test_an_export_without_its_extra_is_bad_usage_with_the_install_line(translator_ckpt,  # noqa: F811
                                                                         tmp_path):
    missing = tmp_path / "site"
    for package in ("safetensors", "ctranslate2"):
        (missing / package).mkdir(parents=True)
        (missing / package / "__init__.py").write_text(
            f"raise ModuleNotFoundError({f'No module named {package!r}'!r}, name={package!r})\n")
    env = {"PYTHONPATH": os.pathsep.join([str(missing), str(ROOT)])}
    weights = tmp_path / "model.safetensors"
    assert export(translator_ckpt, "--to", "safetensors", "--out", weights)[0] == 0
    for args in (["--to", "ctranslate2", "--out", tmp_path / "ct2"],
                 ["--to", "safetensors", "--out", tmp_path / "again.safetensors"]):
        assert_error(export(translator_ckpt, *args, env=env), 2, "pip install -e '.[export]'")
    # guards against a ModuleNotFoundError traceback, status 1
    assert_error(export(weights, "--from", "safetensors", "--out", tmp_path / "back.npz", env=env),
                 2, "safetensors files need the safetensors package: pip install -e '.[export]'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", "site"]
