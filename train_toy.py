"""Train a small Transformer on a synthetic task (copy, reverse or sort) and report exact match.

    python train_toy.py                       # copy 10 symbols: 100 % exact match in seconds
    python train_toy.py --task reverse
    python train_toy.py --task sort --steps 1000 --out runs/sort
    python train_toy.py --task sort --out runs/sort --steps 1500 --resume   # continue that run
    mpiexec -n 2 python train_toy.py          # 2 workers: each update is 2 batches, one each

Each task has its own defaults (``TASK_DEFAULTS``), chosen to reach >= 99 % exact match on a
two-core CPU in well under a minute; any option given on the command line wins. At the end the
model decodes held-out sequences greedily and prints the exact-match accuracy and a few examples.
Checkpoints and ``log.jsonl`` go to ``--out`` (default ``runs/toy-<task>-<time>``); Ctrl-C saves
a checkpoint (so do SIGTERM and SIGHUP), and ``--resume`` continues from the latest one.
"""

from __future__ import annotations

import argparse
import sys
import time

from minitfm import backend, cli, distributed, limits, options, tasks, train
from minitfm.options import integer, number, positive_int
from minitfm.decode import greedy
from minitfm.models.translator import PRESETS, Config

# Per task: steps, batch size, learning-rate factor, warmup, label smoothing, model shape (None:
# the preset's). Label smoothing keeps the late steps stable: without it the loss of a solved task
# heads for zero and Adam's normalised updates make exact match swing by tens of percent. Sorting
# (counting repeated symbols) is the touchiest: a lower rate, larger batches and 8 heads (with
# 4 heads one seed in four miscounts symbols repeated 3-4 times: 98.8 % exact match).
MODEL_DEFAULTS = dict(layers=None, d_model=None, heads=None, d_ff=None, label_smoothing=0.1)
TASK_DEFAULTS = {
    "copy": dict(steps=300, batch_size=64, lr_factor=0.3, warmup=100, **MODEL_DEFAULTS),
    "reverse": dict(steps=300, batch_size=64, lr_factor=0.3, warmup=100, **MODEL_DEFAULTS),
    "sort": dict(steps=500, batch_size=128, lr_factor=0.05, warmup=50,
                 **{**MODEL_DEFAULTS, "heads": 8}),
}
# The toy model's matrices are too small for a second BLAS thread to pay off (--threads wins).
THREADS = 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    fraction = number(0, 1, high_open=True)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", choices=tasks.TASKS, default="copy")
    p.add_argument("--vocab", type=integer(2), default=10, help="number of symbols (default 10)")
    p.add_argument("--length", type=positive_int, default=10,
                   help="symbols per sequence (default 10)")
    p.add_argument("--steps", type=positive_int, help="training updates (default: per task)")
    p.add_argument("--batch-size", type=positive_int,
                   help="sequences per batch (default: per task)")
    p.add_argument("--preset", choices=tuple(PRESETS), default="toy",
                   help="model preset (default toy)")
    p.add_argument("--layers", type=positive_int, help="encoder and decoder layers "
                                                       "(default: preset)")
    p.add_argument("--d-model", type=positive_int, help="model width (default: preset)")
    p.add_argument("--heads", type=positive_int, help="attention heads (default: preset)")
    p.add_argument("--d-ff", type=positive_int, help="feed-forward width (default: preset)")
    p.add_argument("--label-smoothing", type=fraction, help="eps_ls (default: per task)")
    options.add_optimiser_options(p, warmup="default: per task",
                                  lr_factor=(None, "default: per task"))
    options.add_seed_option(p)
    cli.add_placement_options(p, "numpy", THREADS)
    cli.add_run_options(p, "toy-<task>")
    p.add_argument("--eval-size", type=positive_int, default=500,
                   help="held-out sequences (default 500)")
    options.add_logging_options(p, valid_every=(0, "default 0: only at the end"))
    options.add_checkpoint_options(p, save_every=(0, "default 0: at the end and on a signal"))
    options.add_validation_options(p, ("acc",))
    p.add_argument("--examples", type=integer(0), default=5, help="examples to print (default 5)")
    args = p.parse_args(argv)
    for name, value in TASK_DEFAULTS[args.task].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    options.check_validation_options(p, args, args.valid_every)
    return args


def model_config(args: argparse.Namespace) -> Config:
    return cli.model_config(args.preset, tasks.model_vocab(args.vocab), args)


