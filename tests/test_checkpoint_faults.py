"""Checkpoints and exports through the real command lines when the disk, the user or a signal
gets in the way: a read the disk fails is not a damaged file (status 1, the file not judged), an
array a checkpoint holds beyond its model is named, never dropped in silence, and an export
replaced under ``--force`` is whole, old or new, whenever the command is stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minitfm import checkpoint
from tests.test_translate import ckpt, vocab  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}
TOY = ["train_toy.py", "--task", "copy", "--length", "5", "--vocab", "5", "--batch-size", "8",
       "--preset", "tiny", "--eval-size", "10", "--quiet"]


def command(*args, wrapper: list[str] | None = None) -> subprocess.CompletedProcess:
    """``args`` (a script and its options, or ``-m module ...``) run in the checkout, under
    ``wrapper`` (a script that runs the command after it) when given."""
    return subprocess.run([sys.executable, *(wrapper or []), *map(str, args)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)


def failing_disk(*faults) -> list[str]:
    return [str(ROOT / "tests" / "failing_disk.py"), *map(str, faults), "--"]


def one_error(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1, done.stderr
    return done.stderr


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    """A train_toy run with checkpoints of steps 2 and 4."""
    out = tmp_path_factory.mktemp("toy") / "run"
    done = command(*TOY, "--max-steps", 4, "--save-every", 2, "--out", out)
    assert done.returncode == 0, done.stderr
    return out


def test_a_read_the_disk_fails_is_an_io_error_not_a_damaged_checkpoint(toy_run, ckpt):  # noqa: F811
    """EIO while reading the newest checkpoint (a failing disk, an NFS server gone): status 1,
    the I/O error named, the file said not to be judged, never "damaged"; the same for every
    command that reads a checkpoint. Nothing in the run directory changes."""
    newest = checkpoint.latest(toy_run)
    before = {p.name: p.read_bytes() for p in toy_run.iterdir()}
    readers = [
        (newest, [*TOY, "--max-steps", 6, "--resume", "--out", toy_run]),
        (newest, ["-m", "minitfm.average", "--inputs", newest,
                  checkpoint.checkpoint_path(toy_run, 2), "--output", toy_run.parent / "avg.npz"]),
        (ckpt, ["-m", "minitfm.translate", "--checkpoint", ckpt, "--input", os.devnull]),
        (ckpt, ["-m", "minitfm.export", ckpt, "--to", "safetensors",
                "--out", toy_run.parent / "m.safetensors"]),
    ]
    for unreadable, args in readers:
        done = command(*args, wrapper=failing_disk("--eio", unreadable))
        err = one_error(done)
        assert done.returncode == 1, (args, err)
        assert f"{unreadable}: reading it failed: Input/output error" in err, err
        assert "not judged" in err and "damaged" not in err and "corrupt" not in err, err
    assert {p.name: p.read_bytes() for p in toy_run.iterdir()} == before
    assert not (toy_run.parent / "avg.npz").exists()


INTERRUPT_AFTER_MOVING_ASIDE = """\
import os, runpy, signal, sys

target = os.path.abspath(sys.argv[1])
rename = os.rename

def slow_rename(src, dst, *args, **kwargs):
    rename(src, dst, *args, **kwargs)
    if os.path.abspath(src) == target:      # the old export moved aside: Ctrl-C arrives now
        os.kill(os.getpid(), signal.SIGINT)

os.rename = slow_rename
sys.argv = ["minitfm.export", *sys.argv[2:]]
runpy.run_module("minitfm.export", run_name="__main__", alter_sys=True)
"""


def test_ctrl_c_during_export_force_keeps_the_old_export(ckpt, tmp_path):  # noqa: F811
    """Ctrl-C between moving the old export aside and renaming the new one in (a slow rename):
    status 130, and the old export is back whole under its name, with no temporary left."""
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    done = command("-m", "minitfm.export", ckpt, "--to", "ctranslate2", "--out", out)
    assert done.returncode == 0, done.stderr
    (out / "mine.txt").write_text("the old export's own file")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    wrapper = tmp_path / "interrupt.py"
    wrapper.write_text(INTERRUPT_AFTER_MOVING_ASIDE)
    done = command(out, ckpt, "--to", "ctranslate2", "--out", out,
                   "--force", wrapper=[str(wrapper)])
    assert done.returncode == 128 + signal.SIGINT, done.stderr
    assert "Traceback" not in done.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert set(os.listdir(tmp_path)) == {"ct2", "interrupt.py"}     # no temporary left


def with_foreign_arrays(source, destination, **arrays) -> Path:
    """A copy of the checkpoint ``source`` with ``arrays`` added, as another program would."""
    with np.load(source) as archive:
        np.savez(destination, **{name: archive[name] for name in archive.files}, **arrays)
    return Path(destination)


def test_arrays_beyond_the_model_are_named_never_dropped_in_silence(toy_run, ckpt,  # noqa: F811
                                                                   tmp_path):
    """A checkpoint holding arrays that no parameter of its model has: translate, a resume and
    average each name them in one warning (they write nothing that holds them), and run; the
    file itself is not changed."""
    foreign = {"notes/ema": np.zeros(3, np.float32), "param/extra.weight": np.ones(2)}
    model = with_foreign_arrays(ckpt, tmp_path / "model.npz", **foreign)
    done = command("-m", "minitfm.translate", "--checkpoint", model, "--input", os.devnull)
    assert done.returncode == 0, done.stderr
    resumed = tmp_path / "run"
    resumed.mkdir()
    for path in toy_run.iterdir():
        if path.name != "run.lock":
            (resumed / path.name).write_bytes(path.read_bytes())
    newest = with_foreign_arrays(checkpoint.latest(toy_run), checkpoint.latest(resumed),
                                 **foreign)
    kept = newest.read_bytes()
    resume = command(*TOY, "--max-steps", 6, "--save-every", 2, "--out", resumed, "--resume")
    assert resume.returncode == 0, resume.stderr
    average = command("-m", "minitfm.average", "--inputs", newest, "--output",
                      tmp_path / "avg.npz")
    assert average.returncode == 0, average.stderr
    for done, path in ((done, model), (resume, newest), (average, newest)):
        warning = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
        assert len(warning) == 1 and str(path) in warning[0], done.stderr
        assert "2 arrays" in warning[0] and "'notes/ema'" in warning[0] \
            and "'param/extra.weight'" in warning[0], warning
        assert "nothing this command writes holds them" in warning[0], warning
    assert newest.read_bytes() == kept
    assert checkpoint.load(checkpoint.latest(resumed)).step == 6
