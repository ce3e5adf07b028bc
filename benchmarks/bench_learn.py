"""The workshop's checks: how long one exercise's check takes, each exercise written with the
library's own code (a pass) and with one of its named mistakes (a failure, diagnosed).

    python benchmarks/bench_learn.py [--rounds 3] [--only NAME]

Each check runs as ``python -m minitfm.learn check`` runs it, in this process, in a folder of its
own; a kernel's first check compiles it (a few tenths of a second with g++), so the kernels are
timed once compiled, as a learner's second check is. Printed: the fastest of ``--rounds`` runs of
each, passed and failed. On a 2-core AMD EPYC without AVX-512 (Zen 3), 2026-12-02: every check
under 2 s; the slowest, the decoder stack, 1.6 s (its two gradient checks perturb some 1,500
numbers four times each).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minitfm import backend, placement  # noqa: E402
from minitfm.learn import check, kernels, source  # noqa: E402
from minitfm.learn.exercises import EXERCISES  # noqa: E402
from minitfm.learn.workshop import Workshop, make  # noqa: E402


def written(folder: Path, ex, mistake=None) -> Path:
    """The exercise in ``folder``, written with the library's code (and ``mistake`` made)."""
    path = Workshop(folder).file(ex)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = make(ex)
    edits = [] if mistake is None else [(mistake.old, mistake.new)]
    if ex.kind == "kernel":
        kernel = kernels.kernel_of(ex)
        body = kernels.body_of(kernel.source, kernel.name)
        for old, new in edits:
            body = body.replace(old, new)
        path.write_text(kernels.with_body(text, kernel.name, body))
    else:
        path.write_text(source.filled(text, ex.module, ex.write,
                                      {mistake.function: edits} if mistake else None))
    return path


def fastest(ex, path: Path, rounds: int) -> tuple[float, str]:
    best, status = float("inf"), ""
    for _ in range(rounds):
        started = time.perf_counter()
        status = check.run_check(ex, path).status
        best = min(best, time.perf_counter() - started)
    return best, status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    backend.use("numpy")
    placement.limit_blas_threads(1)
    print(f"{'exercise':<18} {'pass':>8} {'a mistake':>10}")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for ex in EXERCISES:
            if args.only not in ex.name:
                continue
            folder = Path(tmp) / ex.name
            right = fastest(ex, written(folder, ex), args.rounds)
            wrong = fastest(ex, written(folder, ex, ex.mistakes[0]), args.rounds) \
                if ex.mistakes else (float("nan"), "")
            assert right[1] == "pass" and wrong[1] in ("fail", ""), (ex.name, right, wrong)
            worst = max(worst, right[0], wrong[0] if wrong[1] else 0.0)
            print(f"{ex.name:<18} {right[0]:>7.2f}s {wrong[0]:>9.2f}s", flush=True)
    print(f"the slowest check: {worst:.2f} s")


if __name__ == "__main__":
    main()
