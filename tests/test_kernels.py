"""The fused kernels (``--kernels fused``): each equal to its plain twin, each compiling with NVRTC,
chosen from the command line, run by the CuPy double as one launch of its twin.

- ``gpu`` (on the double by default, on a device with ``-m gpu``): every layer with a fused
  kernel equals its plain code within the tolerance of ``minitfm.kernelcheck`` (masks bit for
  bit), and every kernel runs in some case;
- ``nvrtc`` (CI's CuPy environment: ``cupy-cuda12x`` and ``nvidia-cuda-nvrtc-cu12``, no GPU):
  every kernel's source compiles for compute_80 and compute_90, and a broken one is refused;
- the commands train with ``--kernels fused`` on the double (CuPy 14 and 13 rules) and reach
  the parameters a plain run reaches (``slow``: whole commands on the double).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from minitfm import backend, checkpoint, cudahost, kernelcheck
from minitfm.speed import fused
from minitfm.cudahost import build
from minitfm.layers import layernorm
from minitfm.speed import layernorm as fast_layernorm

from tests.conftest import cupy_double_env, default_kernels
from tests.test_gpu_commands import WMT_TINY
from tests.test_train_wmt import corpus, corpus_args  # noqa: F401  (corpus: a fixture)
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.gpu
def test_every_fused_layer_equals_its_plain_code(cupy_backend):
    rows = kernelcheck.compare()
    assert all(row["ok"] for row in rows), [row for row in rows if not row["ok"]]
    assert {row["kernel"] for row in rows if "kernel" in row} == set(fused.KERNELS)


@pytest.mark.gpu
def test_a_fused_call_is_one_launch_on_the_double(cupy_backend):
    if not hasattr(cupy_backend, "_double"):
        pytest.skip("launches are counted on the double")
    from minitfm.layers import dropout
    x = backend.to_device(np.ones((64, 33), dtype=np.float32))
    fused.use("fused")
    try:
        with cupy_backend._double.counting() as counted:
            dropout.forward(x, 0.1, backend.rng(0, 1, 0))
    finally:
        fused.use("plain")
    assert counted.launches == 1 and counted.device_to_host == 0, counted


def test_fused_kernels_run_on_cupy_only(numpy_backend):
    """On NumPy ``fused`` chooses the row passes (minitfm.speed.rows): no kernel runs there."""
    fused.use("plain")
    with pytest.raises(backend.BackendError, match="unknown kernels 'fast'"):
        fused.use("fast")
    assert fused.choice() == "plain"
    fused.use("fused")
    assert fused.choice() == "fused"
    assert not fused.active(np.ones(3, dtype=np.float32))


def test_the_double_refuses_to_run_cuda_and_checks_launches(cupy_backend):
    if not hasattr(cupy_backend, "_double"):
        pytest.skip("the double's own rules")
    kernel = cupy_backend.RawKernel("extern \"C\" __global__ void k(float* x) {}", "k")
    x = cupy_backend.zeros(4, dtype=np.float32)
    with pytest.raises(NotImplementedError, match="cannot compile or run CUDA"):
        kernel((1,), (32,), (x,))
    with pytest.raises(TypeError, match="NumPy scalars"):
        cupy_backend._double.emulate(kernel, (1,), (32,), (x, 3), lambda *a: None)
    with pytest.raises(ValueError, match="C-contiguous"):
        cupy_backend._double.emulate(kernel, (1,), (32,), (x[::2],), lambda *a: None)
    with pytest.raises(TypeError, match="'options' has incorrect type"):
        cupy_backend.RawKernel("", "k", options=["-O3"])


# ---- NVRTC: every kernel compiles for the GPUs minitfm targets ----------------------------------

ARCHITECTURES = ("compute_80", "compute_90")      # A100, H100


@pytest.fixture(scope="module")
def nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc as module
        module.getVersion()
    except Exception as exc:      # ImportError, or the NVRTC library missing
        pytest.skip(f"NVRTC is not usable here ({exc}): install cupy-cuda12x and "
                    f"nvidia-cuda-nvrtc-cu12")
    return module


def compile_ptx(nvrtc, source: str, name: str, architecture: str) -> str:
    program = nvrtc.createProgram(source, f"{name}.cu", [], [])
    try:
        nvrtc.compileProgram(program, [f"--gpu-architecture={architecture}", *fused.OPTIONS])
        ptx = nvrtc.getPTX(program)
        return ptx.decode() if isinstance(ptx, bytes) else ptx
    except Exception as exc:
        raise AssertionError(f"{name}: {exc}\n{nvrtc.getProgramLog(program)}") from exc
    finally:
        nvrtc.destroyProgram(program)


@pytest.mark.nvrtc
@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("name", sorted(fused.KERNELS))
def test_every_kernel_compiles_with_nvrtc(nvrtc, name, architecture):
    ptx = compile_ptx(nvrtc, fused.KERNELS[name].source, name, architecture)
    assert f".entry {name}(" in ptx


@pytest.mark.nvrtc
def test_nvrtc_refuses_a_broken_kernel(nvrtc):
    broken = fused.KERNELS["dropout_backward"].source.replace("dx[i] =", "dx[i] = undeclared +")
    with pytest.raises(AssertionError, match="undeclared"):
        compile_ptx(nvrtc, broken, "dropout_backward", "compute_90")


# ---- the commands with --kernels fused, on the double ------------------------------------------

DROPOUTS = ["--dropout", "0.1", "--attention-dropout", "0.1", "--relu-dropout", "0.1",
            "--word-dropout", "0.1",
            "--clip-norm", "1.0", "--max-steps", "3", "--save-every", "3", "--valid-every", "0"]


# whole commands on the double, behind the slow marker (CI runs them): every fused layer is held
# to its plain code in this process on every run (above), every kernel's source by the host check
@pytest.mark.slow
@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-4), ("fp16", 1e-3)])
def test_train_wmt_with_fused_kernels_reaches_the_plain_parameters(cupy_env, corpus,  # noqa: F811
                                                                   precision, tolerance,
                                                                   tmp_path):
    """Every dropout on, clipping on: the fused run draws the plain run's masks, so both reach
    the same parameters (up to the order of sums, and in fp16 a float16 rounding that a
    different sum may tip), in far fewer launches."""
    finals = {}
    for kernels in ("plain", "fused"):
        env = dict(cupy_env, CUPY_DOUBLE_REPORT=str(tmp_path / f"{kernels}.json"))
        out = tmp_path / kernels
        done = forkserver.run([sys.executable, "train_wmt.py", *corpus_args(corpus), *WMT_TINY,
                               *DROPOUTS, "--kernels", kernels, "--precision", precision,
                               "--out", str(out)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert ("fused kernels" in done.stdout.splitlines()[0]) == (kernels == "fused")
        finals[kernels] = checkpoint.load(checkpoint.latest(out), with_optimizer=False).params
        if "CUPY_DOUBLE_RULES" in cupy_env:
            counts = json.loads((tmp_path / f"{kernels}.json").read_text())["counts"]
            finals[kernels + " launches"] = counts["launches"]
    for name, value in finals["plain"].items():
        fused_value = finals["fused"][name]
        if name.endswith(("b_qkv", "b_kv")):    # the key bias: its gradient is 0 in exact math
            keys = slice(value.size // 3, 2 * value.size // 3) if name.endswith("b_qkv") \
                else slice(0, value.size // 2)  # (a row's scores all move by q.b_k), so Adam
            value, fused_value = (np.delete(v, keys) for v in (value, fused_value))  # scales
        np.testing.assert_allclose(fused_value, value, rtol=tolerance,       # rounding noise
                                   atol=tolerance / 100, err_msg=name)
    if "plain launches" in finals:                  # the whole command, decoding included
        launches = (finals["fused launches"], finals["plain launches"])
        assert launches[0] < 0.6 * launches[1], launches


@pytest.mark.parametrize("kernels, words", [
    (None, "row passes on 2 threads with compiled loops (--kernels fused)"),
    ("fused", "row passes on 2 threads with compiled loops (--kernels fused)"),
    ("plain", "plain array code (--kernels plain)")])
def test_on_numpy_the_first_line_says_which_code_runs(tmp_path, kernels, words):
    done = forkserver.run([sys.executable, "train_toy.py", "--backend", "numpy", "--threads", "2",
                           "--max-steps", "1", "--out", str(tmp_path / "run"), "--quiet"]
                          + (["--kernels", kernels] if kernels else []), cwd=ROOT,
                          env=default_kernels(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("placement: 2 BLAS threads (--threads") and first.endswith(words)


def test_minitfm_kernels_chooses_where_the_option_is_absent(tmp_path):
    """MINITFM_KERNELS is --kernels' default (as MINITFM_BACKEND is --backend's), named in the
    first line; a value that is not a choice is bad usage, refused before any work."""
    def toy(value, *more):
        return forkserver.run([sys.executable, "train_toy.py", "--backend", "numpy", "--max-steps",
                               "1", "--out", str(tmp_path / value), "--quiet", *more], cwd=ROOT,
                              env={**default_kernels(), "MINITFM_KERNELS": value},
                              capture_output=True, text=True, timeout=120)
    done = toy("plain")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].endswith("; plain array code (MINITFM_KERNELS=plain)")
    done = toy("gpu")
    assert done.returncode == 2 and done.stdout == "" and not (tmp_path / "gpu").exists()
    assert done.stderr == "error: MINITFM_KERNELS='gpu': unknown kernels 'gpu': set it to plain " \
                          "or fused, or unset it\n"


def test_the_kernel_check_command(cupy_env, tmp_path):
    """``python -m minitfm.kernelcheck`` on the CuPy path (the double, 14 and 13: twins against
    the plain code; a GPU with -m gpu) passes; without CuPy it is a usage error."""
    done = forkserver.run([sys.executable, "-m", "minitfm.kernelcheck"], cwd=ROOT, env=cupy_env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{len(fused.KERNELS) + len(kernelcheck.CASES)} passed, 0 failed" in done.stdout


def test_the_kernel_check_needs_cupy():
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    done = forkserver.run([sys.executable, "-m", "minitfm.kernelcheck"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: backend 'cupy' was requested")


# ---- the kernels' own source on the CPU (minitfm.cudahost) --------------------------------------

def test_the_kernel_check_on_the_host_runs_every_kernel(tmp_path):
    """``python -m minitfm.kernelcheck --host``: no GPU, no CuPy; every kernel's CUDA source
    compiled for the CPU and run in every case, each launch held to its twin."""
    done = forkserver.run([sys.executable, "-m", "minitfm.kernelcheck", "--host"], cwd=ROOT,
                          env=dict(os.environ, MINITFM_CACHE=str(tmp_path)),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{len(fused.KERNELS) + len(kernelcheck.CASES)} passed, 0 failed" in done.stdout
    for name in fused.KERNELS:
        assert re.search(rf"kernel {name} +launched [1-9]\d* times, against its twin: worst",
                         done.stdout), name
    units = {build.unit_of(k.source)[1] for k in fused.KERNELS.values()}   # comments aside
    libraries = [p.name for p in (tmp_path / "cudahost").glob("*.so")]
    assert len([n for n in libraries if not n.startswith("runtime-")]) == len(units), done.stdout
    assert len(libraries) == len(units) + 1, libraries             # and the runtime library


def planted(kernel: fused.Kernel, old: str, new: str, monkeypatch) -> None:
    """Run a copy of ``kernel``'s source with ``old`` (found once) replaced by ``new`` on the host
    in the kernel's place; the shipped source is left as it is."""
    assert kernel.source.count(old) >= 1, old
    copy = kernel.source.replace(old, new, 1)
    monkeypatch.setattr(kernel, "host", cudahost.HostKernel(copy, kernel.name))


