"""The GPU check's training measurements: the ``base`` preset's update against PyTorch on the same
card, the ``big`` preset's largest batch, and Multi30k trained for a few minutes.

Each contender of the ``base`` comparison trains the same model (bench_torch.py's PyTorch twin of
the translator) on the same random batch of full-length sentences (bench_train.make_batch): one
update is one batch of about ``--tokens`` target tokens. Its first step (where CuPy compiles its
kernels) is reported apart; the step time is the median of the timed steps.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import bench_torch
import bench_train
import gpu_check_device as device

from minitfm import backend, flat, optim
from minitfm.backend import products
from minitfm.speed import fused
from minitfm.models import translator

ROOT = Path(__file__).resolve().parents[1]
CONTENDERS = (("minitfm", "fp32"), ("minitfm", "tf32"), ("minitfm fused", "tf32"),
              ("minitfm fused", "fp16"), ("PyTorch eager", "fp32"), ("PyTorch eager", "tf32"),
              ("PyTorch eager", "amp"))
PEAK_OF = {"fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "amp": "fp16"}   # fp16 tensor cores
GIB = 2 ** 30


@dataclass(frozen=True)
class Sizes:
    """What the check measures with: real sizes on a GPU, tiny ones with ``--smoke``."""
    model: dict          # overrides of every preset (empty: the presets as they are)
    tokens: int          # target tokens of the base update
    length: int          # tokens per sentence, both sides
    warmup: int
    steps: int
    big_start: int       # the big search: first --max-tokens, largest tried, sentence length
    big_cap: int
    big_length: int
    peak_n: int          # side of the products that measure a peak where no table has one
    multi30k: tuple      # options added to train_wmt.py

    def config(self, preset: str) -> translator.Config:
        return translator.Config.preset(preset, **self.model)


FULL = Sizes(model={}, tokens=25_000, length=32, warmup=2, steps=3, big_start=8192,
             big_cap=1 << 18, big_length=64, peak_n=8192, multi30k=())
SMOKE = Sizes(model=dict(src_vocab=64, tgt_vocab=64, n_layers=1, d_model=32, n_heads=4,
                         d_ff=64),
              tokens=48, length=8, warmup=1, steps=1, big_start=64, big_cap=1 << 14,
              big_length=8, peak_n=64,
              multi30k=("--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32",
                        "--vocab-size", "64", "--max-tokens", "256", "--warmup", "10",
                        "--valid-bleu-sentences", "8", "--max-steps", "3", "--log-every", "1"))


def error_text(exc: BaseException) -> str:
    """An exception in one line, and where it was raised."""
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    place = f" (at {Path(where[0].filename).name}:{where[0].lineno})" if where else ""
    return f"{type(exc).__name__}: {exc}{place}"


def timed(step: Callable, sync: Callable, sizes: Sizes) -> dict:
    """The first step's seconds (kernels compiled there) and the median of the timed ones."""
    times = []
    for _ in range(sizes.warmup + sizes.steps):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return {"first_step_s": times[0], "step_s": statistics.median(times[sizes.warmup:])}


# ---- the base update against PyTorch -------------------------------------------------------------

def minitfm_row(cfg, rows: int, sizes: Sizes, precision: str, kernels: str = "plain") -> dict:
    device.release_cupy_memory()
    try:
        products.set_precision(precision)
        fused.use("fused" if kernels == "fused" else "plain")
        step = bench_train.make_step(cfg, rows, sizes.length, sizes.length)
        row = timed(step, device.sync, sizes)
        row["peak_memory_gib"] = device.cupy_pool_bytes() / GIB
        row["launches_per_update"], row["launches_counted_by"] = device.count_launches(step)
        return row
    finally:
        step = None
        device.release_cupy_memory()
        products.set_precision(None)
        fused.use("plain")


def torch_row(cfg, rows: int, sizes: Sizes, precision: str) -> dict:
    torch, version = device.import_torch()
    if torch is None:
        return {"status": "skipped", "why": f"PyTorch is {version}"}
    cuda = torch.cuda.is_available()
    if not cuda and precision != "fp32":
        return {"status": "skipped", "why": f"{precision} needs PyTorch with a CUDA device"}
    if not cuda:
        return {**torch_timing(torch, cfg, rows, sizes, precision, "cpu"),
                "device": "cpu (PyTorch has no CUDA device here)"}
    device.release_cupy_memory()                   # minitfm's blocks: the card is PyTorch's
    try:
        torch.cuda.reset_peak_memory_stats()
        return torch_timing(torch, cfg, rows, sizes, precision, "cuda")
    finally:
        torch.cuda.empty_cache()


def torch_timing(torch, cfg, rows: int, sizes: Sizes, precision: str, where: str) -> dict:
    src, tgt = bench_train.make_batch(cfg, rows, sizes.length, sizes.length)
    step = bench_torch.torch_step(cfg, src, tgt, where, precision)
    if where == "cpu":
        return timed(step, lambda: None, sizes)
    row = timed(step, torch.cuda.synchronize, sizes)
    row["peak_memory_gib"] = torch.cuda.max_memory_reserved() / GIB
    row["launches_per_update"], row["launches_counted_by"] = device.profiled_launches(step)
    return row


