"""The commands on the CuPy path, whole, as a user runs them.

By default every command runs on the strict CuPy double (once under CuPy 14's rules, once under
13's: the ``cupy_env`` fixture), which refuses what CuPy refuses and counts what makes the host
wait; with ``pytest -m gpu`` the same tests run on the real CuPy and device. Each run writes the
double's counts at exit (``CUPY_DOUBLE_REPORT``): no command creates a random generator of the
array library (dropout and sampling draw from Philox). The default run starts one short
``train_toy`` and the LayerNorm gradient check on the double; the other commands, whole runs on
an array library some nine times slower than NumPy, are behind the slow marker (CI runs them):
they change with the GPU path alone, which NumPy's runs of the same commands do not reach.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minitfm import checkpoint

from tests.test_distributed import _mpiexec, _why_mpi_cannot_run
from tests.test_train_lm import SMALL as LM_SMALL
from tests.test_train_wmt import corpus, corpus_args  # noqa: F401  (corpus: a fixture)
from tests import forkserver

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300
WMT_TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32",
            "--vocab-size", "64", "--max-tokens", "256", "--warmup", "10",
            "--valid-bleu-sentences", "8", "--backend", "cupy", "--quiet"]
TOY_TINY = ["--preset", "tiny", "--length", "5", "--vocab", "5", "--eval-size", "10"]


def on_double(env: dict) -> bool:
    return "CUPY_DOUBLE_RULES" in env


def with_report(env: dict, directory: Path, devices: int | None = None) -> dict:
    """``env`` with the double's report written into ``directory`` (one file per process)."""
    env = dict(env)
    directory.mkdir(parents=True, exist_ok=True)
    env["CUPY_DOUBLE_REPORT"] = str(directory / "double-{pid}.json")
    env["MINITFM_BACKEND"] = "cupy"
    if devices is not None:
        env["CUPY_DOUBLE_DEVICES"] = str(devices)
    return env


def reports(directory: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("double-*.json"))]


