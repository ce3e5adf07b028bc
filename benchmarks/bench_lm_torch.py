"""The language model's training step in PyTorch (eager, CPU) and in minitfm, measured in one run.

    pip install torch            # not a dependency of minitfm; only this comparison needs it
    python benchmarks/bench_lm_torch.py [--shape default|nanogpt-cpu] [--rounds 7] [--breakdown]

Both are the same decoder-only model (lm.py): a tied token embedding scaled by sqrt(d_model),
sinusoidal positions, pre-LN layers of causal multi-head self-attention and a ReLU feed-forward,
a final LayerNorm, the tied output projection, cross-entropy over every position, and an AdamW
update (beta2 0.99, weight decay 0.1 on matrices and the embedding). Both run in float32 on the
same random blocks. The shapes: ``default`` is train_lm.py's defaults (2 layers, d 128, 22 blocks
of 48 tokens), ``nanogpt-cpu`` nanoGPT's CPU recipe (4 layers, d 128, 12 blocks of 64).

The contenders alternate, ``--steps`` steps each per round, so a noisy shared machine slows them
alike; the step times quoted are medians over every step measured. minitfm and PyTorch each run
on one thread and on the machine's threads (minitfm: its BLAS threads, its row passes and the
batch's two shards side by side, as ``train_lm.py --threads N``; ``--kernels plain``: its plain
code, the whole batch).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")     # as train_lm.py; before NumPy loads

import argparse   # noqa: E402
import json       # noqa: E402
import math       # noqa: E402
import statistics  # noqa: E402
import sys        # noqa: E402
import time       # noqa: E402

import numpy      # noqa: E402

from minitfm import backend, flat, optim  # noqa: E402
from minitfm.workers import placement  # noqa: E402
from minitfm.speed import rows  # noqa: E402
from minitfm.models import lm  # noqa: E402

SHAPES = {  # (config, batch)
    "default": (lm.LMConfig.preset("cpu"), 22),
    "nanogpt-cpu": (lm.LMConfig.preset("nanogpt-cpu"), 12),
}
LR, BETA2, WEIGHT_DECAY = 1e-3, 0.99, 0.1


def make_blocks(cfg: lm.LMConfig, batch: int):
    tokens = numpy.random.default_rng(0).integers(0, cfg.vocab, size=(batch, cfg.max_len + 1))
    return tokens[:, :-1].astype(numpy.int64), tokens[:, 1:].astype(numpy.int64)


class MinitfmStep:
    def __init__(self, cfg: lm.LMConfig, x, y):
        self.cfg, self.x, self.y = cfg, x, y
        self.params = flat.flatten(lm.init_params(cfg, 0))
        self.grads = flat.zeros_like(self.params)
        self.adam = optim.Adam(self.params, beta2=BETA2, eps=1e-8, weight_decay=WEIGHT_DECAY)

    def __call__(self) -> float:
        stats, grads = lm.loss_and_grads(self.params, self.cfg, self.x, self.y)
        for name, g in grads.items():
            self.grads[name] = g
        self.adam.update(self.params, self.grads, LR)
        return stats["loss"]


class TorchStep:
    def __init__(self, cfg: lm.LMConfig, x, y):
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        torch.manual_seed(0)
        d, h = cfg.d_model, cfg.n_heads

        class Layer(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
                self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
                self.ff = nn.Sequential(nn.Linear(d, cfg.d_ff), nn.ReLU(), nn.Linear(cfg.d_ff, d))

            def forward(self, x):
                b, t, _ = x.shape
                q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + self.out(o.transpose(1, 2).reshape(b, t, d))
                return x + self.ff(self.ln2(x))

        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(cfg.vocab, d)
                nn.init.normal_(self.emb.weight, 0.0, d ** -0.5)
                self.layers = nn.ModuleList(Layer() for _ in range(cfg.n_layers))
                self.ln = nn.LayerNorm(d)
                position = torch.arange(cfg.max_len)[:, None]
                rate = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
                pe = torch.zeros(cfg.max_len, d)
                pe[:, 0::2], pe[:, 1::2] = torch.sin(position * rate), torch.cos(position * rate)
                self.register_buffer("pe", pe)

            def forward(self, ids):
                x = self.emb(ids) * math.sqrt(d) + self.pe[: ids.shape[1]]
                for layer in self.layers:
                    x = layer(x)
                return self.ln(x) @ self.emb.weight.T            # tied output projection

        self.torch, self.F = torch, F
        self.net = LM()
        decay = [p for n, p in self.net.named_parameters() if p.dim() == 2]
        rest = [p for n, p in self.net.named_parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                      {"params": rest, "weight_decay": 0.0}],
                                     lr=LR, betas=(0.9, BETA2), eps=1e-8)
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        self.vocab = cfg.vocab

    def __call__(self) -> float:
        self.opt.zero_grad(set_to_none=True)
        logits = self.net(self.x)
        loss = self.F.cross_entropy(logits.reshape(-1, self.vocab), self.y.reshape(-1))
        loss.backward()
        self.opt.step()
        return loss.item()


def timed(step, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="default", choices=tuple(SHAPES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="steps per round and contender")
    parser.add_argument("--kernels", choices=("fused", "plain"), default="fused",
                        help="minitfm's row passes (fused, its default on the CPU) or its plain "
                             "code")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time minitfm's array operations one by one: its matrix "
                             "products alone bound how far ahead of PyTorch it can get")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: `pip install torch` to run this comparison",
              file=sys.stderr)
        return 2
    backend.use("numpy")
    cfg, batch = SHAPES[args.shape]
    x, y = make_blocks(cfg, batch)
    threads = placement.available_cores()
    ours_name = f"minitfm (NumPy, {placement.count(threads, 'thread')})"
    contenders = {"minitfm (NumPy, 1 thread)": (MinitfmStep(cfg, x, y), 1, False),
                  ours_name: (MinitfmStep(cfg, x, y), threads, False),
                  f"PyTorch {torch.__version__} eager, 1 thread": (TorchStep(cfg, x, y), 1, True),
                  f"PyTorch eager, {threads} threads": (TorchStep(cfg, x, y), threads, True)}
    if threads == 1:
        del contenders[ours_name]
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in range(args.rounds + 1):                  # round 0 warms up, not counted
        for name, (step, n_threads, is_torch) in contenders.items():
            if is_torch:
                torch.set_num_threads(n_threads)
            else:       # the BLAS threads and the row passes, as train_lm.py --threads N
                placement.limit_blas_threads(n_threads)
                rows.use(args.kernels != "plain", n_threads)
            measured = timed(step, args.steps)
            if round_:
                times[name] += measured
    tokens = batch * cfg.max_len
    ours = statistics.median(times[ours_name])
    print(f"shape {args.shape}: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} "
          f"heads, d_ff {cfg.d_ff}, batch {batch} x {cfg.max_len} tokens; "
          f"{args.rounds} rounds of {args.steps} steps each")
    print(f"{'':<36} {'step ms':>8} {'tokens/s':>9} {'minitfm is':>11}")
    results = {}
    for name, measured in times.items():
        median = statistics.median(measured)
        results[name] = median
        print(f"{name:<36} {1000 * median:>8.1f} {tokens / median:>9.0f} "
              f"{median / ours:>10.2f}x")
    report = {"shape": args.shape, "tokens_per_step": tokens, "median_step_s": results,
              "torch_version": torch.__version__}
    if args.breakdown:
        import op_counter            # the operation counter, here with its clock on
        rows.use(args.kernels != "plain", 1, compiled=False)   # one thread, array operations
        placement.limit_blas_threads(1)
        seconds = op_counter.clocked(lambda: MinitfmStep(cfg, x, y), args.steps)
        products, others = op_counter.split_seconds(seconds)
        other = sum(others.values())
        torch_1 = results[f"PyTorch {torch.__version__} eager, 1 thread"]
        top = ", ".join(f"{module} {1000 * s:.1f}" for module, s in others.most_common(5))
        print(f"minitfm's matrix products: {1000 * products:.1f} ms per step; other array "
              f"operations {1000 * other:.1f} ms ({top}, ...). With everything "
              f"but the products free, minitfm would be {torch_1 / products:.2f}x PyTorch's "
              f"1-thread step")
        report.update(matmul_s=products, other_s=other)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
