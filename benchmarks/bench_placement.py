"""The README's two-worker Multi30k hour as written, against the same command pinned by hand
(and, with --compare-with, another checkout's: updates per minute before and after a change).

    python benchmarks/bench_placement.py --data DATA              # DATA/train.en(.gz), DATA/val...
    python benchmarks/bench_placement.py --data DATA --max-steps 100 --rounds 3
    python benchmarks/bench_placement.py --data DATA --compare-with OTHER_CHECKOUT

The command is the README's Multi30k hour (its recipe (3)):

    mpiexec -n 2 python train_wmt.py --trainpref DATA/train --validpref DATA/val \\
        --source-lang en --target-lang de --preset small --max-tokens 1536 --warmup 400 \\
        --cooldown 0.2 --dropout 0.2 --dropout-start 1100steps --time-limit 60m \\
        --valid-every 250 --valid-bleu-sentences 1014 --best-metric bleu --keep-best 5 \\
        --save-every 50 --keep-last 10 --out runs/m30k

with its options as written but ``--dropout-start`` (a run shorter than its 1,100 updates is
refused: the runs here have dropout 0.2 from the start, as the hour's last 70 % of its updates
has), shortened by ``--max-steps`` (default 60), and with ``--data-dir``
so that every run reads one cache of the vocabulary and encoded corpora (made before the timed
runs). Each round runs it twice, one after the other (the first of a round alternates):

    as written   the environment without OPENBLAS_NUM_THREADS / MKL_NUM_THREADS / OMP_NUM_THREADS:
                 each worker takes the BLAS threads minitfm.workers.placement gives it
    pinned       the same with all three set to 1, as the figures of docs/results.md were measured

(``--compare-with CHECKOUT``: a third, the same command as written with another checkout's
train_wmt.py, e.g. the code before a change.) Speed is read from each run's ``log.jsonl``: target
tokens per second and seconds per update from the first log line (step 10, after start-up) to the
last training line; and the CPU time of all the run's processes (start-up and the final validation
included: the same work in every configuration), which the load of a shared machine changes far
less than the wall clock: threads that spin show there. The first line each run printed
(``placement: ...``) is shown with it. The machine may be shared: compare the runs of one round,
and quote the medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_distributed import mpiexec     # the mpiexec of this Python's MPI (benchmarks/)

ROOT = Path(__file__).resolve().parents[1]
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
RESULTS_OPTIONS = ["--source-lang", "en", "--target-lang", "de", "--preset", "small",
                   "--max-tokens", "1536", "--warmup", "400", "--cooldown", "0.2",
                   "--dropout", "0.2", "--time-limit", "60m",
                   "--valid-every", "250", "--valid-bleu-sentences", "1014", "--best-metric",
                   "bleu", "--keep-best", "5", "--save-every", "50", "--keep-last", "10"]


def environment(checkout: Path, pinned: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    env["PYTHONPATH"] = str(checkout)
    env.pop("MINITFM_BACKEND", None)
    if pinned:
        env.update({variable: "1" for variable in THREAD_VARIABLES})
    return env


def train(checkout: Path, data: Path, work: Path, name: str, steps: int, pinned: bool,
          workers: int = 2, extra: tuple = ()) -> dict:
    """Run the command; return its first line, and its speed from log.jsonl."""
    out = work / "runs" / name
    command = [mpiexec(), "-n", str(workers), sys.executable, str(checkout / "train_wmt.py"),
               "--trainpref", str(data / "train"), "--validpref", str(data / "val"),
               *RESULTS_OPTIONS, "--max-steps", str(steps), "--data-dir", str(work / "data"),
               "--out", str(out), "--quiet", *extra]
    started, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True,
                          env=environment(checkout, pinned))
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    with open(out / "log.jsonl") as f:
        records = [r for r in map(json.loads, f) if "tokens_per_s" in r]     # training lines
    shutil.rmtree(out)                                 # checkpoints: tens of MiB a run
    row = {"name": name, "first_line": done.stdout.splitlines()[0], "wall_s": wall, "cpu_s": cpu}
    if len(records) < 2:
        return row
    first, last = records[0], records[-1]
    seconds = last["elapsed"] - first["elapsed"]
    return {**row, "tokens_per_s": (last["tokens"] - first["tokens"]) / seconds,
            "update_s": seconds / (last["step"] - first["step"]),
            "steps": [first["step"], last["step"]]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 1)[1])
    parser.add_argument("--data", type=Path, required=True,
                        help="directory of the Multi30k corpora: train.en/.de, val.en/.de, "
                             "plain or gzipped (docs/results.md: Translation)")
    parser.add_argument("--work", type=Path,
                        help="scratch directory for the data cache and the runs (default: a new "
                             "temporary directory, removed at the end)")
    parser.add_argument("--max-steps", type=int, default=60,
                        help="updates per run, 20 or more (default 60; speed from step 10 on)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("--compare-with", type=Path, metavar="CHECKOUT",
                        help="also run another checkout's train_wmt.py as written")
    parser.add_argument("--json", action="store_true", help="also print every run as JSON")
    args = parser.parse_args(argv)
    if args.max_steps < 20:
        parser.error("--max-steps must be 20 or more: speed is read from step 10 to the end")
    for prefix in ("train", "val"):
        if not any((args.data / f"{prefix}.{lang}{gz}").exists()
                   for lang in ("en",) for gz in ("", ".gz")):
            raise SystemExit(f"{args.data}/{prefix}.en(.gz) not found: --data is the directory "
                             f"of the Multi30k corpora (docs/results.md: Translation)")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_placement-"))
    configs = [("as written", ROOT, False), ("pinned", ROOT, True)]
    if args.compare_with:
        configs.append((f"as written, {args.compare_with.name}", args.compare_with, False))
    try:
        # the vocabulary and encoded corpora, once, outside the timed runs
        train(ROOT, args.data, work, "prepare", 1, pinned=True, workers=1,
              extra=("--valid-bleu-sentences", "0", "--best-metric", "loss"))
        rows = []
        for round_ in range(args.rounds):
            for name, checkout, pinned in configs[::-1] if round_ % 2 else configs:
                row = {"round": round_, **train(checkout, args.data, work, f"{name}-{round_}"
                                                .replace(" ", "-").replace(",", ""),
                                                args.max_steps, pinned)}
                row["name"] = name
                rows.append(row)
                print(f"round {round_}: {name:<24} {row['tokens_per_s']:7.0f} target tokens/s, "
                      f"{row['update_s']:.3f} s per update (steps {row['steps'][0]}-"
                      f"{row['steps'][1]}; {row['wall_s']:.0f} s in all, {row['cpu_s']:.0f} CPU s)"
                      f"  [{row['first_line']}]",
                      flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nmpiexec -n 2 train_wmt.py, the README's hour recipe, {args.max_steps} updates; "
          f"medians over {args.rounds} round(s), on {os.cpu_count()} cores")
    median = {name: statistics.median(r["tokens_per_s"] for r in rows if r["name"] == name)
              for name, _, _ in configs}
    for name, _, _ in configs:
        update_s = statistics.median(r["update_s"] for r in rows if r["name"] == name)
        cpu_s = statistics.median(r["cpu_s"] for r in rows if r["name"] == name)
        print(f"  {name:<24} {median[name]:7.0f} target tokens/s, {update_s:.3f} s per update, "
              f"{cpu_s:.0f} CPU s per run")
    ratio = median["as written"] / median["pinned"]
    print(f"  as written / pinned: {ratio:.2f}x "
          f"({'meets' if ratio >= 0.9 else 'BELOW'} the 0.9x goal)")
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
