"""The workshop's checks as a learner runs them: ``python -m minitfm.learn check NAME``, the whole
command (the interpreter's start, the imports, the learner's process, the verdict), each
exercise written with the library's own code (a pass) and with one of its named mistakes (a
failure, diagnosed).

    python benchmarks/bench_learn.py [--rounds 3] [--only NAME]

Printed for each: the fastest of ``--rounds`` runs, wall-clock seconds and CPU seconds (the
command's and its children's, user and system). A kernel's first check compiles it, so the
kernels are timed once compiled, as a learner's second check is. To measure the AVX2 code paths
on an AVX-512 machine, run it as

    OPENBLAS_CORETYPE=Haswell NUMBA_CPU_NAME=haswell \\
        NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR" python benchmarks/bench_learn.py

(the commands it starts inherit the environment; it prints which SIMD extensions NumPy uses).
On a 2-core Intel Xeon (AVX-512), 2026-12-07: every check 0.32-0.38 s of CPU, the whole model's
0.57 s; with the AVX2 paths forced as above, 0.32-0.37 s and 0.50 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy  # noqa: E402

from minitfm.learn import kernels  # noqa: E402
from minitfm.learn.exercises import EXERCISES, make  # noqa: E402
from minitfm.learn.kinds import KERNEL  # noqa: E402
from minitfm.learn.workshop import Workshop  # noqa: E402
from tests.learn.conftest import filled, with_body  # noqa: E402  (the library's code, written in)

ROOT = Path(__file__).resolve().parents[1]


def written(folder: Path, ex, mistake=None) -> Path:
    """The exercise in ``folder``, written with the library's code (and ``mistake`` made)."""
    path = Workshop(folder).file(ex)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = make(ex)
    edits = [] if mistake is None else [(mistake.old, mistake.new)]
    if ex.kind is KERNEL:
        kernel = kernels.kernel_of(ex)
        body = kernels.body_of(kernel.source, kernel.name)
        for old, new in edits:
            body = body.replace(old, new)
        path.write_text(with_body(text, kernel.name, body))
    else:
        path.write_text(filled(text, ex.module, ex.write,
                               {mistake.function: edits} if mistake else None))
    return path


def timed(ex, folder: Path) -> tuple[float, float, int]:
    """One ``check`` command: (wall seconds, CPU seconds of it and its children, status)."""
    before = os.times()
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "minitfm.learn", "--dir", str(folder), "check",
                           ex.name], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = os.times()
    cpu = (after.children_user - before.children_user) + \
        (after.children_system - before.children_system)
    return wall, cpu, done.returncode


def fastest(ex, folder: Path, rounds: int) -> tuple[float, float, int]:
    runs = [timed(ex, folder) for _ in range(rounds)]
    return min(r[0] for r in runs), min(r[1] for r in runs), runs[-1][2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    umath = numpy._core._multiarray_umath             # what numpy.show_runtime() reads
    print("NumPy's SIMD dispatch targets in use:", " ".join(
        f for f in umath.__cpu_dispatch__ if umath.__cpu_features__[f]) or "the baseline only")
    print(f"{'exercise':<18} {'pass: wall':>11} {'CPU':>6}   {'a mistake: wall':>16} {'CPU':>6}")
    worst_wall = worst_cpu = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for ex in EXERCISES:
            if args.only not in ex.name:
                continue
            folder = Path(tmp) / ex.name
            written(folder, ex)
            if ex.kind is KERNEL:
                timed(ex, folder)                       # compiled once, as a second check
            right = fastest(ex, folder, args.rounds)
            wrong = (float("nan"), float("nan"), 1)
            if ex.mistakes:
                written(folder, ex, ex.mistakes[0])
                if ex.kind is KERNEL:
                    timed(ex, folder)
                wrong = fastest(ex, folder, args.rounds)
            assert right[2] == 0 and wrong[2] == 1, (ex.name, right, wrong)
            for wall, cpu in (right[:2], wrong[:2]):
                if wall == wall:
                    worst_wall, worst_cpu = max(worst_wall, wall), max(worst_cpu, cpu)
            print(f"{ex.name:<18} {right[0]:>10.2f}s {right[1]:>5.2f}s   {wrong[0]:>15.2f}s "
                  f"{wrong[1]:>5.2f}s", flush=True)
    print(f"the slowest check: {worst_wall:.2f} s wall, {worst_cpu:.2f} s of CPU")


if __name__ == "__main__":
    main()