def check_sizes(args: argparse.Namespace, cfg: Config) -> None:
    """The size options against the memory there is, before any work (minitfm.limits): the
    training batches, then the greedy decoding of the held-out set, the model state kept."""
    sizes = {"--batch-size": (args.batch_size, range(1, args.batch_size + 1)),
             "--length": (args.length, range(1, args.length + 1)),
             "--vocab": (args.vocab, range(2, args.vocab + 1)), **limits.model_sizes(cfg)}

    def config(values: dict) -> Config:
        vocab = tasks.model_vocab(values["--vocab"])
        return limits.with_model_sizes(cfg, values, src_vocab=vocab, tgt_vocab=vocab)

    limits.check_fits("training", sizes, lambda v: limits.training_estimate(
        config(v), rows=v["--batch-size"], src_len=v["--length"] + 1, tgt_len=v["--length"] + 1))
    del sizes["--batch-size"]
    sizes["--eval-size"] = (args.eval_size, range(1, args.eval_size + 1))
    limits.check_fits("decoding the held-out set", sizes, lambda v: limits.state_estimate(
        config(v)) + limits.decoding_estimate(config(v), rows=v["--eval-size"],
                                              src_len=v["--length"] + 1,
                                              out_len=v["--length"] + 1, params=False))


def decode_symbols(params: dict, cfg: Config, inputs, length: int) -> list[list[int]]:
    """Greedy outputs for rows of input symbols; room for one token more than the answer."""
    src, _ = tasks.to_batch(inputs, inputs)
    return greedy(params, cfg, backend.to_device(src), max_len=length + 1)


def show(symbols) -> str:
    return " ".join(str(int(s) - tasks.FIRST_SYMBOL) for s in symbols)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    cli.reuse_freed_memory()
    world = distributed.world()      # several workers (mpiexec): rank 0 writes and reports
    chosen = cli.select_backend(args.backend, "numpy")
    # GPU or threads, precision, kernels: the first line
    cli.place(args.threads, THREADS, args.precision, kernels=args.kernels)
    cfg = model_config(args)
    if args.length + 2 > cfg.max_len:      # the target: BOS, the symbols, EOS
        raise cli.UsageError(f"--length {args.length} is too long for the {args.preset} "
                             f"preset's {cfg.max_len} positions: use --length "
                             f"{cfg.max_len - 2} or less")
    check_sizes(args, cfg)
    inputs, outputs = tasks.held_out(args.task, args.eval_size, vocab=args.vocab,
                                     length=args.length, seed=args.seed)

    def exact_match(params: dict, cfg: Config) -> dict:
        hyps = decode_symbols(params, cfg, inputs, args.length)
        return {"valid_acc": tasks.exact_match(hyps, outputs)}

    train_options = train.TrainOptions(
        steps=args.steps, out_dir=args.out, seed=args.seed, lr_factor=args.lr_factor,
        warmup=args.warmup, clip_norm=args.clip_norm, log_every=10,
        valid_every=args.valid_every,
        save_every=args.save_every, keep_last=2, resume=args.resume,
        **options.validation_options(args), **options.precision_options(args),
        vocab_id=f"toy-{args.vocab}-symbols",
        run_meta={"task": args.task, "length": args.length, "batch_size": args.batch_size},
        progress=not args.quiet)
    batches = tasks.train_batches(args.task, vocab=args.vocab, length=args.length,
                                  batch_size=args.batch_size, seed=args.seed)
    if world.is_root:
        print(f"{args.task}: {args.vocab} symbols, length {args.length}, {args.steps} steps of "
              f"{args.batch_size} sequences; d_model {cfg.d_model}, {cfg.n_layers} layers, "
              f"{cfg.n_heads} heads, d_ff {cfg.d_ff}, label smoothing {cfg.label_smoothing}; "
              f"backend {chosen}; run {args.out}"
              + (f"; {world.describe()}" if world.distributed else ""), flush=True)
    state = train.train(cfg, batches, train_options, valid_metric=exact_match)
    if state.interrupted:
        return cli.stopped(state, args.out)
    if not world.is_root:
        return 0
    if state.out_of_patience:
        print(f"stopped at step {state.step}: no better exact match in {args.patience} "
              f"validations ({state.record.describe_best()})", flush=True)
    accuracy = state.valid.get("valid_acc")
    if accuracy is None:      # the run was already complete: nothing was validated
        accuracy = exact_match(state.params, cfg)["valid_acc"]
    hyps = decode_symbols(state.params, cfg, inputs[:args.examples], args.length) \
        if args.examples else []
    for row, hyp, answer in zip(inputs, hyps, outputs):
        mark = "ok" if list(hyp) == answer.tolist() else "WRONG"
        print(f"  {show(row)}  ->  {show(hyp)}  [{mark}]")
    print(f"exact match on {len(inputs)} held-out sequences: {100 * accuracy:.1f} % "
          f"(step {state.step}, {time.perf_counter() - started:.1f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return cli.report_errors(
        lambda: cli.run_in_directory(args, f"toy-{args.task}", lambda: run(args)),
        sizes="--batch-size (or --eval-size)")


if __name__ == "__main__":
    sys.exit(main())
