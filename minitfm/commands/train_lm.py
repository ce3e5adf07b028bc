"""Train a decoder-only language model on a text file, and sample from it.

    python train_lm.py --data input.txt                  # characters, the defaults: docs/results.md
    python train_lm.py --data input.txt --tokenizer bpe --vocab-size 2000 --max-steps 3000
    python train_lm.py --data input.txt --out runs/lm --resume           # continue that run
    python train_lm.py --sample --checkpoint runs/lm/checkpoint_00001000.npz --prompt "ROMEO:" \\
        --max-new-tokens 300 --temperature 0.8 --top-k 40 --top-p 0.95 --seed 1

Training reads the text once into token ids (characters, the vocabulary of the file's characters,
or a sentencepiece BPE trained on the file), takes the first 90 % for training and the last 10 %
for validation, and trains on ``--batch-size`` random blocks of ``--block-size`` tokens per step
(reproducible from ``--seed``) with AdamW and a warm-up then cosine (or linear, or the paper's)
learning-rate schedule, on the shared training loop (minitfm/training/): progress bar,
``log.jsonl``, checkpoints, ``--time-limit``, Ctrl-C / SIGTERM save a checkpoint and exit with
128 + the signal, ``--resume`` continues from the latest one bit for bit. At the end it prints the
validation loss (nats per token) and a few samples. ``--best-metric loss`` keeps the checkpoint
of the best validation as ``checkpoint_best.npz`` (``--keep-best``, ``--patience``: as for
``train_wmt.py``); ``--max-epochs`` sets the budget in passes over the training tokens.

``--sample`` streams text from a checkpoint as it is generated, over the model's key/value cache.
A user error (a bad option value, a missing or empty file, a checkpoint of another kind or run)
prints one ``error:`` line and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from minitfm.workers import distributed
from minitfm.cli import exits, limits, options, placing, reporting, runs
from minitfm.commands import lm_sampling
from minitfm.data import text as textdata
from minitfm.data import tokenizers
from minitfm.cli.exits import UsageError
from minitfm.models import lm
from minitfm.cli.argtypes import Parser, integer, number, positive_int
from minitfm.training import loop, phases
from minitfm.training.run import Run
from minitfm.training.validation import evaluate

# The defaults: character-level tiny Shakespeare to a validation loss below 1.88 nats per
# character in under a minute on a two-core CPU (docs/results.md, "Language model"): the model
# of the "cpu" preset, and this recipe.
_CPU = lm.PRESETS["cpu"]
THREADS = None           # training: the worker's share of the cores (the batch's two shards
                         # side by side: 1.5x one thread's steps on two cores)
SAMPLING_THREADS = 1     # one position at a time: products too small for a second thread
TRAINER = options.Trainer(
    shared=("vocab_size", "layers", "d_model", "heads", "d_ff", "dropout", "batch_size",
            "max_steps", "max_epochs", "time_limit", "schedule", "lr", "lr_factor", "min_lr",
            "warmup", "weight_decay", "clip_norm", "seed", "log_every", "valid_every",
            "save_every", "keep_last", "best_metric", "keep_best", "patience", "checkpoint",
            *options.PLACEMENT, *options.RUN),
    defaults=dict(tokenizer="char", vocab_size=1000, block_size=_CPU.max_len, batch_size=22,
                  layers=_CPU.n_layers, d_model=_CPU.d_model, heads=_CPU.n_heads, d_ff=_CPU.d_ff,
                  dropout=_CPU.dropout, lr=6e-3, lr_factor=1.0, min_lr=6e-4, warmup=100,
                  schedule="cosine", weight_decay=0.1, max_steps=1000, seed=0, log_every=10,
                  valid_every=0, save_every=0, keep_last=2, keep_best=0, patience=0,
                  **placing.placement_defaults("numpy", THREADS), **runs.run_defaults("lm")),
    choices=dict(best_metric=("loss",)),
    # the options that define a run: --resume refuses to change them
    defining=("tokenizer", "vocab_size", "block_size", "batch_size", "layers", "d_model",
              "heads", "d_ff", "dropout", "learned_positions", "post_ln", "lr", "min_lr",
              "warmup", "schedule", "weight_decay", "seed", "best_metric"))
EVAL_BATCH = 64          # validation blocks per forward pass
CHAR_VOCAB_AT_LEAST = 8  # the characters are known only once the text is read: a lower bound


# ---- command line -----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = Parser(description=__doc__.split("\n")[0])
    data = p.add_argument_group("data")
    data.add_argument("--data", metavar="PATH",
                      help="the text file to train on (UTF-8, may be gzipped)")
    data.add_argument("--tokenizer", choices=("char", "bpe"),
                      help="characters or sentencepiece BPE (default char)")
    TRAINER.add_options(data, ["vocab_size"])
    data.add_argument("--cache-dir", help="keep the encoded tokens here, memory-mapped (for "
                                          "large files; default: encode in memory)")
    model = p.add_argument_group("model")
    model.add_argument("--block-size", type=positive_int,
                       help=f"context, in tokens (default {_CPU.max_len})")
    TRAINER.add_options(model, ["layers", "d_model", "heads", "d_ff", "dropout"])
    model.add_argument("--learned-positions", action="store_true",
                       help="a learned position table instead of the sinusoids")
    model.add_argument("--post-ln", action="store_true",
                       help="the paper's post-LN instead of pre-LN with a final LayerNorm")
    opt = p.add_argument_group("training")
    TRAINER.add_options(opt, ["batch_size", "max_steps", "max_epochs", "time_limit", "schedule",
                              "lr", "lr_factor", "min_lr", "warmup", "weight_decay",
                              "clip_norm", "seed", "log_every", "valid_every"])
    opt.add_argument("--eval-blocks", type=integer(0), default=0,
                     help="validation blocks, evenly spaced (default 0: the whole split)")
    TRAINER.add_options(opt, ["save_every", "keep_last", "best_metric", "keep_best",
                              "patience"])
    TRAINER.add_options(p.add_argument_group("placement"), options.PLACEMENT)
    TRAINER.add_options(p.add_argument_group("run"), options.RUN)
    add_sampling_options(p.add_argument_group(
        "sampling (after training, or from --checkpoint with --sample)"))
    return p


def add_sampling_options(gen) -> None:
    gen.add_argument("--sample", action="store_true",
                     help="only sample from --checkpoint, streaming the text")
    TRAINER.add_options(gen, ["checkpoint"])
    gen.add_argument("--prompt", default="\n", help="the text to continue (default a newline)")
    gen.add_argument("--max-new-tokens", type=integer(0), default=300)
    gen.add_argument("--temperature", type=number(0, low_open=True), default=0.8)
    gen.add_argument("--top-k", type=positive_int, help="keep the k most likely tokens")
    gen.add_argument("--top-p", type=number(0, 1, low_open=True),
                     help="keep the most likely tokens holding this much probability")
    gen.add_argument("--greedy", action="store_true", help="the most likely token every time")
    gen.add_argument("--samples", type=integer(0), default=2,
                     help="samples printed after training (default 2)")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = build_parser()
    args = options.parse(p, TRAINER, argv)
    if args.sample:
        given = [name for name in ("data", "resume", "out") if getattr(args, name)]
        if not args.checkpoint:
            p.error("--sample needs --checkpoint CKPT")
        if given:
            p.error(f"--sample reads only --checkpoint; drop --{given[0].replace('_', '-')}")
        return args
    if not args.data:
        p.error("--data PATH is required (the text to train on), or --sample --checkpoint CKPT")
    if args.checkpoint:
        p.error("--checkpoint is for --sample; to continue a run use --out DIR --resume")
    return args


def say(text: str) -> None:
    print(text, flush=True)


# ---- the pieces of a run ----------------------------------------------------------------------

def model_config(args: argparse.Namespace, vocab: int) -> lm.LMConfig:
    try:
        return lm.LMConfig(vocab=vocab, n_layers=args.layers, d_model=args.d_model,
                           d_ff=args.d_ff, n_heads=args.heads, dropout=args.dropout,
                           pre_ln=not args.post_ln, learned_positions=args.learned_positions,
                           max_len=args.block_size)
    except ValueError as exc:
        raise UsageError(f"model options: {exc}") from exc


def check_sizes(args: argparse.Namespace) -> None:
    """Every size option against sentencepiece's limits and the memory there is, before any data
    is read (minitfm.cli.limits): training, then sampling with the model state kept."""
    bpe = args.tokenizer == "bpe"
    if bpe:
        limits.check_vocab_for_corpus(args.vocab_size, [args.data])
    base = model_config(args, args.vocab_size if bpe else CHAR_VOCAB_AT_LEAST)
    sizes = {"--batch-size": (args.batch_size, range(1, args.batch_size + 1)),
             "--block-size": (args.block_size, range(1, args.block_size + 1)),
             **limits.model_sizes(base)}
    if bpe:
        sizes["--vocab-size"] = (args.vocab_size, range(8, args.vocab_size + 1))

    def config(values: dict) -> lm.LMConfig:
        return limits.with_model_sizes(base, values, max_len=values["--block-size"],
                                       vocab=values.get("--vocab-size", base.vocab))

    limits.check_fits("training", sizes, lambda v: limits.training_estimate(
        config(v), rows=v["--batch-size"], src_len=0, tgt_len=v["--block-size"]))
    if args.samples:
        sizes["--max-new-tokens"] = (args.max_new_tokens, range(0, args.max_new_tokens + 1))
        del sizes["--batch-size"]
        limits.check_fits("sampling", sizes, lambda v: limits.state_estimate(config(v))
                          + limits.sampling_estimate(config(v), new_tokens=v["--max-new-tokens"],
                                                     params=False))


def tokenizer_id(tokenizer: tokenizers.Tokenizer) -> str:
    return f"{tokenizer.kind}:{tokenizer.identifier}"


def make_tokenizer(args: argparse.Namespace) -> tokenizers.Tokenizer:
    if args.tokenizer == "char":
        return tokenizers.CharTokenizer.from_file(args.data)
    say(f"training a {args.vocab_size}-piece BPE vocabulary on {args.data}")
    return tokenizers.BPETokenizer.train(args.data, args.vocab_size)


def train_batches(tokens, args: argparse.Namespace):
    """``factory(epoch)`` for train(): batch k of the endless stream is random_blocks(step k)."""
    def factory(epoch: int):
        step = 1
        while True:
            yield textdata.random_blocks(tokens, args.batch_size, args.block_size, args.seed,
                                         step)
            step += 1
    return factory


def run_training(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    placing.reuse_freed_memory()
    chosen = placing.select_backend(args.backend, "numpy")
    placing.place(args.threads, THREADS, args.precision, kernels=args.kernels)  # the first line
    check_sizes(args)
    with Run(options.train_options(args, TRAINER), lm.KIND) as run:   # a resume: checked now
        resumed = run.resumed_vocab()
        tokenizer = (make_tokenizer(args) if resumed is None
                     else lm_sampling.stored_tokenizer(*resumed, f"of {args.out}"))
        prompt = lm_sampling.encode_prompt(tokenizer, args.prompt) if args.samples else None
        with distributed.world().root_first():   # rank 0 writes the token cache, others read it
            data = textdata.load_text(args.data, tokenizer, block_size=args.block_size,
                                      cache_dir=args.cache_dir)
        cfg = model_config(args, tokenizer.size)
        valid = list(textdata.validation_blocks(data.valid, EVAL_BATCH, args.block_size,
                                                args.eval_blocks or None))
        run.start(cfg, epoch_updates=len(data.train) / (args.batch_size * args.block_size),
                  vocab_id=tokenizer_id(tokenizer), vocab_model=tokenizer.as_array().tobytes(),
                  valid_batches=valid,
                  run_meta={"tokens": len(data.train) + len(data.valid),
                            "block_size": args.block_size, "batch_size": args.batch_size})
        n_valid = sum(x.size for x, _ in valid)
        say(f"{args.data}: {len(data.train):,} training and {len(data.valid):,} validation "
            f"tokens ({tokenizer.kind}, {tokenizer.size} in the vocabulary; validating on "
            f"{n_valid:,}); {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads, "
            f"d_ff {cfg.d_ff}, {'learned' if cfg.learned_positions else 'sinusoidal'} "
            f"positions, {'pre' if cfg.pre_ln else 'post'}-LN; {run.plan.steps} steps"
            + (f" ({args.max_epochs:g} epochs)" if args.max_epochs else "")
            + f" of {args.batch_size} x {args.block_size} tokens; backend {chosen}; "
              f"run {args.out}")
        state = loop.train(run, train_batches(data.train, args))
    if state.interrupted:
        return runs.stopped(state, args.out)
    with exits.after_training("the samples", state.last_checkpoint, state.step,
                              "--max-new-tokens", f"sample alone with python train_lm.py "
                              f"--sample --checkpoint {state.last_checkpoint}"):
        finish(args, state, cfg, tokenizer, prompt, valid, started)
    return 0


def finish(args: argparse.Namespace, state, cfg: lm.LMConfig, tokenizer, prompt, valid,
           started: float) -> None:
    """How the run ended, the samples, and the validation loss."""
    if state.out_of_time:
        say(f"time limit of {phases.describe_duration(args.time_limit)} reached at step "
            f"{state.step}")
    if state.out_of_patience:
        say(f"stopped at step {state.step}: no better validation loss in {args.patience} "
            f"validations ({state.record.describe_best()})")
    if "valid_loss" not in state.valid:          # the run was complete already
        state.valid = evaluate(state.params, cfg, valid)
    for k in range(args.samples):
        say(f"--- sample {k + 1} (temperature {args.temperature:g}, seed {args.seed + k})")
        lm_sampling.stream_sample(state.params, cfg, tokenizer, prompt, args, seed=args.seed + k)
    say(f"validation loss {state.valid['valid_loss']:.4f} nats per token (perplexity "
        f"{state.valid['valid_ppl']:.2f}) at step {state.step}"
        + (f" ({state.record.describe_best()})" if state.record.best is not None else "")
        + f"; {state.elapsed:.1f} s of training, {time.perf_counter() - started:.1f} s in all")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sample:
        return reporting.report_errors(
            lambda: lm_sampling.run_sampling(args, SAMPLING_THREADS), sizes="--max-new-tokens")

    def in_its_directory() -> int:
        with runs.run_directory(args, "lm"):
            return run_training(args)
    return reporting.report_errors(in_its_directory, sizes="--batch-size or --block-size")


if __name__ == "__main__":
    sys.exit(main())
