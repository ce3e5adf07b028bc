"""Data-parallel training: one worker against two (mpiexec -n 2), and what the all-reduce costs.

    python benchmarks/bench_distributed.py                  # small preset, 3 rounds
    python benchmarks/bench_distributed.py --preset tiny --steps 20 --rounds 1 --json

Every configuration trains the same updates through ``minitfm.training.loop.train``: each update is the
same two batches of ``--batch`` sentences x ``--length`` tokens per side, as

    1 worker,  update_freq 2, BLAS on every core      (the baseline)
    1 worker,  update_freq 2, BLAS on one core        (what each of two workers has)
    2 workers, update_freq 1 each, BLAS on one core   (the same arithmetic, split)

each in fresh processes, the three in turn, ``--rounds`` times (the machine is shared: compare
figures of one round, quote medians over rounds). Per configuration, medians over the timed
updates (after ``--warmup``):

- ``update_s``: wall time of one update, batch reading to the stop check (one loop iteration);
- with two workers, rank 0's time per update in collectives: ``allreduce_s`` (the flat gradient
  buffer: it includes waiting for the slower worker to finish its backward pass) and
  ``numbers_s`` (token counts, clocks, stop requests), and their sum as a fraction of the update;
- ``bare_allreduce_s``: the same buffer summed right after a barrier (both workers ready): the
  cost of moving the numbers, without the waiting.

On a 2-core machine two workers cannot be faster than one worker using both cores: the figures
show the overhead of the split (and of two processes sharing the cores), not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = [   # (name, workers, BLAS threads per worker: None = every core)
    ("1 worker, all cores", 1, None),
    ("1 worker, 1 core", 1, 1),
    ("2 workers, 1 core each", 2, 1),
]
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


# ---- one configuration, in the worker processes -------------------------------------------

def run_worker(preset: str, batch: int, length: int, steps: int, warmup: int) -> dict | None:
    """Train ``warmup + steps`` updates of two batches; rank 0 returns the timings."""
    from minitfm import backend
    from minitfm.workers import distributed
    from minitfm.models import translator
    from minitfm.training import loop
    from minitfm.training.run import Run
    from minitfm.training.state import TrainOptions

    world = distributed.world()
    cfg = translator.Config.preset(preset)
    batches = [make_batch(cfg, batch, length, seed) for seed in (1, 2)]   # one update's
    starts, in_allreduce, in_numbers = [], [], []

    def timed(function, record):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                record.append((started, time.perf_counter() - started))
        return wrapper

    update = loop.update
    loop.update = lambda *args: (starts.append(time.perf_counter()), update(*args))[1]
    world.allreduce_sum = timed(world.allreduce_sum, in_allreduce)
    world.allreduce_numbers = timed(world.allreduce_numbers, in_numbers)
    world.stop_requests = timed(world.stop_requests, in_numbers)
    total = warmup + steps
    options = TrainOptions(max_steps=total + 1, update_freq=2 // world.size, log_every=10**6,
                           progress=False)
    with world.fail_together(), Run(options, translator.KIND) as run:
        run.start(cfg)
        state = loop.train(run, batches)
        bare = []
        for _ in range(10):
            world.barrier()
            started = time.perf_counter()
            world.allreduce_sum(state.grads.buffer)
            bare.append(time.perf_counter() - started)
        world.finish()
    if not world.is_root:
        return None
    # update k runs from starts[k] to starts[k + 1]; the last one only opens the final interval
    updates = [(starts[k], starts[k + 1]) for k in range(warmup, total)]

    def per_update(records):
        return statistics.median(sum(seconds for at, seconds in records if a <= at < b)
                                 for a, b in updates)

    update_s = statistics.median(b - a for a, b in updates)
    row = {"workers": world.size, "update_s": update_s,
           "target_tokens": int(sum((b[1][:, 1:] != cfg.pad_id).sum() for b in batches)),
           "backend": backend.describe(), "gradient_mib": state.grads.buffer.nbytes / 2**20}
    if world.distributed:
        row["allreduce_s"] = per_update(in_allreduce)
        row["numbers_s"] = per_update(in_numbers)
        row["communication_fraction"] = (row["allreduce_s"] + row["numbers_s"]) / update_s
        row["bare_allreduce_s"] = statistics.median(bare)
    return row


def make_batch(cfg, batch: int, length: int, seed: int):
    """Random ids (host arrays), sentences of full length."""
    import numpy
    rng = numpy.random.default_rng(seed)
    first = 4
    src = rng.integers(first, cfg.src_vocab, size=(batch, length))
    tgt = rng.integers(first, cfg.tgt_vocab, size=(batch, length + 1))
    src[:, -1] = cfg.eos_id
    tgt[:, 0], tgt[:, -1] = cfg.bos_id, cfg.eos_id
    return src, tgt


# ---- the driver ---------------------------------------------------------------------------

def mpiexec() -> str:
    from minitfm.cli.exits import UsageError
    from minitfm.cli.launch import find_mpiexec
    try:
        return find_mpiexec()
    except UsageError as exc:
        raise SystemExit(str(exc)) from None


def run_config(workers: int, threads: int | None, args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    for variable in THREAD_VARIABLES:
        if threads is None:
            env.pop(variable, None)
        else:
            env[variable] = str(threads)
    command = [sys.executable, __file__, "--worker", "--preset", args.preset, "--batch",
               str(args.batch), "--length", str(args.length), "--steps", str(args.steps),
               "--warmup", str(args.warmup)]
    if workers > 1:
        command = [mpiexec(), "-n", str(workers)] + command
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch (default 64)")
    parser.add_argument("--length", type=int, default=24, help="tokens per side (default 24)")
    parser.add_argument("--steps", type=int, default=5, help="timed updates (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed updates first")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three (default 3)")
    parser.add_argument("--json", action="store_true", help="also print every row as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        row = run_worker(args.preset, args.batch, args.length, args.steps, args.warmup)
        if row is not None:
            print(json.dumps(row), flush=True)
        return 0

    rows = []
    for round_ in range(args.rounds):
        for name, workers, threads in CONFIGS:
            row = {"round": round_, "config": name, **run_config(workers, threads, args)}
            rows.append(row)
            print(f"round {round_}: {name:<24} {row['update_s']:.3f} s per update"
                  + (f"; all-reduce {row['allreduce_s'] * 1e3:.1f} ms (bare "
                     f"{row['bare_allreduce_s'] * 1e3:.1f} ms), numbers "
                     f"{row['numbers_s'] * 1e3:.2f} ms: {row['communication_fraction']:.1%} of "
                     f"the update" if workers > 1 else ""), flush=True)
    first = rows[0]
    print(f"\npreset {args.preset}, 2 batches of {args.batch} x {args.length} tokens per update "
          f"({first['target_tokens']} target tokens), gradients {first['gradient_mib']:.1f} MiB, "
          f"{first['backend']}; medians over {args.rounds} round(s) of {args.steps} updates")
    baseline = statistics.median(r["update_s"] for r in rows if r["config"] == CONFIGS[0][0])
    for name, workers, _ in CONFIGS:
        mine = [r for r in rows if r["config"] == name]
        update_s = statistics.median(r["update_s"] for r in mine)
        line = (f"  {name:<24} {update_s:7.3f} s per update "
                f"({update_s / baseline:.2f}x the first)")
        if workers > 1:
            line += (f"; all-reduce {statistics.median(r['allreduce_s'] for r in mine) * 1e3:.1f}"
                     f" ms (bare {statistics.median(r['bare_allreduce_s'] for r in mine) * 1e3:.2f}"
                     f" ms), small collectives "
                     f"{statistics.median(r['numbers_s'] for r in mine) * 1e3:.2f} ms: "
                     f"{statistics.median(r['communication_fraction'] for r in mine):.1%} of "
                     f"the update")
        print(line)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