def command(args: list, env: dict, *, stdin: str | None = None, workers: int = 0,
            timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """``python ARGS`` (under ``mpiexec -n workers`` when given), checked to succeed."""
    argv = [sys.executable, *map(str, args)]
    if workers:
        reason = _why_mpi_cannot_run()
        if reason:
            pytest.skip(reason)
        argv = [_mpiexec(), "-n", str(workers), *argv]
    done = forkserver.run(argv, cwd=ROOT, env=env, input=stdin, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{argv}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    return done


def assert_no_generators(directory: Path, env: dict, processes: int = 1) -> list[dict]:
    found = reports(directory)
    if on_double(env):
        assert len(found) == processes, found
        assert all(r["counts"]["generators"] == 0 for r in found), found
    return found


def toy_accuracy(stdout: str) -> float:
    return float(re.search(r"exact match on \d+ held-out sequences: ([\d.]+) %",
                           stdout).group(1))


@pytest.mark.slow
def test_train_toy_learns_the_copy_task(cupy_env, tmp_path):
    """The README's first command, whole (about 30 s on the double: ``slow``, which CI runs)."""
    env = with_report(cupy_env, tmp_path)
    done = command(["train_toy.py", "--backend", "cupy", "--out", tmp_path / "run"], env)
    assert toy_accuracy(done.stdout) >= 99.0, done.stdout[-2000:]
    assert "backend cupy" in done.stdout
    assert_no_generators(tmp_path, env)


def test_train_toy_runs_start_to_end(cupy_env, tmp_path):
    """A short run of the same command: trains, saves, evaluates and reports on the CuPy path
    (that the default run learns is the slow test above)."""
    env = with_report(cupy_env, tmp_path)
    done = command(["train_toy.py", "--backend", "cupy", *TOY_TINY, "--max-steps", 20,
                    "--out", tmp_path / "run"], env)
    assert 0.0 <= toy_accuracy(done.stdout) <= 100.0 and "backend cupy" in done.stdout
    assert checkpoint.load(checkpoint.latest(tmp_path / "run")).step == 20
    assert_no_generators(tmp_path, env)


@pytest.mark.parametrize("cases", ["layernorm", pytest.param("cross-attention (dropout)",
                                                              marks=pytest.mark.slow)])
def test_gradient_check_in_float64(cupy_env, cases, tmp_path):
    """The command on two cases, one with a dropout generator on the device (every case:
    tests/test_gpu.py, under -m slow or -m gpu; the double runs the finite differences'
    thousands of small operations ~9x slower than NumPy)."""
    env = with_report(cupy_env, tmp_path)
    done = command(["-m", "minitfm.gradcheck", "--backend", "cupy", cases], env)
    assert "backend cupy, float64" in done.stdout, done.stdout[-2000:]
    assert re.search(r"^[1-9]\d* passed, 0 failed$", done.stdout, re.M), done.stdout[-2000:]
    assert_no_generators(tmp_path, env)


@pytest.mark.slow
def test_train_wmt_trains_resumes_and_translates(cupy_env, corpus, tmp_path):  # noqa: F811
    env = with_report(cupy_env, tmp_path)
    out = tmp_path / "run"
    command(["train_wmt.py", *corpus_args(corpus), *WMT_TINY, "--max-steps", 4,
             "--save-every", 2, "--valid-every", 2, "--out", out], env)
    command(["train_wmt.py", *corpus_args(corpus), *WMT_TINY, "--max-steps", 6,
             "--save-every", 2, "--valid-every", 2, "--out", out, "--resume"], env)
    assert [step for step, _ in checkpoint.list_checkpoints(out)] == [2, 4, 6]
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "valid_bleu" in r] == [2, 4, 6]
    sentences = "the cat sees a dog\na big red house\n"
    done = command(["-m", "minitfm.translate", "--checkpoint",
                    checkpoint.checkpoint_path(out, 6), "--beam", 3], env, stdin=sentences)
    assert len(done.stdout.splitlines()) == 2
    assert_no_generators(tmp_path, env, processes=3)


def final_params(out: Path) -> dict:
    return checkpoint.load(checkpoint.latest(out), with_optimizer=False).params


@pytest.mark.slow
@pytest.mark.mpi
def test_two_workers_on_two_devices_equal_one_with_doubled_update_freq(cupy_env, corpus,  # noqa: F811
                                                                        tmp_path):
    """mpiexec -n 2 on two emulated devices (NCCL between them) trains the parameters one
    worker trains with --update-freq 2: the same batches, dropout masks and update."""
    options = [*corpus_args(corpus), *WMT_TINY, "--max-steps", 4, "--save-every", 4,
               "--valid-every", 0]
    one, two = tmp_path / "one", tmp_path / "two"
    command(["train_wmt.py", *options, "--update-freq", 2, "--out", one],
            with_report(cupy_env, tmp_path / "r1"))
    done = command(["train_wmt.py", *options, "--update-freq", 1, "--out", two],
                   with_report(cupy_env, tmp_path / "r2", devices=2), workers=2)
    assert "GPU 0" in done.stdout + done.stderr or not on_double(cupy_env)
    a, b = final_params(one), final_params(two)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert_no_generators(tmp_path / "r2", cupy_env, processes=2)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("script", ["train_toy.py", "train_lm.py"])
def test_two_workers_take_one_device_each(cupy_env, script, tmp_path):
    """Each worker selects the device of its local rank (the double's NCCL, like NCCL, refuses
    two ranks on one device, so the run itself proves it) and says so in its first lines."""
    if script == "train_toy.py":
        args = [script, *TOY_TINY, "--max-steps", 6, "--out", tmp_path / "run"]
    else:
        text = tmp_path / "text.txt"
        text.write_text("anna sees the ball. bob has a hat.\n" * 60, encoding="utf-8")
        args = [script, "--data", text, *LM_SMALL, "--max-steps", 6, "--out", tmp_path / "run",
                "--cache-dir", tmp_path / "cache"]
    env = with_report(cupy_env, tmp_path, devices=2)
    done = command([*args, "--backend", "cupy"], env, workers=2)
    printed = done.stdout + done.stderr
    if on_double(cupy_env):
        assert "GPU 0" in printed, printed[-2000:]
    assert_no_generators(tmp_path, env, processes=2)


@pytest.mark.slow
def test_train_lm_trains_and_samples(cupy_env, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("anna sees the ball. bob has a hat. the cat likes the sun.\n" * 80,
                    encoding="utf-8")
    env = with_report(cupy_env, tmp_path)
    out = tmp_path / "run"
    command(["train_lm.py", "--data", text, *LM_SMALL, "--max-steps", 20, "--out", out,
             "--cache-dir", tmp_path / "cache", "--backend", "cupy"], env)
    new_tokens = 20
    sampled = with_report(cupy_env, tmp_path / "sample")
    done = command(["train_lm.py", "--sample", "--checkpoint", checkpoint.latest(out),
                    "--prompt", "anna", "--max-new-tokens", new_tokens, "--seed", 3,
                    "--backend", "cupy"], sampled)
    assert done.stdout.startswith("anna") and len(done.stdout.rstrip("\n")) == 4 + new_tokens
    assert_no_generators(tmp_path, env)
    for report in assert_no_generators(tmp_path / "sample", sampled):
        # one wait per token, and a few to load the checkpoint and check the prompt
        assert report["counts"]["device_to_host"] <= new_tokens + 3, report
