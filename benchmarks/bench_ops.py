"""How much work one training update issues: array operations and host syncs, counted
independently of the device, and the kernel launches of CuPy's path.

    python benchmarks/bench_ops.py                          # base preset, 1 and 6 micro-batches
    python benchmarks/bench_ops.py --preset small --micro-batches 1 2 --json

On a GPU every array operation is (at least) one kernel launch, which costs the host time
whatever the array's size, and every conversion of a device array to a Python number or a host
array stalls the queue until the device catches up. Wall time on a CPU hides both; this
benchmark counts them:

- *operations* and *syncs*: real training updates through ``minitfm.training.loop.train`` with NumPy's
  module replaced by the counting stand-in of ``op_counter.py`` (which says what counts), by
  phase and module;
- *launches*: the same updates on the CuPy path, run by the CuPy double (tests/cupy_double,
  imported as ``cupy``), which counts one launch for every CuPy call that writes device memory
  (its RULES.md), by the module that asked for it. The CuPy path differs from NumPy's where the
  backend does: dropout masks come from Philox computed with array operations (``philox``),
  the embedding's scatter-add is a sorted segment sum (``backend``). One per call is the lower
  bound: cuBLAS, CUB and CuPy's scans may run several kernels for one call. Counted three
  times: the plain array code in float32, ``--kernels fused`` (minitfm.speed.fused: the double runs
  each kernel's twin as one launch) in float32, and fused with ``--precision fp16`` (mixed
  precision: casts to float16 around the products, the loss scaler), the last beside the budget
  of :data:`LAUNCH_BUDGET` launches per update; and the device-to-host copies of an update (none
  may wait for the device).

Per update: the difference between a run of ``S + 1`` and a run of ``S`` updates from the same
start (set-up, the final log line and the like cancel out).

Batches are small (the count does not depend on the batch size, except for the number of logits
chunks, printed) so that a count of the ``base`` model takes seconds.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from op_counter import TALLY, counting_backend  # noqa: E402

from minitfm import backend  # noqa: E402
from minitfm.backend import products  # noqa: E402
from minitfm.speed import fused, rows  # noqa: E402
from minitfm.layers import output  # noqa: E402
from minitfm.models import base, translator  # noqa: E402
from minitfm.training import loop  # noqa: E402
from minitfm.training.run import Run  # noqa: E402
from minitfm.training.state import TrainOptions  # noqa: E402

# ---- one update, counted ---------------------------------------------------------------------

def make_batches(cfg: translator.Config, n: int, sentences: int, src_len: int, tgt_len: int,
                 seed: int = 0) -> list:
    """``n`` host batches of random ids, (sentences, src_len) and (sentences, tgt_len + 1)."""
    rng = numpy.random.default_rng(seed)
    first = max(cfg.pad_id, cfg.bos_id, cfg.eos_id) + 1
    batches = []
    for _ in range(n):
        src = rng.integers(first, cfg.src_vocab, size=(sentences, src_len))
        tgt = rng.integers(first, cfg.tgt_vocab, size=(sentences, tgt_len + 1))
        src[:, -1] = cfg.eos_id
        tgt[:, 0], tgt[:, -1] = cfg.bos_id, cfg.eos_id
        src[0, src_len // 2:] = cfg.pad_id                # some padding, as in real batches
        tgt[0, tgt_len // 2 + 1:] = cfg.pad_id
        batches.append((src, tgt))
    return batches


def run_updates(cfg: translator.Config, batches: list, steps: int, update_freq: int,
                clip_norm: float | None) -> None:
    """``steps`` updates of a fresh model on the active backend, set-up included."""
    options = TrainOptions(max_steps=steps, update_freq=update_freq, clip_norm=clip_norm,
                           log_every=10 ** 9, progress=False, warmup=10)
    with Run(options, translator.KIND) as run:
        run.start(cfg, params=translator.init_params(cfg, seed=0))
        loop.train(run, batches)


def count_run(cfg: translator.Config, batches: list, steps: int, update_freq: int,
              clip_norm: float | None) -> tuple[collections.Counter, collections.Counter]:
    """Operations and syncs of ``steps`` updates of a fresh model, set-up included: the plain
    code's (the CPU's row passes and compiled loops off, whatever the process chose before)."""
    TALLY.ops.clear()
    TALLY.syncs.clear()
    chosen = rows.state()
    rows.use(False, 1)
    try:
        with counting_backend():
            run_updates(cfg, batches, steps, update_freq, clip_norm)
    finally:
        rows.use(*chosen)
    return collections.Counter(TALLY.ops), collections.Counter(TALLY.syncs)


def per_update(cfg: translator.Config, update_freq: int, sentences: int, src_len: int, tgt_len: int,
               clip_norm: float | None) -> dict:
    batches = make_batches(cfg, update_freq, sentences, src_len, tgt_len)
    ops1, syncs1 = count_run(cfg, batches, 1, update_freq, clip_norm)
    ops2, syncs2 = count_run(cfg, batches, 2, update_freq, clip_norm)
    ops, syncs = ops2 - ops1, syncs2 - syncs1
    by_phase, by_module = collections.Counter(), collections.Counter()
    for (phase, module), n in ops.items():
        by_phase[phase] += n
        by_module[module] += n
    return {"micro_batches": update_freq, "ops": sum(ops.values()),
            "syncs": sum(syncs.values()), "by_phase": dict(by_phase.most_common()),
            "by_module": dict(by_module.most_common()),
            "syncs_by_module": {f"{p}/{m}": n for (p, m), n in syncs.most_common()}}


# ---- the CuPy path's kernel launches, on the double -------------------------------------------

DOUBLE = Path(__file__).resolve().parents[1] / "tests" / "cupy_double"


def import_double():
    """The CuPy double, imported as ``cupy`` (this process must not hold the real CuPy)."""
    loaded = sys.modules.get("cupy")
    if loaded is not None:
        if not hasattr(loaded, "_double"):
            raise SystemExit("launches are counted on the CuPy double: run bench_ops.py in a "
                             "process that has not imported the real CuPy")
        return loaded
    sys.path.insert(0, str(DOUBLE))
    import cupy
    return cupy


def module_of(site: str) -> str:
    """``layers.attention`` for a call site ``.../minitfm/layers/attention.py:97 (forward)``."""
    parts = Path(site.rsplit(":", 1)[0]).with_suffix("").parts
    if "minitfm" not in parts:
        return "other"
    return ".".join(parts[len(parts) - parts[::-1].index("minitfm"):])


LAUNCH_BUDGET = 800     # kernel launches per base update (one batch), fused kernels and fp16
PATHS = {"": ("plain", "fp32"), "_fused": ("fused", "fp32"), "_fp16": ("fused", "fp16")}


def launch_run(cupy, cfg: translator.Config, batches: list, steps: int, update_freq: int,
               clip_norm: float | None, kernels: str = "plain",
               precision: str = "fp32") -> collections.Counter:
    """Kernel launches of ``steps`` updates on the double, by module (the fused kernels as one),
    and the device-to-host copies (``device_to_host``)."""
    fused.use(kernels)
    products.set_precision(precision)
    try:
        with cupy._double.counting() as counted:
            run_updates(cfg, batches, steps, update_freq, clip_norm)
    finally:
        fused.use("plain")
        products.set_precision("fp32")
    by_module = collections.Counter()
    for site, n in counted.launch_sites.items():
        by_module[module_of(site)] += n
    if "speed.fused" in by_module:                    # every kernel is launched by fused.Kernel
        by_module["fused kernels"] = by_module.pop("speed.fused")
    by_module["device_to_host"] = counted.device_to_host
    return by_module


def launches_per_update(cfg: translator.Config, update_freq: int, sentences: int, src_len: int,
                        tgt_len: int, clip_norm: float | None) -> dict:
    """Kernel launches of one update on CuPy's path (the double), by module, for each of
    :data:`PATHS` (plain float32, fused float32, fused fp16)."""
    cupy = import_double()
    previous = backend.name
    backend.use("cupy")
    result = {}
    try:
        batches = make_batches(cfg, update_freq, sentences, src_len, tgt_len)
        for suffix, (kernels, precision) in PATHS.items():
            one = launch_run(cupy, cfg, batches, 1, update_freq, clip_norm, kernels, precision)
            two = launch_run(cupy, cfg, batches, 2, update_freq, clip_norm, kernels, precision)
            copies = two.pop("device_to_host") - one.pop("device_to_host")
            launches = two - one
            result.update({f"launches{suffix}": sum(launches.values()),
                           f"launches_by_module{suffix}": dict(launches.most_common()),
                           f"device_to_host{suffix}": copies})
    finally:
        backend.use(previous)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="base", choices=sorted(translator.PRESETS))
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 6])
    parser.add_argument("--sentences", type=int, default=4)
    parser.add_argument("--src-len", type=int, default=12)
    parser.add_argument("--tgt-len", type=int, default=12)
    parser.add_argument("--clip-norm", type=float, default=1.0,
                        help="global gradient-norm clipping (0: none); default 1.0")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.add_argument("--no-launches", action="store_true",
                        help="count operations and syncs only (not CuPy's launches)")
    args = parser.parse_args(argv)
    cfg = translator.Config.preset(args.preset)
    clip = args.clip_norm or None
    rows_per_chunk = max(1, output.LOGIT_CHUNK // cfg.tgt_vocab)
    print(f"preset {args.preset}: {base.num_parameters(translator.init_params(cfg)):,} parameters in "
          f"{len(translator.parameter_shapes(cfg))} arrays; batch {args.sentences} x "
          f"{args.src_len}/{args.tgt_len} tokens (logits in chunks of {rows_per_chunk} rows); "
          f"clip_norm {clip}")
    sizes = (args.sentences, args.src_len, args.tgt_len, clip)
    results = [per_update(cfg, k, *sizes) for k in args.micro_batches]
    for r in results if not args.no_launches else []:
        r.update(launches_per_update(cfg, r["micro_batches"], *sizes))
    for r in results:
        print(f"\n{r['micro_batches']} micro-batch(es) per update: {r['ops']:,} operations, "
              f"{r['syncs']} syncs")
        if "launches" in r:
            budget = ("" if r["micro_batches"] != 1 else ": within the budget of "
                      f"{LAUNCH_BUDGET}" if r["launches_fp16"] <= LAUNCH_BUDGET
                      else f": OVER the budget of {LAUNCH_BUDGET}")
            print(f"  on CuPy's path: {r['launches']:,} kernel launches (plain, fp32), "
                  f"{r['launches_fused']:,} (fused, fp32), {r['launches_fp16']:,} (fused, fp16"
                  f"{budget}); device-to-host copies "
                  f"{r['device_to_host']}, {r['device_to_host_fused']}, {r['device_to_host_fp16']}")
        print("  by phase:  " + ", ".join(f"{k} {v:,}" for k, v in r["by_phase"].items()))
        print("  by module: " + ", ".join(f"{k} {v:,}" for k, v in r["by_module"].items()))
        if r["syncs"]:
            print("  syncs:     " + ", ".join(f"{k} {v}" for k, v in r["syncs_by_module"].items()))
        for suffix, what in PATHS.items():
            if "launches" + suffix in r:
                print(f"  launches by module (CuPy double, {', '.join(what)}): " + ", ".join(
                    f"{k} {v:,}" for k, v in r["launches_by_module" + suffix].items()))
    if len(results) > 1:
        first, last = results[0], results[-1]
        micro = last["micro_batches"] - first["micro_batches"]
        extra = (last["ops"] - first["ops"]) / micro
        launches = (f", {(last['launches'] - first['launches']) / micro:,.0f} kernel launches "
                    f"({(last['launches_fused'] - first['launches_fused']) / micro:,.0f} fused, "
                    f"{(last['launches_fp16'] - first['launches_fp16']) / micro:,.0f} fused fp16)"
                    if "launches" in last else "")
        print(f"\neach additional micro-batch: {extra:,.0f} operations{launches}")
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
