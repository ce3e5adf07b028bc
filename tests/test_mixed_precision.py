"""Mixed precision (``--precision fp16``): float16 products with float32 master weights and a
dynamic loss scale, through the command lines, on NumPy and on the CuPy double (14 and 13).

- a tiny model trained in fp16 follows its float32 loss curve within 1 % at every logged window
  (measured: 0.04 %) on a fixed seed, and the curves are not the same numbers (fp16 ran);
- an overflow (an initial loss scale of 1e30) skips the update, on the device, and halves the
  scale: the parameters and Adam's moments stay as they were, the log says so (NumPy and the
  double);
- a run stopped and resumed continues bit for bit: parameters, moments and the loss scale (NumPy
  and the double);
- the loss scaler's rule (GradScaler's) and the masked update, in the library.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minitfm import backend, checkpoint, flat, gradscale, optim
from minitfm.backend import products

from tests.test_train_wmt import corpus  # noqa: F401  (a fixture: a tiny en-de corpus)
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
TOY = ["train_toy.py", "--preset", "tiny", "--eval-size", "10", "--examples", "0", "--quiet"]
CURVE_TOLERANCE = 0.01          # |loss fp16 - loss fp32| / loss fp32, every logged window


def run(args: list, env: dict | None = None) -> subprocess.CompletedProcess:
    done = forkserver.run([sys.executable, *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def windows(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())
            if "tokens_per_s" in r]


def test_fp16_follows_the_fp32_loss_curve(tmp_path):
    curves = {}
    for precision in ("fp32", "fp16"):
        out = tmp_path / precision
        done = run([*TOY, "--backend", "numpy", "--max-steps", 60, "--precision", precision,
                    "--out", out])
        assert f"precision {precision} (--precision)" in done.stdout.splitlines()[0]
        curves[precision] = windows(out)
    fp32, fp16 = curves["fp32"], curves["fp16"]
    assert [r["step"] for r in fp16] == [r["step"] for r in fp32] == list(range(10, 61, 10))
    gaps = [abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(fp32, fp16)]
    assert max(gaps) <= CURVE_TOLERANCE, gaps
    assert any(gap > 0 for gap in gaps), "fp16 gave float32's numbers: were products float16?"
    assert fp16[-1]["loss"] < fp16[0]["loss"] - 0.1              # it learns
    assert all(r["loss_scale"] == 2.0 ** 16 and r["skipped"] == 0 for r in fp16)
    assert all("loss_scale" not in r for r in fp32)


# NumPy on every run; the CuPy path on the double, a whole command each, under the slow marker
# (CI runs it; ``-m gpu`` on a device)
WHERE = ["numpy", pytest.param("cupy", marks=pytest.mark.slow)]


def backend_and_env(where: str, cupy_env: dict) -> tuple[list, dict | None]:
    """``--backend`` and the environment of a run on NumPy (once) or on the double (14, 13)."""
    if where == "numpy" and cupy_env.get("CUPY_DOUBLE_RULES") == "13":
        pytest.skip("NumPy runs once")
    return ["--backend", where], (cupy_env if where == "cupy" else None)


@pytest.mark.parametrize("where", WHERE)
def test_an_overflow_skips_the_update_and_halves_the_scale(where, cupy_env, tmp_path):
    out = tmp_path / "run"
    chosen, env = backend_and_env(where, cupy_env)
    run([*TOY, *chosen, "--max-steps", 2, "--save-every", 1, "--precision", "fp16",
         "--loss-scale", 1e30, "--out", out], env)
    first, second = (checkpoint.load(checkpoint.checkpoint_path(out, s)) for s in (1, 2))
    scale = float(np.float32(1e30))
    assert first.extra["loss_scaler"]["scale"] == np.float32(scale / 2)
    assert second.extra["loss_scaler"] == {"scale": float(np.float32(scale / 4)),
                                           "good_steps": 0, "skipped": 2, "last_skipped": True,
                                           "growth_interval": gradscale.GROWTH_INTERVAL}
    for name, value in first.params.items():          # no update was applied: nothing moved
        np.testing.assert_array_equal(second.params[name], value, err_msg=name)
        assert not second.optimizer_state["m"][name].any()
        assert not second.optimizer_state["v"][name].any()
    (logged,) = windows(out)
    assert (logged["step"], logged["skipped"], logged["loss_scale"]) == (2, 2, scale / 4)
    assert "grad_norm" not in logged                  # the skipped update's norm is not finite


@pytest.mark.parametrize("where", WHERE)
def test_a_resumed_fp16_run_continues_bit_for_bit(where, cupy_env, tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    chosen, env = backend_and_env(where, cupy_env)
    common = [*TOY, *chosen, "--precision", "fp16", "--loss-scale", 2.0 ** 24]
    run([*common, "--max-steps", 8, "--save-every", 8, "--out", whole], env)
    run([*common, "--max-steps", 4, "--save-every", 4, "--out", parts], env)
    run([*common, "--max-steps", 8, "--save-every", 8, "--out", parts, "--resume"], env)
    a, b = (checkpoint.load(checkpoint.checkpoint_path(d, 8)) for d in (whole, parts))
    assert a.extra["loss_scaler"] == b.extra["loss_scaler"]
    assert a.extra["loss_scaler"]["skipped"] > 0          # 2^24 overflowed: skips carried over
    for name, value in a.params.items():
        np.testing.assert_array_equal(b.params[name], value, err_msg=name)
        for moment in ("m", "v"):
            np.testing.assert_array_equal(b.optimizer_state[moment][name],
                                          a.optimizer_state[moment][name])


@pytest.mark.slow
@pytest.mark.gpu
def test_fp16_on_the_cupy_path_runs_every_2d_product_in_float16(cupy_env, tmp_path):
    """Under the double (CuPy 14 and 13): the same run as on NumPy, its 2-D products float16
    GEMMs (none in float32), nothing copied to the host by an update, fused or not."""
    numpy_out = tmp_path / "numpy"
    run([*TOY, "--backend", "numpy", "--max-steps", 20, "--precision", "fp16", "--out", numpy_out])
    for kernels in ("plain", "fused"):
        out, report = tmp_path / kernels, tmp_path / f"{kernels}.json"
        run([*TOY, "--backend", "cupy", "--max-steps", 20, "--precision", "fp16", "--kernels",
             kernels, "--out", out], dict(cupy_env, CUPY_DOUBLE_REPORT=str(report)))
        if "CUPY_DOUBLE_RULES" in cupy_env:
            counts = json.loads(report.read_text())["counts"]
            assert counts["fp16_products"] > 0 and counts["fp32_products"] == 0, counts
            assert counts["tf32_products"] == 0, counts
        for a, b in zip(windows(numpy_out), windows(out)):
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), (kernels, a, b)


# ---- the library ------------------------------------------------------------------------------

def flat_pair(seed: int = 0):
    rng = np.random.default_rng(seed)
    shapes = {"w": (5, 4), "b": (4,)}
    params = flat.flatten({k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()})
    return params, flat.zeros_like(params)


def test_the_scale_grows_after_the_interval_and_halves_on_an_overflow(numpy_backend):
    params, grads = flat_pair()
    scaler = gradscale.LossScaler(8.0, growth_interval=3)
    seen = []
    for step in range(7):
        grads.buffer[...] = 8.0 if step != 4 else np.inf
        norm = scaler.unscale(grads)
        seen.append((float(scaler.state[0]), float(norm)))
    assert [s for s, _ in seen] == [8, 8, 16, 16, 8, 8, 8]
    assert np.isinf(seen[4][1]) and seen[0][1] == pytest.approx(np.sqrt(24) * 1.0)
    assert scaler.state_dict() == {"scale": 8.0, "good_steps": 2, "skipped": 1,
                                   "last_skipped": False, "growth_interval": 3}
    again = gradscale.LossScaler()
    again.load_state_dict(scaler.state_dict())
    np.testing.assert_array_equal(again.state, scaler.state)


def test_a_skipped_update_changes_nothing_and_is_not_counted_by_the_bias_correction(
        numpy_backend):
    params, grads = flat_pair()
    adam, scaler = optim.Adam(params, weight_decay=0.1), gradscale.LossScaler(1.0)
    grads.buffer[...] = 0.5
    scaler.unscale(grads)
    adam.update(params, grads, 1e-2, scaler)
    before = [a.copy() for a in (params.buffer, adam.m.buffer, adam.v.buffer)]
    grads.buffer[...] = 0.5
    grads.buffer[2] = np.nan                                       # overflow: skipped
    scaler.unscale(grads)
    adam.update(params, grads, 1e-2, scaler)
    for a, b in zip(before, (params.buffer, adam.m.buffer, adam.v.buffer)):
        np.testing.assert_array_equal(b, a)
    # the next update is the second applied one: its bias correction is Adam's t = 2
    grads.buffer[...] = 0.5 * float(scaler.scale)           # the scale was halved: 0.5
    scaler.unscale(grads)
    adam.update(params, grads, 1e-2, scaler)
    reference, reference_grads = flat_pair()
    plain = optim.Adam(reference, weight_decay=0.1)
    for _ in range(2):
        reference_grads.buffer[...] = 0.5
        plain.update(reference, reference_grads, 1e-2)
    np.testing.assert_allclose(params.buffer, reference.buffer, rtol=1e-6)
    assert adam.step == 3 and int(scaler.state[2]) == 1


def test_the_loss_scale_must_be_a_float32_number(numpy_backend):
    with pytest.raises(ValueError, match="positive float32 number"):
        gradscale.LossScaler(1e39)
    params, grads = flat_pair()
    with pytest.raises(TypeError, match="flat gradient buffer"):
        gradscale.LossScaler().unscale(dict(grads))
    assert products.precision() == "fp32"


def lm_args(tmp_path: Path) -> list:
    from tests.test_train_lm import SMALL
    text = tmp_path / "text.txt"
    text.write_text("anna sees the ball. bob has a hat. the cat likes the sun.\n" * 80,
                    encoding="utf-8")
    return ["train_lm.py", "--data", text, *SMALL, "--max-steps", 12, "--precision", "fp16",
            "--cache-dir", tmp_path / "cache"]


@pytest.mark.parametrize("where", WHERE)
def test_train_lm_trains_in_fp16(where, cupy_env, tmp_path):
    """The language model's trainer in fp16, on NumPy and under the double (14 and 13)."""
    out = tmp_path / "run"
    chosen, env = backend_and_env(where, cupy_env)
    done = run([*lm_args(tmp_path), *chosen, "--out", out], env)
    assert "precision fp16" in done.stdout.splitlines()[0]
    logged = windows(out)
    assert logged and all(np.isfinite(r["loss"]) and r["loss_scale"] > 0 for r in logged)
    assert logged[-1]["loss"] < logged[0]["loss"]