def host_check(capsys) -> tuple[int, str]:
    """``kernelcheck --host``'s status and output; a faulting case's row is ``case FAULT ...``."""
    status = kernelcheck.main(["--host"])
    return status, capsys.readouterr().out


def fault_row(out: str, case: str) -> str:
    rows = [line for line in out.splitlines() if line.startswith(f"{case} ")]
    assert len(rows) == 1 and " FAULT kernel " in rows[0], out
    return rows[0].split(" FAULT ", 1)[1]


def test_a_wrong_sign_in_a_kernel_is_caught_by_name(numpy_backend, monkeypatch, capsys):
    planted(fast_layernorm.BACKWARD, "float g = dy[row + c] * gamma[c] - mean_g;",
            "float g = dy[row + c] * gamma[c] + mean_g;", monkeypatch)      # term 2's sign
    status, out = host_check(capsys)
    differs = [line.split()[:2] for line in out.splitlines() if "DIFFERS" in line]
    assert status == 1 and ["layernorm", "worst"] in differs, out
    assert [name for what, name in differs if what == "kernel"] == ["layernorm_backward"], out


BLOCK_SUM_STORE = "    if (lane == 0) scratch[warp] = v;\n    __syncthreads();\n"


def test_a_barrier_in_a_branch_is_caught_as_a_deadlock(numpy_backend, monkeypatch, capsys):
    planted(fast_layernorm.FORWARD, BLOCK_SUM_STORE,
            "    if (lane == 0) scratch[warp] = v;\n    if (warp == 0) __syncthreads();\n",
            monkeypatch)
    status, out = host_check(capsys)
    assert status == 1 and fault_row(out, "layernorm").startswith(
        "kernel layernorm_forward, block (0, 0, 0): deadlock: the threads of the block wait at "
        "different barriers: threads 0-31 at __syncthreads() on line 7, threads 32-255 at "
        "__syncthreads() on line 13"), out
    assert re.search(r"kernel layernorm_forward .*FAULT in case layernorm", out), out


