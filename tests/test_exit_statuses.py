"""One exit-status table for every command (minitfm.cli.exits), through the real command lines:
0 done, 1 a run-time failure, 2 bad usage or bad input, 128 + the signal's number; an error is
one ``error:`` line, never a traceback, and leaves every file saved before it as it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from minitfm import checkpoint
from minitfm.cli import exits, reporting
from minitfm.training.rundir import HOLDER_NAME, LOCK_NAME
from tests import forkserver
from tests.test_translate import vocab, write_checkpoint  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}
TOY = ["--task", "copy", "--length", "5", "--vocab", "5", "--batch-size", "8", "--preset", "tiny",
       "--eval-size", "10", "--examples", "0", "--quiet"]
LM = ["--max-steps", "4", "--warmup", "1", "--layers", "1", "--d-model", "16", "--heads", "2",
      "--d-ff", "16", "--block-size", "8", "--batch-size", "2", "--samples", "0", "--quiet"]
TEXT = "the quick brown fox jumps over the lazy dog.\n" * 40


def command(*args, env=None, stdin: str | None = None) -> tuple[int, str, str]:
    """Run ``python ARGS`` (a script under the repository or ``-m module``) to its end (forked
    from the tests' server of commands: tests/forkserver.py)."""
    args = [str(a) for a in args]
    if args[0].endswith(".py"):
        args[0] = str(ROOT / args[0])
    done = forkserver.run([sys.executable, *args], capture_output=True, text=True,
                          env={**ENV, **(env or {})}, input=stdin, timeout=300)
    return done.returncode, done.stdout, done.stderr


def assert_error(result: tuple[int, str, str], status: int, *words: str) -> None:
    code, _, err = result
    assert code == status, err
    assert "Traceback" not in err, err
    assert err.count("error:") == 1, err
    for word in words:
        assert word in err, err


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file()}


def assert_intact(saved: dict[str, bytes], directory: Path) -> None:
    """Every file of ``saved`` byte for byte as it was; nothing new but the (empty) lock file."""
    now = snapshot(directory)
    assert {name: now.get(name) for name in saved} == saved
    assert set(now) - set(saved) <= {LOCK_NAME}


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """A finished train_toy.py run: its directory."""
    out = tmp_path_factory.mktemp("toy") / "run"
    code, _, err = command("train_toy.py", *TOY, "--max-steps", 3, "--save-every", 1, "--out", out)
    assert code == exits.DONE, err
    return out


@pytest.fixture(scope="module")
def translator_ckpt(tmp_path_factory, vocab):  # noqa: F811
    return write_checkpoint(tmp_path_factory.mktemp("tr") / "tiny.npz", vocab)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "input.txt"
    path.write_text(TEXT)
    return path


def test_the_table():
    assert (exits.DONE, exits.FAILED, exits.BAD_INPUT) == (0, 1, 2)
    assert exits.for_signal(signal.SIGINT) == 130 and exits.for_signal(signal.SIGTERM) == 143
    from minitfm.checkpoint import CheckpointError
    from minitfm.cli.exits import UsageError
    from minitfm.training.divergence import TrainingDiverged
    from minitfm.training.rundir import RunDirectoryBusy, WriteFailed
    for error in (UsageError("x"), CheckpointError("x"), FileNotFoundError("x"),
                  RunDirectoryBusy("x"), PermissionError(13, "x"),
                  json.JSONDecodeError("x", "{", 1), UnicodeDecodeError("utf-8", b"\xff", 0, 1, "x")):
        assert exits.status_of(error) == exits.BAD_INPUT, error
    for error in (TrainingDiverged("x"), WriteFailed("x"), OSError(28, "No space left"),
                  MemoryError()):
        assert exits.status_of(error) == exits.FAILED, error
    for bug in (KeyError("a bug"), ValueError("a bug")):     # shown with its traceback
        assert exits.status_of(bug) is None


# ---- train_toy.py ---------------------------------------------------------------------------

def test_train_toy(toy_run, tmp_path):
    saved = snapshot(toy_run)
    assert_error(command("train_toy.py", *TOY, "--max-steps", 0), 2)                 # argparse
    assert_error(command("train_toy.py", *TOY, "--length", 70, "--out", tmp_path / "a"), 2,
                 "--length 70 is too long")
    assert_error(command("train_toy.py", *TOY, "--max-steps", 5, "--out", toy_run), 2,
                 "already holds checkpoints")                        # needs --resume
    assert_error(command("train_toy.py", *TOY, "--max-steps", 5, "--out", toy_run, "--resume",
                         "--seed", 9), 2, "cannot resume")
    assert_intact(saved, toy_run)
    a_file = tmp_path / "notes.txt"                  # issue: status 1, and advice to --resume
    a_file.write_text("my notes\n")
    for resume in ((), ("--resume",)):
        assert_error(command("train_toy.py", *TOY, "--max-steps", 5, "--out", a_file, *resume), 2,
                     f"--out {a_file} is a file, not a run directory: give a directory")
    assert a_file.read_text() == "my notes\n"


