"""The same training step in PyTorch (eager, CPU) and in minitfm, measured in one run.

PyTorch's model and step (:func:`torch_model`, :func:`torch_step`) serve the GPU check as well
(``gpu_check.py``: on a CUDA device, in float32, TF32 and AMP).

    pip install torch            # not a dependency of minitfm; only this comparison needs it
    python benchmarks/bench_torch.py [--preset small] [--steps 5] [--rounds 3] [--extra-dropout 0.1]

Both models are the same Transformer: the preset's sizes, post-LN, ReLU feed-forward, one shared
embedding scaled by sqrt(d_model) that is also the output projection, sinusoidal positions,
dropout 0.1 on the embeddings and sub-layer outputs and none on the attention weights and the
feed-forward hidden units (the config's attention_dropout and relu_dropout, 0 in every preset:
nn.Transformer's own dropout there is replaced by them; ``--extra-dropout P`` sets both to P in
both models, as nn.Transformer has it by default), label-smoothed cross-entropy over the
target tokens, and an Adam update. Both run
in float32 on the same random batch (128 sentences x 24 tokens per side) with the machine's
threads: minitfm with its plain code and with its row passes and the batch's two shards side by
side (``--kernels fused``, the default of its commands on the CPU), PyTorch eager. The three
take turns, ``--steps`` steps each per round, so that a busy machine slows them alike; the
figures are the medians of the rounds' medians. The fraction of the float32 matrix-multiply peak uses the analytic FLOP count of
bench_train.py and a peak measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_train import BATCHES, make_batch, make_step, matmul_peak, step_flops  # noqa: E402

from minitfm import backend  # noqa: E402
from minitfm.workers import placement  # noqa: E402
from minitfm.speed import rows  # noqa: E402
from minitfm.cli import placing  # noqa: E402
from minitfm.models import translator  # noqa: E402


def torch_model(cfg: translator.Config):
    """The PyTorch twin of minitfm's translator for ``cfg`` (see the module docstring), on the
    CPU; its ``forward(src, tgt_in)`` returns the logits."""
    import torch
    import torch.nn as nn

    d = cfg.d_model

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(cfg.src_vocab, d)
            nn.init.normal_(self.emb.weight, 0.0, d ** -0.5)
            self.core = nn.Transformer(d, cfg.n_heads, cfg.n_layers, cfg.n_layers, cfg.d_ff,
                                       cfg.dropout, batch_first=True)
            for layer in [*self.core.encoder.layers, *self.core.decoder.layers]:
                # nn.Transformer drops attention weights and hidden units with its one rate too
                for attn in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                    if attn is not None:
                        attn.dropout = cfg.attention_dropout
                layer.dropout = (nn.Dropout(cfg.relu_dropout) if cfg.relu_dropout
                                 else nn.Identity())
            position = torch.arange(cfg.max_len)[:, None]
            rate = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
            pe = torch.zeros(cfg.max_len, d)
            pe[:, 0::2], pe[:, 1::2] = torch.sin(position * rate), torch.cos(position * rate)
            self.register_buffer("pe", pe)
            self.drop = nn.Dropout(cfg.dropout)

        def embed(self, ids):
            return self.drop(self.emb(ids) * math.sqrt(d) + self.pe[: ids.shape[1]])

        def forward(self, src, tgt_in):
            t = tgt_in.shape[1]
            causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=src.device),
                                diagonal=1)                      # True: masked
            h = self.core(self.embed(src), self.embed(tgt_in), tgt_mask=causal,
                          src_key_padding_mask=src == cfg.pad_id,
                          tgt_key_padding_mask=tgt_in == cfg.pad_id,
                          memory_key_padding_mask=src == cfg.pad_id)
            return h @ self.emb.weight.T                        # tied output projection

    torch.manual_seed(0)
    return Seq2Seq()


TORCH_PRECISIONS = ("fp32", "tf32", "amp")


def torch_step(cfg: translator.Config, src, tgt, device: str = "cpu", precision: str = "fp32"):
    """A function running one training step (forward, backward, Adam) of :func:`torch_model` on
    the host batch ``src``, ``tgt``, on ``device``, returning the loss (a tensor: reading it
    waits for the device). ``precision``: ``fp32``; ``tf32``, float32 products on a CUDA
    device's TF32 tensor cores (PyTorch's ``allow_tf32``, batched products included); ``amp``,
    autocast to float16 with loss scaling (CUDA)."""
    import torch
    import torch.nn as nn

    if precision not in TORCH_PRECISIONS:
        raise ValueError(f"precision {precision!r}: use one of {', '.join(TORCH_PRECISIONS)}")
    if precision != "fp32" and not str(device).startswith("cuda"):
        raise ValueError(f"precision {precision} needs a CUDA device, not {device}")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    net = torch_model(cfg).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    loss_fn = nn.CrossEntropyLoss(ignore_index=cfg.pad_id, label_smoothing=cfg.label_smoothing)
    scaler = torch.amp.GradScaler("cuda") if precision == "amp" else None
    src_t = torch.from_numpy(backend.to_host(src).astype("int64")).to(device)
    tgt_t = torch.from_numpy(backend.to_host(tgt).astype("int64")).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=scaler is not None):
            logits = net(src_t, tgt_t[:, :-1])
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tgt_t[:, 1:].reshape(-1))
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss.detach()
    return step


def alternate(contenders: dict, rounds: int, steps: int, warmup: int) -> dict:
    """``{name: [median step seconds of each round]}``: each contender ``(step, setup)`` runs
    ``steps`` timed steps in turn, round after round (``setup()`` first: the row passes on or
    off), so that a busy machine slows them alike; ``warmup`` untimed steps each, first."""
    for step, setup in contenders.values():
        setup()
        for _ in range(warmup):
            step()
    medians: dict = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, (step, setup) in contenders.items():
            setup()
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                step()
                times.append(time.perf_counter() - start)
            medians[name].append(statistics.median(times))
    return medians


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small", choices=["small", "base"])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (the figures: medians)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--extra-dropout", type=float, default=0.0,
                        help="attention and ReLU dropout in both models (default 0, the paper's)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: `pip install torch` to run this comparison",
              file=sys.stderr)
        return 2
    cores = placement.available_cores()
    torch.set_num_threads(cores)
    placement.limit_blas_threads(cores)
    placing.reuse_freed_memory()             # as the training scripts do; for both contenders

    batch, src_len, tgt_len = BATCHES[args.preset]
    cfg = translator.Config.preset(args.preset, attention_dropout=args.extra_dropout,
                                   relu_dropout=args.extra_dropout)
    src, tgt = make_batch(cfg, batch, src_len, tgt_len)
    flops = step_flops(cfg, batch, src_len, tgt_len, batch * tgt_len)
    peak = matmul_peak()
    ours = make_step(cfg, batch, src_len, tgt_len)   # as train() runs it, on the same batch
    fast = f"minitfm (NumPy, {placement.count(cores, 'thread')})"
    contenders = {
        "minitfm (NumPy, plain)": (ours, lambda: rows.use(False)),
        fast: (ours, lambda: rows.use(True, cores)),
        f"PyTorch {torch.__version__} eager": (torch_step(cfg, src, tgt), lambda: rows.use(False)),
    }
    medians = alternate(contenders, args.rounds, args.steps, args.warmup)
    peak = max(peak, matmul_peak())
    seconds = {name: statistics.median(times) for name, times in medians.items()}
    print(f"preset {args.preset}, attention and ReLU dropout {args.extra_dropout:g}, batch "
          f"{batch}x{src_len}/{tgt_len}, {flops / 1e9:.1f} GFLOP per step, float32 matmul peak "
          f"{peak:.1f} GFLOP/s; medians of {args.rounds} rounds of {args.steps} steps")
    print(f"{'':<34} {'step s':>8} {'tgt tok/s':>10} {'of peak':>8}  rounds")
    for name, value in seconds.items():
        rounds = " ".join(f"{t:.3f}" for t in medians[name])
        print(f"{name:<34} {value:>8.3f} {batch * tgt_len / value:>10.0f} "
              f"{flops / value / 1e9 / peak:>8.1%}  {rounds}")
    theirs = seconds[f"PyTorch {torch.__version__} eager"]
    print(f"minitfm is {theirs / seconds[fast]:.2f}x faster per step with the row passes "
          f"({theirs / seconds['minitfm (NumPy, plain)']:.2f}x with the plain code)")
    print(json.dumps({"preset": args.preset, "peak_gflop_per_s": peak,
                      "gflop_per_step": flops / 1e9, "threads": cores,
                      "minitfm_step_s": seconds[fast],
                      "minitfm_plain_step_s": seconds["minitfm (NumPy, plain)"],
                      "torch_step_s": theirs, "rounds": medians,
                      "torch_version": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