def test_an_index_one_past_a_row_is_caught(numpy_backend, monkeypatch, capsys):
    planted(fast_layernorm.FORWARD, "for (int c = threadIdx.x; c < d; c += blockDim.x) {\n"
                               "        float v = xhat[row + c] * r;",
            "for (int c = threadIdx.x; c <= d; c += blockDim.x) {\n"
            "        float v = xhat[row + c] * r;", monkeypatch)
    status, out = host_check(capsys)
    assert status == 1 and fault_row(out, "layernorm").startswith(
        "kernel layernorm_forward, block (0, 0, 0), thread (0, 0, 0): reads gamma[512], outside "
        "its 512 elements"), out
    line = next(i for i, text in enumerate(fast_layernorm.FORWARD.source.splitlines(), 1)
                if "v = v * gamma[c] + beta[c];" in text)
    assert f"line {line} of the kernel's source: v = v * gamma[c] + beta[c];" in out


def test_a_removed_barrier_is_caught_as_a_race_on_shared_memory(numpy_backend, monkeypatch,
                                                                capsys):
    free_again = "    __syncthreads();                                  // scratch is free again\n"
    planted(fast_layernorm.FORWARD, free_again, "", monkeypatch)
    status, out = host_check(capsys)
    assert status == 1 and fault_row(out, "layernorm").startswith(
        "kernel layernorm_forward, block (0, 0, 0), thread (0, 0, 0): writes __shared__ "
        "scratch[0], which other threads of this block read since the last __syncthreads(): a "
        "race"), out