@pytest.mark.gpu
def test_out_of_memory_names_the_device_its_memory_and_what_to_lower(cupy_backend, capsys):
    """Never "out of memory: ...; use smaller sizes", which said nothing of the GPU. Here the
    device's own error (the CuPy double's memory is bounded, as a GPU's)."""
    total = cupy_backend.cuda.runtime.getDeviceProperties(0)["totalGlobalMem"]
    status = reporting.report_errors(
        lambda: cupy_backend.zeros(total + 1, dtype="uint8") is None, sizes="--max-tokens")
    err = capsys.readouterr().err
    assert status == exits.FAILED and err.count("error:") == 1 and "Traceback" not in err
    name = cupy_backend.cuda.runtime.getDeviceProperties(0)["name"].decode()
    assert err.startswith(f"error: out of memory on GPU 0 ({name}, {total / 2**30:.1f} GiB): "
                          f"Out of memory allocating ")
    assert err.rstrip().endswith("; lower --max-tokens, or use a device with more memory")


def test_a_checkpoint_with_a_renamed_parameter_is_bad_input(toy_run, tmp_path):
    """Issue: a ValueError traceback (status 1) on resume; now one line and status 2."""
    run = tmp_path / "run"
    run.mkdir()
    latest = checkpoint.latest(toy_run)
    with np.load(latest) as archive:
        arrays = dict(archive)
    name = next(key for key in arrays if key.startswith("param/"))
    arrays[name.replace("param/", "param/renamed.")] = arrays.pop(name)
    meta = json.loads(bytes(arrays["meta"]).decode())
    meta["param_names"] = [("renamed." + n if "param/" + n == name else n)
                           for n in meta["param_names"]]
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    target = run / Path(latest).name
    with open(target, "wb") as f:
        np.savez(f, **arrays)
    saved = snapshot(run)
    assert_error(command("train_toy.py", *TOY, "--max-steps", 5, "--out", run, "--resume"), 2,
                 "renamed.")
    assert_intact(saved, run)


