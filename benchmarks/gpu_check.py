"""One call on a CUDA machine measures what minitfm's GPU path does, and writes it down.

    python benchmarks/gpu_check.py --data DIR/multi30k --out gpu-check      # under 6 minutes

Run from the repository root, with nothing installed beyond what GPU machines usually have (CuPy,
NumPy, PyTorch, sentencepiece, sacrebleu, tqdm, threadpoolctl, filelock, pytest, hypothesis) and
no network. In order, each section on its own (one that fails records its error and the next
goes on), the report rewritten after each (``gpu_check.json``, ``gpu_check.md`` in ``--out``):

1. ``device``: the GPU's name, memory and compute capability; driver, CUDA runtime, CuPy, NumPy,
   PyTorch versions;
2. ``kernels``: every fused kernel against its plain twin (``minitfm.kernelcheck``): the largest
   relative difference of each case within its tolerance, and every kernel run; a kernel that
   differs is a defect to fix before any speed figure of the fused path is claimed;
3. ``pytest``: ``pytest -m gpu`` in a subprocess within ``--pytest-budget`` seconds (slow tests
   last): pass, fail and skip counts, the failures by name, what was left out for time;
4. ``base``: one update of the ``base`` preset (about ``--tokens`` target tokens) in minitfm
   (float32, TF32; with fused kernels TF32 and fp16) and in PyTorch eager on the same model (float32, TF32, AMP): target tokens/s,
   fraction of the card's dense peak for that precision, peak memory, kernel launches per update;
5. ``big``: the ``big`` preset's largest ``--max-tokens`` that trains (a few updates a probe);
6. ``multi30k``: the ``small`` preset trained on Multi30k from ``--data`` for up to
   ``--multi30k-minutes`` (what the budget leaves: about 2 at the defaults), greedy BLEU on
   the whole validation set and tokens/s.

``--smoke`` shrinks every size (CI runs it on the CuPy double, where the figures mean nothing
but every path runs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))          # run from the checkout, without an install

import gpu_check_device as device  # noqa: E402
import gpu_check_pytest  # noqa: E402
import gpu_check_report  # noqa: E402
import gpu_check_steps as steps  # noqa: E402

from minitfm import backend, kernelcheck  # noqa: E402
from minitfm.backend import products  # noqa: E402

SECTIONS = ("device", "kernels", "pytest", "base", "big", "multi30k")
BASE_BUDGET_S, BIG_BUDGET_S = 70.0, 35.0      # no contender or probe starts later
MULTI30K_RESERVE_S = 45.0      # data preparation, the last validation, starting the command


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True,
                   help="the Multi30k folder: train.en, train.de, val.en, val.de (or .gz)")
    p.add_argument("--out", type=Path, required=True, help="where the report goes")
    p.add_argument("--budget", type=float, default=330.0,
                   help="seconds for the whole check (default 330)")
    p.add_argument("--pytest-budget", type=float, default=40.0,
                   help="seconds in which pytest -m gpu may start tests (default 40)")
    p.add_argument("--multi30k-minutes", type=float, default=3.0,
                   help="Multi30k training at most, if the budget leaves it (default 3)")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                   help="run only these (default all)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes: every path once, in seconds (the CuPy double in CI)")
    return p.parse_args(argv)


class Check:
    """The run: its clock, its options, its report so far."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.started = args, time.time()
        self.sizes = steps.SMOKE if args.smoke else steps.FULL
        self.report = {"generated": datetime.datetime.now().isoformat(timespec="seconds"),
                       "commit": commit(), "command": " ".join(["python", *sys.argv]),
                       "smoke": args.smoke, "budget_s": args.budget, "sections": {}}

    def remaining(self) -> float:
        return self.args.budget - (time.time() - self.started)

    def deadline(self, seconds: float) -> float:
        """When a section given ``seconds`` must start nothing new (within the budget)."""
        return time.time() + max(0.0, min(seconds, self.remaining()))

    def run(self, name: str, section) -> None:
        started = time.perf_counter()
        try:
            result = {"status": "ok", **section(self)}
        except Exception as exc:           # a section's failure is recorded, the next goes on
            result = {"status": "error", "error": steps.error_text(exc)}
        result["seconds"] = round(time.perf_counter() - started, 1)
        self.report["sections"][name] = result
        self.write()

    def write(self) -> None:
        self.report["elapsed_s"] = round(time.time() - self.started, 1)
        out = self.args.out
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_check.json").write_text(json.dumps(self.report, indent=1) + "\n")
        (out / "gpu_check.md").write_text(gpu_check_report.markdown(self.report))


def commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


# ---- the sections ----------------------------------------------------------------------------

def device_section(check: Check) -> dict:
    backend.use("cupy")
    precision, why = products.set_precision(None)
    return {**device.device_info(), "default_precision": f"{precision} ({why})"}


def kernels_section(check: Check) -> dict:
    backend.use("cupy")
    rows = kernelcheck.compare()
    return {"rows": rows, "all_equal": all(row["ok"] for row in rows)}


def pytest_section(check: Check) -> dict:
    budget = max(0.0, min(check.args.pytest_budget, check.remaining()))
    paths = ("tests/test_gpu.py",) if check.args.smoke else ()
    return gpu_check_pytest.run_tests(ROOT, check.args.out / "pytest-events.jsonl", budget,
                                      paths=paths, grace_s=2.0 if check.args.smoke else 20.0)


def base_section(check: Check) -> dict:
    gpu = check.report["sections"].get("device", {}).get("gpu", "")
    return steps.base_update(check.sizes, gpu, check.deadline(BASE_BUDGET_S))


def big_section(check: Check) -> dict:
    return steps.big_memory(check.sizes, check.deadline(BIG_BUDGET_S))


def multi30k_section(check: Check) -> dict:
    minutes = min(check.args.multi30k_minutes, (check.remaining() - MULTI30K_RESERVE_S) / 60)
    if minutes <= 0 and not check.args.smoke:
        return {"status": "left out for time", "why": "no time left in --budget"}
    minutes = max(minutes, 0.05)
    return steps.multi30k(check.args.data, check.args.out, check.sizes, minutes,
                          timeout_s=minutes * 60 + MULTI30K_RESERVE_S + 60)


RUNS = {"device": device_section, "kernels": kernels_section, "pytest": pytest_section, "base": base_section,
        "big": big_section, "multi30k": multi30k_section}


def main(argv=None) -> int:
    args = parse_args(argv)
    check = Check(args)
    for name in SECTIONS:
        if name in args.sections:
            check.run(name, RUNS[name])
    print(gpu_check_report.markdown(check.report))
    print(f"written: {args.out / 'gpu_check.json'}, {args.out / 'gpu_check.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