def base_update(sizes: Sizes, gpu: str, deadline: float) -> dict:
    """The ``base`` update in every contender: tokens/s, fraction of the peak, memory, launches."""
    cfg = sizes.config("base")
    rows = max(1, sizes.tokens // sizes.length)
    targets = rows * sizes.length
    flops = bench_train.step_flops(cfg, rows, sizes.length, sizes.length, targets)
    batched = bench_train.batched_product_flops(cfg, rows, sizes.length, sizes.length)
    peaks = device.peaks(gpu, sizes.peak_n)
    result = {"batch": f"{rows} x {sizes.length}/{sizes.length} tokens",
              "target_tokens": targets, "gflop_per_update": flops / 1e9,
              "batched_fp32_share": batched / flops, "peaks": peaks, "rows": []}
    for who, precision in CONTENDERS:
        row = {"contender": who, "precision": precision}
        if time.time() > deadline:
            row.update(status="left out for time")
        else:
            try:
                if who.startswith("minitfm"):
                    result_row = minitfm_row(cfg, rows, sizes, precision,
                                             "fused" if who.endswith("fused") else "plain")
                else:
                    result_row = torch_row(cfg, rows, sizes, precision)
                row.update({"status": "ok", **result_row})
            except Exception as exc:           # one contender's failure is its row's, alone
                row.update(status="error", error=error_text(exc))
        if "step_s" in row:
            peak = peaks["tflops"].get(PEAK_OF[precision])
            row["target_tokens_per_s"] = targets / row["step_s"]
            row["tflops"] = flops / row["step_s"] / 1e12
            row["fraction_of_peak"] = row["tflops"] / peak if peak else None
        result["rows"].append(row)
    return result


# ---- the big preset's largest batch --------------------------------------------------------------

def is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, MemoryError) or "cudaErrorMemoryAllocation" in text or \
        "ALLOC_FAILED" in text


def largest_fit(fits: Callable[[int], bool], start: int, cap: int, deadline: float) -> dict:
    """The largest token count ``fits``: doubling from ``start`` up to ``cap``, then halving the
    gap between the last fit and the first failure while it is over 1/8 of the fit."""
    probes, low, high, stopped = [], 0, None, None

    def probe(tokens: int) -> bool:
        ok = fits(tokens)
        probes.append({"max_tokens": tokens, "fits": ok})
        return ok

    tokens = start
    while tokens <= cap and high is None:
        if time.time() > deadline:
            stopped = "time"
            break
        if probe(tokens):
            low, tokens = tokens, tokens * 2
        else:
            high = tokens
    while stopped is None and high is not None and low and high - low > low // 8:
        if time.time() > deadline:
            stopped = "time"
            break
        middle = (low + high) // 2
        low, high = (middle, high) if probe(middle) else (low, middle)
    return {"largest_fit": low or None, "smallest_failure": high, "probes": probes,
            "stopped_for": stopped or ("the cap" if high is None else None)}


def big_memory(sizes: Sizes, deadline: float) -> dict:
    """The largest ``--max-tokens`` of the ``big`` preset that trains (two updates a probe, the
    model and Adam's moments in place), with sentences of ``big_length`` tokens."""
    cfg = sizes.config("big")
    params = translator.init_params(cfg, 0)
    adam, grads = optim.Adam(params), flat.zeros_like(params)
    length = sizes.big_length

    def fits(tokens: int) -> bool:
        src, tgt = bench_train.make_batch(cfg, max(1, tokens // length), length, length)
        try:
            for i in range(2):
                translator.loss_and_grads(params, cfg, src, tgt, backend.rng(0, i), out=grads)
                adam.update(params, grads, 1e-4)
            device.sync()
            return True
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            return False
        finally:
            device.release_cupy_memory()

    found = largest_fit(fits, sizes.big_start, sizes.big_cap, deadline)
    return {"sentence_length": length, "parameters": sum(int(p.size) for p in params.values()),
            **found}


# ---- Multi30k ----------------------------------------------------------------------------------

def multi30k(data: Path, out: Path, sizes: Sizes, minutes: float, timeout_s: float) -> dict:
    """``train_wmt.py --preset small`` on Multi30k for ``minutes``: greedy validation BLEU of the
    whole validation set at the end, tokens/s, the run's first line."""
    missing = [f"{data}/{split}.{lang}[.gz]" for split in ("train", "val")
               for lang in ("en", "de")
               if not any((data / f"{split}.{lang}{gz}").exists() for gz in ("", ".gz"))]
    if missing:
        return {"status": "skipped", "why": f"Multi30k is not in {data}: no {', '.join(missing)}"}
    run = out / "multi30k"
    command = [sys.executable, "train_wmt.py", "--trainpref", str(data / "train"),
               "--validpref", str(data / "val"), "--source-lang", "en", "--target-lang", "de",
               "--preset", "small", "--backend", "cupy", "--time-limit", f"{minutes:.3f}m",
               "--valid-every", "0", "--valid-bleu-sentences", "100000", "--save-every", "0",
               "--quiet", "--out", str(run), "--data-dir", str(out / "multi30k-data"),
               *sizes.multi30k]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    result = {"command": " ".join(["python", *command[1:]]), "returncode": done.returncode,
              "first_line": (done.stdout.splitlines() or [""])[0],
              "stderr_tail": done.stderr[-1500:] if done.returncode else ""}
    log = run / "log.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    windows = [r for r in records if "tokens_per_s" in r]
    valid = [r for r in records if "valid_bleu" in r]
    if windows:
        result.update(steps=windows[-1]["step"], training_minutes=windows[-1]["elapsed"] / 60,
                      tokens_per_s=statistics.median(r["tokens_per_s"] for r in
                                                     (windows[1:] or windows)))
    if valid:
        result.update(valid_bleu=valid[-1]["valid_bleu"], valid_loss=valid[-1].get("valid_loss"))
    result["status"] = "ok" if done.returncode == 0 and valid else "error"
    return result