def test_train_toy_signal(tmp_path):
    out = tmp_path / "run"
    process = subprocess.Popen([sys.executable, str(ROOT / "train_toy.py"), *TOY,
                                "--max-steps", "100000", "--out", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = time.monotonic() + 60
    while not (out / "log.jsonl").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    out_text, err = process.communicate(timeout=120)
    assert process.returncode == 143, err
    assert "Traceback" not in err and "stopped by SIGTERM" in out_text + err
    assert checkpoint.latest(out) is not None and not (out / HOLDER_NAME).exists()


# ---- train_lm.py ----------------------------------------------------------------------------

def test_train_lm(text_file, tmp_path):
    out = tmp_path / "run"
    assert command("train_lm.py", "--data", text_file, *LM, "--out", out)[0] == exits.DONE
    saved = snapshot(out)
    assert_error(command("train_lm.py", "--data", text_file, *LM, "--heads", "x"), 2)
    assert_error(command("train_lm.py", "--data", tmp_path / "missing.txt", *LM,
                         "--out", tmp_path / "b"), 2, "missing.txt")
    assert_error(command("train_lm.py", "--sample", "--checkpoint", tmp_path / "missing.npz"), 2,
                 "missing.npz")
    assert_error(command("train_lm.py", "--data", text_file, *LM, "--max-steps", 6, "--d-model", 32,
                         "--out", out, "--resume"), 2, "--d-model")
    code, sample, err = command("train_lm.py", "--sample", "--checkpoint",
                                checkpoint.latest(out), "--max-new-tokens", 5)
    assert code == exits.DONE and sample.startswith("\n"), err
    assert_intact(saved, out)


# ---- train_wmt.py ---------------------------------------------------------------------------

def test_train_wmt(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for lang in ("en", "de"):
        (corpus / f"train.{lang}").write_text("".join(f"{lang} sentence number {i}\n"
                                                      for i in range(30)))
    assert_error(command("train_wmt.py", "--trainpref", corpus / "train", "--max-tokens", 1), 2)
    assert_error(command("train_wmt.py", "--trainpref", corpus / "missing", "--out",
                         tmp_path / "run"), 2, "missing")
    assert not (tmp_path / "run").exists()
    assert_error(command("train_wmt.py", "--eval-only", "--checkpoint", tmp_path / "none.npz",
                         "--testpref", corpus / "train"), 2, "none.npz")
    code, _, err = command("train_wmt.py", "--trainpref", corpus / "train", "--vocab-size", 40,
                           "--layers", 1, "--d-model", 16, "--d-ff", 16, "--heads", 2,
                           "--max-tokens", 64, "--max-steps", 2, "--warmup", 1,
                           "--valid-every", 0, "--save-every", 0, "--average-last", 1,
                           "--keep-last", 1, "--backend", "numpy", "--quiet",
                           "--out", tmp_path / "run")
    assert code == exits.DONE, err


# ---- the commands of the package -------------------------------------------------------------

def test_translate(translator_ckpt, tmp_path):
    assert_error(command("-m", "minitfm.translate", "--checkpoint", translator_ckpt,
                         "--beam", 0), 2)
    assert_error(command("-m", "minitfm.translate", "--checkpoint", tmp_path / "none.npz",
                         stdin="a man\n"), 2, "none.npz")
    assert_error(command("-m", "minitfm.translate", "--checkpoint", translator_ckpt, "--input",
                         tmp_path / "none.en"), 2, "none.en")
    code, out, err = command("-m", "minitfm.translate", "--checkpoint", translator_ckpt,
                             "--beam", 1, stdin="a man\ntwo dogs\n")
    assert code == exits.DONE and len(out.splitlines()) == 2, err


def test_average(toy_run, tmp_path):
    saved = snapshot(toy_run)
    output = tmp_path / "averaged.npz"
    assert_error(command("-m", "minitfm.average", "--inputs", toy_run, "--last", 0,
                         "--output", output), 2)
    assert_error(command("-m", "minitfm.average", "--inputs", tmp_path / "none",
                         "--output", output), 2, "none")
    code, _, err = command("-m", "minitfm.average", "--inputs", toy_run, "--last", 2,
                           "--output", output)
    assert code == exits.DONE and checkpoint.load(output).step == 3, err
    assert_intact(saved, toy_run)


def test_plot(toy_run, tmp_path):
    assert_error(command("-m", "minitfm.plot", "positional", "--d-model", 0), 2)
    assert_error(command("-m", "minitfm.plot", "curves", tmp_path / "none.jsonl",
                         "--out", tmp_path / "c.png"), 2, "none.jsonl")
    assert not (tmp_path / "c.png").exists()
    code, out, err = command("-m", "minitfm.plot", "positional", "--d-model", 8, "--length", 6,
                             "--out", tmp_path / "p.png")
    assert code == exits.DONE and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG", err
    assert [p.name for p in tmp_path.iterdir()] == ["p.png"]        # no temporary left


def test_gradcheck():
    assert_error(command("-m", "minitfm.gradcheck", "--seed", "x"), 2)
    assert_error(command("-m", "minitfm.gradcheck", "no such layer"), 2, "no check matches")
    # issue: the right message, but as a traceback
    assert_error(command("-m", "minitfm.gradcheck", "layernorm", env={"MINITFM_BACKEND": "cupy"}),
                 2, "CuPy")
    code, out, err = command("-m", "minitfm.gradcheck", "layernorm")
    assert code == exits.DONE and "0 failed" in out, err
    # issue: accepted, and every check "failed" (1); --seed -1 a traceback
    for option, value, words in (("--tolerance", "nan", "a finite number > 0"),
                                 ("--tolerance", -1, "a finite number > 0"),
                                 ("--seed", -1, "an integer >= 0")):
        assert_error(command("-m", "minitfm.gradcheck", "layernorm", option, value), 2,
                     f"argument {option}: must be {words}")
    code, out, err = command("-m", "minitfm.gradcheck", "layernorm", "--tolerance", 1e-30)
    assert code == exits.FAILED and "FAIL" in out, err              # a check that fails


def test_export(toy_run, tmp_path):
    assert_error(command("-m", "minitfm.export", "x.npz", "--to", "onnx", "--out", "y"), 2)
    for option, value in (("--lenpen", "nan"), ("--lenpen", -1), ("--beam", 0)):   # as anywhere
        assert_error(command("-m", "minitfm.export", "x.npz", "--to", "ctranslate2", "--out", "y",
                             option, value), 2, f"argument {option}: must be a")
    assert_error(command("-m", "minitfm.export", tmp_path / "none.npz", "--to", "safetensors",
                         "--out", tmp_path / "m.safetensors"), 2, "none.npz")
    assert not (tmp_path / "m.safetensors").exists()