def test_train_wmt_trains_in_fp16_on_numpy(corpus, tmp_path):  # noqa: F811
    from tests.test_gpu_commands import WMT_TINY
    from tests.test_train_wmt import corpus_args
    out = tmp_path / "run"
    tiny = [a if a != "cupy" else "numpy" for a in WMT_TINY]
    run(["train_wmt.py", *corpus_args(corpus), *tiny, "--max-steps", 4, "--save-every", 4,
         "--valid-every", 0, "--precision", "fp16", "--out", out])
    final = checkpoint.load(checkpoint.latest(out))
    assert final.step == 4 and final.extra["loss_scaler"]["scale"] > 0


@pytest.mark.gpu
def test_the_float16_products_read_every_layout_cublas_is_given(cupy_backend):
    """mixed.matmul on CuPy calls cuBLAS gemmEx itself (float16 A and B, float32 C): each
    operand C- or F-contiguous (W or W^T), the result new, C-contiguous or a transposed view;
    against float32 products of the same float16 values on the host."""
    from minitfm.speed import mixed
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(np.float16) for s in ((5, 3), (3, 4)))
    expected = a.astype(np.float32) @ b.astype(np.float32)
    layouts = {"C": lambda x: backend.to_device(x),
               "F": lambda x: backend.to_device(np.ascontiguousarray(x.T)).T}
    for (ka, la), (kb, lb) in [(p, q) for p in layouts.items() for q in layouts.items()]:
        for into in ("new", "C", "F"):
            out = None if into == "new" else (
                backend.xp.zeros((5, 4), dtype="float32") if into == "C"
                else backend.xp.zeros((4, 5), dtype="float32").T)
            got = mixed.matmul(la(a), lb(b), out=out)
            assert got.dtype == np.float32 and (out is None or got is out)
            np.testing.assert_allclose(backend.to_host(got), expected, rtol=1e-6, atol=1e-6,
                                       err_msg=f"a {ka}, b {kb}, out {into}")
