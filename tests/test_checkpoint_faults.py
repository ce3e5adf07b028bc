"""Checkpoints and exports through the real command lines when the disk, the user or a signal
gets in the way: a read the disk fails is not a damaged file (status 1, the file not judged), an
array a checkpoint holds beyond its model is named, never dropped in silence, an export
replaced under ``--force`` is whole, old or new, whenever the command is stopped, and a signal at
any step of writing a checkpoint's archive ends the command as documented, the destination
untouched.
"""

from __future__ import annotations

import gc
import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from minitfm import checkpoint
from minitfm.cli import average
from minitfm.cli.reporting import report_errors
from minitfm.export import __main__ as export
from tests.test_translate import ckpt, vocab  # noqa: F401  (fixtures)
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}
TOY = ["train_toy.py", "--task", "copy", "--length", "5", "--vocab", "5", "--batch-size", "8",
       "--preset", "tiny", "--eval-size", "10", "--quiet"]


def command(*args, wrapper: list[str] | None = None) -> subprocess.CompletedProcess:
    """``args`` (a script and its options, or ``-m module ...``) run in the checkout, under
    ``wrapper`` (a script that runs the command after it) when given."""
    return forkserver.run([sys.executable, *(wrapper or []), *map(str, args)], cwd=ROOT, env=ENV,
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


# ---- a signal at every step of writing an archive ---------------------------------------------

SIGNALS = [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM"),
           (signal.SIGHUP, 129, "stopped by SIGHUP")]


class SignalAtUse:
    """The archive's file, which sends ``signum`` to this process at the ``at``-th use of any of
    its attributes (a write, seek, tell or flush, or its name, which ``ZipFile()`` reads while
    it builds itself): the signal lands at that step of zipfile's own code, as a Ctrl-C can.
    ``places`` records which function of zipfile made each use."""

    def __init__(self, file, at: int, signum: int) -> None:
        self._file, self._at, self._signum = file, at, signum
        self.places: list[str] = []

    def __getattr__(self, name: str):
        self.places.append(_zipfile_caller())
        if len(self.places) == self._at:
            os.kill(os.getpid(), self._signum)
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self._file.close()


def _zipfile_caller() -> str:
    """The function of zipfile nearest up the stack ("__init__", "close", ...), or "" if none."""
    frame = sys._getframe(2)
    while frame is not None and not frame.f_code.co_filename.endswith("zipfile.py"):
        frame = frame.f_back
    return frame.f_code.co_name if frame is not None else ""


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def signal_at_every_use(monkeypatch, capsys, command: Callable[[], int], out: Path,
                        signal_and_status: tuple[int, int, str], every: int = 1) -> list[str]:
    """Run ``command`` (a command's ``main``, whose last work is writing the archive ``out``)
    again and again, the signal sent at the 1st use of the archive's file, then at the
    ``1 + every``-th, and so on, until a run ends before that use: each run so stopped ends as
    documented (its status and its one line, nothing else printed, no error that Python could
    only ignore), ``out`` untouched and no temporary left beside it. The last run, never
    signalled, writes ``out``. Returns the zipfile function of each use."""
    signum, status, words = signal_and_status
    before, beside = digest(out), sorted(out.parent.iterdir())
    ignored: list = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    at = 1
    while True:
        opened: list[SignalAtUse] = []

        def open_signalling(path, mode="r", *args, **kwargs):
            opened.append(SignalAtUse(open(path, mode, *args, **kwargs), at, signum))
            return opened[-1]
        # checkpoint.save opens the archive's file by the builtin name: this one comes first
        monkeypatch.setattr(checkpoint, "open", open_signalling, raising=False)
        code = command()
        gc.collect(1)                   # a half-built ZipFile would fail in __del__ now
        err = capsys.readouterr().err
        [file] = opened
        if len(file.places) < at:       # it never came: the archive was written
            assert code == 0, err
            return file.places
        assert (code, err) == (status, words + "\n"), f"signal at use {at}: {err}"
        assert ignored == [], (f"signal at use {at} ({file.places[at - 1]}): "
                               f"{ignored[0].exc_value!r}")
        assert digest(out) == before, f"signal at use {at}: the destination changed"
        assert sorted(out.parent.iterdir()) == beside, f"signal at use {at}: a temporary left"
        at += every


def small_params() -> dict[str, np.ndarray]:
    return {"emb": np.arange(12, dtype=np.float32).reshape(3, 4),
            "ln.gamma": np.ones(4, np.float32)}


@pytest.mark.parametrize("signal_and_status", SIGNALS)
def test_a_signal_at_any_step_of_writing_a_checkpoint_ends_as_documented(
        tmp_path, monkeypatch, capsys, signal_and_status):
    """Every use zipfile makes of the file, inside ZipFile(), each entry and its close, and the
    archive's close, gets the signal in turn, under the real report_errors: before, a signal
    inside ZipFile() left an object whose clean-up failed ('ZipFile' object has no attribute
    '_writing')."""
    out = tmp_path / "model.npz"
    checkpoint.save(out, small_params(), step=1, config={}, vocab_id=None)

    def save() -> int:
        return report_errors(lambda: checkpoint.save(out, small_params(), step=2, config={},
                                                     vocab_id=None) and 0)
    places = signal_at_every_use(monkeypatch, capsys, save, out, signal_and_status)
    assert {"__init__", "_open_to_write", "write", "close"} <= set(places), places
    assert checkpoint.load(out).step == 2


@pytest.mark.slow
def test_a_signal_at_any_step_of_an_imports_or_an_averages_archive_ends_as_documented(
        tmp_path, monkeypatch, capsys):
    """The commands that write a checkpoint outside training, through their own main: the
    import of a safetensors file and the average of checkpoints, Ctrl-C at every use of the
    archive's file (some 1300 for this model), SIGTERM and SIGHUP at every 7th."""
    pytest.importorskip("safetensors")
    from tests.test_export import saved_model
    model = saved_model(tmp_path)
    tensors, out = tmp_path / "model.safetensors", tmp_path / "out" / "imported.npz"
    assert export.main([model, "--to", "safetensors", "--out", str(tensors)]) == 0
    out.parent.mkdir()
    out.write_bytes(b"the previous file")
    for signal_and_status in SIGNALS:
        every = 1 if signal_and_status[0] == signal.SIGINT else 7
        signal_at_every_use(monkeypatch, capsys, lambda: export.main(
            [str(tensors), "--from", "safetensors", "--out", str(out), "--force"]), out,
            signal_and_status, every)
        averaged = out.parent / "averaged.npz"
        averaged.write_bytes(b"the previous average")
        signal_at_every_use(monkeypatch, capsys, lambda: average.main(
            ["--inputs", model, str(out), "--output", str(averaged)]), averaged,
            signal_and_status, every)
        out.write_bytes(b"the previous file")
        averaged.unlink()
