"""Training-step speed and memory against the machine's own matrix-multiply peak.

    python benchmarks/bench_train.py                       # toy, small, base on the active backend
    python benchmarks/bench_train.py --presets small --steps 10
    python benchmarks/bench_train.py --presets small base --breakdown   # where the time goes
    MINITFM_BACKEND=cupy python benchmarks/bench_train.py  # the same on a GPU (TF32 where it has it)
    MINITFM_BACKEND=cupy python benchmarks/bench_train.py --precision fp32   # plain float32

In one run it measures, at ``--precision`` (as the trainers: TF32 on a GPU that has it, else
float32; minitfm.backend.products.set_precision):
1. the matrix-multiply peak: large square float32 products through the active backend;
2. for each preset, in a fresh process (so its peak resident memory is its own): the time of a
   full training step (forward, backward, Adam update), target tokens/s, the model FLOPs of the
   step counted analytically (every matrix product of the forward and backward passes), the
   fraction of the measured peak this reaches, and the peak resident memory;
3. with ``--breakdown`` (NumPy), the same steps again through bench_ops.py's operation counter
   (``op_counter.py``) with a clock around every array operation: the seconds per step spent in
   matrix products and in all other operations (by layer), and the fraction of peak the step
   would reach if everything but the matrix products took no time -- the ceiling of any work on
   the elementwise passes.

Batches: toy and small 128 sentences x 24 tokens per side; base 4,096 target tokens per batch
(128 sentences x 32 tokens). Prints a table, then the same figures as JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import time

from minitfm import backend, flat, gradscale, optim
from minitfm.backend import products
from minitfm.workers import placement
from minitfm.cli import options, placing
from minitfm.speed import fused, mixed, rows
from minitfm.models import base, translator

BATCHES = {"toy": (128, 24, 24), "small": (128, 24, 24), "base": (128, 32, 32)}
VOCAB = {"toy": 16}


def sync():
    if backend.is_gpu():
        backend.xp.cuda.Stream.null.synchronize()


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    """Best-of-``repeats`` float32 GFLOP/s of an (n x n) @ (n x n) product."""
    xp = backend.xp
    rng = backend.rng(0)
    a = rng.random((n, n), dtype=xp.float32)
    b = rng.random((n, n), dtype=xp.float32)
    out = xp.empty((n, n), dtype=xp.float32)
    xp.matmul(a, b, out=out)
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        xp.matmul(a, b, out=out)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best / 1e9


def step_flops(cfg: translator.Config, batch: int, src_len: int, tgt_len: int, n_targets: int) -> float:
    """Matrix-product FLOPs of one forward + backward pass (2 m n k per product).

    Every forward product has two backward products of the same size (one for each operand's
    gradient), so the step costs 3x the forward products. Padded positions count: they are
    computed. The output projection runs on the n_targets real target positions only.
    """
    d, f, v = cfg.d_model, cfg.d_ff, cfg.tgt_vocab
    ns, nt = batch * src_len, batch * tgt_len

    def attention(n_q, q_len, k_len, n_kv, fused_q):
        proj = 2 * n_q * d * d + 2 * n_kv * d * 2 * d if not fused_q else 2 * n_q * d * 3 * d
        scores = 2 * 2 * batch * q_len * k_len * d          # Q K^T and P V, all heads
        return proj + scores + 2 * n_q * d * d               # + output projection

    ffn = lambda n: 2 * 2 * n * d * f                          # noqa: E731
    enc = cfg.n_layers * (attention(ns, src_len, src_len, ns, True) + ffn(ns))
    dec = cfg.n_layers * (attention(nt, tgt_len, tgt_len, nt, True)
                          + attention(nt, tgt_len, src_len, ns, False) + ffn(nt))
    out = 2 * n_targets * d * v
    return 3.0 * (enc + dec + out)


def batched_product_flops(cfg: translator.Config, batch: int, src_len: int, tgt_len: int) -> float:
    """The FLOPs of ``step_flops`` in batched products: attention's Q K^T and P V (forward and
    backward), the products CuPy runs through a batched GEMM, which it never hands to TF32
    tensor cores; the rest (2-D products: projections, feed-forward, output) can use TF32."""
    d = cfg.d_model
    scores = lambda q_len, k_len: 2 * 2 * batch * q_len * k_len * d      # noqa: E731
    per_layer_enc = scores(src_len, src_len)
    per_layer_dec = scores(tgt_len, tgt_len) + scores(tgt_len, src_len)
    return 3.0 * cfg.n_layers * (per_layer_enc + per_layer_dec)


def make_batch(cfg, batch, src_len, tgt_len, seed=0):
    """Random ids; sentences of full length (the figures are per real token)."""
    rng = backend.host_rng(seed)
    first = 4
    src = rng.integers(first, cfg.src_vocab, size=(batch, src_len)).astype("int32")
    tgt = rng.integers(first, cfg.tgt_vocab, size=(batch, tgt_len + 1)).astype("int32")
    src[:, -1] = cfg.eos_id
    tgt[:, 0], tgt[:, -1] = cfg.bos_id, cfg.eos_id
    return src, tgt                          # host arrays, as the data pipeline hands them over


def make_step(cfg: translator.Config, batch: int, src_len: int, tgt_len: int):
    """A function running one full training step on a fixed batch; it returns the step's stats.
    Under ``--precision fp16`` the step is train()'s: float16 copies of the parameters for the
    products, the loss scale, the gradients unscaled, the masked update."""
    params = translator.init_params(cfg, 0)
    adam = optim.Adam(params)
    grads = flat.zeros_like(params)         # one gradient buffer for the run, as train() keeps
    src, tgt = make_batch(cfg, batch, src_len, tgt_len)
    count = itertools.count()
    scaler = gradscale.LossScaler() if products.precision() == "fp16" else None

    def step() -> dict:
        with mixed.half_copies(params):
            stats, _ = translator.loss_and_grads(
                params, cfg, src, tgt, backend.rng(0, next(count)), out=grads,
                **({} if scaler is None else {"loss_scale": scaler.scale}))
        if scaler is not None:
            scaler.unscale(grads)
        adam.update(params, grads, 1e-4, scaler)
        return stats
    step.params = params
    return step


def preset_config(name: str) -> translator.Config:
    vocab = VOCAB.get(name)
    return translator.Config.preset(name, **({"src_vocab": vocab, "tgt_vocab": vocab} if vocab else {}))


def run_preset(name: str, steps: int, warmup: int) -> dict:
    batch, src_len, tgt_len = BATCHES[name]
    cfg = preset_config(name)
    step = make_step(cfg, batch, src_len, tgt_len)
    times = []
    for _ in range(warmup + steps):
        sync()
        start = time.perf_counter()
        stats = step()
        sync()
        times.append(time.perf_counter() - start)
    times = sorted(times[warmup:])
    median = times[len(times) // 2]
    n_targets = stats["tokens"]
    flops = step_flops(cfg, batch, src_len, tgt_len, n_targets)
    return {"preset": name, "batch": f"{batch}x{src_len}/{tgt_len}", "step_s": median,
            "step_min_s": times[0], "target_tokens_per_s": n_targets / median,
            "gflop_per_step": flops / 1e9, "gflop_per_s": flops / median / 1e9,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "parameters": base.num_parameters(step.params)}


def breakdown(name: str, steps: int) -> dict:
    """Seconds per step in matrix products and, by module, in every other array operation."""
    import op_counter                # the operation counter, here with its clock on
    batch, src_len, tgt_len = BATCHES[name]
    cfg = preset_config(name)
    # the operation counter counts in one thread, array operations alone: the compiled loops'
    # work would go uncounted, so the row passes run their NumPy blocks here
    rows.use(rows.enabled(), 1, compiled=False)
    seconds = op_counter.clocked(lambda: make_step(cfg, batch, src_len, tgt_len), steps)
    products, others = op_counter.split_seconds(seconds)
    return {"matmul_s": products, "other_s": sum(others.values()),
            "other_s_by_module": dict(others.most_common())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["toy", "small", "base"],
                        choices=sorted(BATCHES))
    parser.add_argument("--steps", type=int, default=5, help="timed steps per preset (median)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--breakdown", action="store_true",
                        help="also time every array operation (NumPy only): the seconds in matrix "
                             "products, in everything else by layer, and the fraction of peak the "
                             "step would reach if everything but the matrix products were free")
    options.add(parser, "precision", "kernels")
    parser.add_argument("--worker", help=argparse.SUPPRESS)    # one preset, in this process
    args = parser.parse_args(argv)
    try:
        precision, why = products.set_precision(args.precision)     # before the first product
    except backend.BackendError as exc:
        parser.error(f"--precision {args.precision}: {exc}")

    if args.breakdown and backend.is_gpu():
        parser.error("--breakdown times NumPy operations: run it with the numpy backend")
    if args.worker:
        placing.reuse_freed_memory()         # as the training scripts do
        kernels = args.kernels or ("plain" if backend.is_gpu() else "fused")   # the commands'
        fused.use(kernels)
        rows.use(kernels == "fused" and not backend.is_gpu(), placement.available_cores())
        row = run_preset(args.worker, args.steps, args.warmup)
        if args.breakdown:
            row.update(breakdown(args.worker, args.steps))
        print(json.dumps(row))
        return 0

    peak = matmul_peak()
    table = []
    for name in args.presets:
        cmd = [sys.executable, __file__, "--worker", name, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--precision", precision] + (
                   ["--kernels", args.kernels] if args.kernels else []) + (
                   ["--breakdown"] if args.breakdown else [])
        out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return 1
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["fraction_of_peak"] = row["gflop_per_s"] / peak
        table.append(row)
    peak_after = matmul_peak()       # the machine is shared: bracket the run
    print(f"backend {backend.name}, precision {precision} ({why}); float32 matmul peak "
          f"{peak:.1f} GFLOP/s before, {peak_after:.1f} after (fractions use the higher)")
    peak = max(peak, peak_after)
    print(f"{'preset':<7} {'batch':>10} {'step s':>8} {'tgt tok/s':>10} {'GFLOP':>8} "
          f"{'GFLOP/s':>8} {'of peak':>8} {'peak RSS MiB':>13}")
    for row in table:
        row["fraction_of_peak"] = row["gflop_per_s"] / peak
        print(f"{row['preset']:<7} {row['batch']:>10} {row['step_s']:>8.3f} "
              f"{row['target_tokens_per_s']:>10.0f} {row['gflop_per_step']:>8.1f} "
              f"{row['gflop_per_s']:>8.1f} {row['fraction_of_peak']:>8.1%} "
              f"{row['peak_rss_mib']:>13.0f}")
    for row in table if args.breakdown else []:
        row["fraction_of_peak_products_alone"] = row["gflop_per_step"] / row["matmul_s"] / peak
        top = ", ".join(f"{module} {s:.3f}" for module, s in
                        list(row["other_s_by_module"].items())[:6])
        print(f"{row['preset']}: matrix products {row['matmul_s']:.3f} s per step, other array "
              f"operations {row['other_s']:.3f} s ({top}, ...); with everything but the "
              f"products free, the step would reach "
              f"{row['fraction_of_peak_products_alone']:.1%} of peak")
    print(json.dumps({"backend": backend.name, "precision": precision,
                      "matmul_peak_gflop_per_s": peak, "presets": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