# a whole command on the double, compiling every kernel anew, behind the slow marker (CI runs
# it): every kernel, the loss scaler's among them, is held to its twin on every run by the host
# check above
@pytest.mark.slow
@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-5), ("fp16", 1e-3)])
def test_training_through_the_host_executed_kernels_keeps_the_plain_losses(precision, tolerance,
                                                                           tmp_path):
    """train_toy.py on the CuPy double with every fused kernel's own source executed on the CPU
    (CUPY_DOUBLE_KERNELS=host) in the real loop: dropout everywhere, clipping, the optimizer,
    and in fp16 the loss scaler's kernels. Its losses are the plain run's, up to the order of
    sums (and in fp16 a float16 rounding that another order of sums may tip)."""
    cache = tmp_path / "cache"
    env = dict(cupy_double_env("14"), CUPY_DOUBLE_KERNELS="host", MINITFM_CACHE=str(cache))
    losses = {}
    for kernels in ("plain", "fused"):
        out = tmp_path / kernels
        done = forkserver.run([sys.executable, "train_toy.py", "--backend", "cupy", "--kernels",
                               kernels, "--precision", precision, "--max-steps", "3",
                               "--d-model", "16", "--d-ff", "32", "--length", "6",
                               "--batch-size", "8", "--log-every", "1", "--clip-norm", "1.0",
                               "--eval-size", "2", "--examples", "0", "--valid-every", "0",
                               "--quiet", "--out", str(out)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        losses[kernels] = [json.loads(line)["loss"] for line in
                           (out / "log.jsonl").read_text().splitlines() if '"loss"' in line]
        compiled = list((cache / "cudahost").glob("*.so")) if cache.exists() else []
        assert bool(compiled) == (kernels == "fused"), compiled   # the kernels ran, compiled
    assert len(losses["fused"]) == len(losses["plain"]) == 3
    np.testing.assert_allclose(losses["fused"], losses["plain"], rtol=tolerance)
