"""--precision fp32|tf32: chosen once per process, before the first product, and stated in the
run's first line; on the CuPy path it reaches CuPy's compute type (the double models it, and
counts every float32 GEMM as run on TF32 tensor cores or in plain float32)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minitfm import backend
from minitfm.backend import products
from minitfm.cli import exits, placing
from minitfm.models import translator

from .conftest import cupy_double, cupy_double_env
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
TOY = ["train_toy.py", "--preset", "tiny", "--max-steps", "2", "--eval-size", "4", "--examples",
       "0", "--quiet", "--backend", "cupy"]


@pytest.fixture
def double():
    """The double as the active backend; CuPy's float32 compute type put back afterwards."""
    previous = backend.name
    with cupy_double("14") as cupy:
        backend.use("cupy")
        saved = cupy._core.get_compute_type(np.float32)
        try:
            yield cupy
        finally:
            cupy._core.set_compute_type(np.float32, saved)
            backend.use(previous)


def test_numpy_has_fp32_and_fp16(numpy_backend):
    assert products.set_precision(None) == ("fp32", "NumPy: float32 only")
    assert products.set_precision("fp32") == ("fp32", "asked")
    with pytest.raises(backend.BackendError, match="tf32 runs on a GPU's tensor cores.*use fp32"):
        products.set_precision("tf32")
    assert products.precision() == "fp32"
    with pytest.raises(backend.BackendError, match="unknown precision 'fp8'"):
        products.set_precision("fp8")
    with pytest.raises(backend.BackendError, match="'bf16': use fp32, tf32, fp16 .NumPy has no"):
        products.set_precision("bf16")
    assert products.set_precision("fp16") == ("fp16", "asked") and products.precision() == "fp16"


def test_tf32_is_the_default_from_compute_capability_8(double):
    types = double._core._routines_linalg
    assert products.set_precision(None) == ("tf32", "the default on compute capability 9.0")
    assert double._core.get_compute_type(np.float32) == types.COMPUTE_TYPE_TF32
    cfg = translator.Config.preset("tiny")
    params = translator.init_params(cfg, 0)
    src, tgt = np.array([[5, 3, 2]]), np.array([[1, 5, 3, 2]])
    with double._double.counting() as counted:
        translator.loss_and_grads(params, cfg, src, tgt)
    assert counted.tf32_products > 0 and counted.fp32_products == 0, counted
    assert products.set_precision("fp32") == ("fp32", "asked")
    assert double._core.get_compute_type(np.float32) == types.COMPUTE_TYPE_DEFAULT
    with double._double.counting() as counted:
        translator.loss_and_grads(params, cfg, src, tgt)
    assert counted.tf32_products == 0 and counted.fp32_products > 0, counted


def test_an_older_gpu_runs_fp32_and_refuses_tf32(double, monkeypatch):
    monkeypatch.setattr(double.cuda._state, "COMPUTE_CAPABILITY", 75)
    assert products.set_precision(None) == ("fp32", "the default on compute capability 7.5")
    with pytest.raises(backend.BackendError, match="this GPU has compute capability 7.5: use fp32"):
        products.set_precision("tf32")


def test_the_command_line_names_the_option(numpy_backend):
    with pytest.raises(exits.UsageError, match=r"^--precision tf32: tf32 runs on a GPU"):
        placing.place(None, 1, "tf32", announce=False)


def run(args: list, env: dict) -> subprocess.CompletedProcess:
    done = forkserver.run([sys.executable, *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_a_trainer_sets_it_before_its_first_product(tmp_path):
    """Every float32 GEMM of the run is on TF32 (none ran before the setting), or with
    --precision fp32 none is; the first line says which, and why."""
    for precision, line in ((None, "precision tf32 (the default on compute capability 9.0)"),
                            ("fp32", "precision fp32 (--precision)")):
        report = tmp_path / f"{precision}.json"
        extra = ["--precision", precision] if precision else []
        done = run([*TOY, *extra, "--out", tmp_path / f"run-{precision}"],
                   cupy_double_env("14", report=report))
        first = done.stdout.splitlines()[0]
        assert first.startswith("placement: GPU 0") and first.endswith(line), first
        counts = json.loads(report.read_text())["counts"]
        products = (counts["tf32_products"], counts["fp32_products"])
        assert (products[1] if precision is None else products[0]) == 0, counts
        assert (products[0] if precision is None else products[1]) > 0, counts
