"""Train a decoder-only language model on a text file, and sample from it.

    python train_lm.py --data input.txt                  # characters, the defaults: docs/results.md
    python train_lm.py --data input.txt --tokenizer bpe --vocab-size 2000 --steps 3000
    python train_lm.py --data input.txt --out runs/lm --resume           # continue that run
    python train_lm.py --sample --checkpoint runs/lm/checkpoint_00001000.npz --prompt "ROMEO:" \\
        --max-new-tokens 300 --temperature 0.8 --top-k 40 --top-p 0.95 --seed 1

Training reads the text once into token ids (characters, the vocabulary of the file's characters,
or a sentencepiece BPE trained on the file), takes the first 90 % for training and the last 10 %
for validation, and trains on ``--batch-size`` random blocks of ``--block-size`` tokens per step
(reproducible from ``--seed``) with AdamW and a warm-up then cosine (or linear, or the paper's)
learning-rate schedule, on the shared training loop (minitfm/train.py): progress bar,
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

import numpy                                                        # host bytes

from minitfm import (checkpoint, cli, distributed, generation, limits, options, phases, train,
                     usable)
from minitfm.exits import UsageError
from minitfm.options import integer, number, positive_int
from minitfm.data import text as textdata
from minitfm.models import lm

# The defaults: character-level tiny Shakespeare to a validation loss below 1.88 nats per
# character in under a minute on a two-core CPU (docs/results.md, "Language model"): the model
# of the "cpu" preset, and this recipe.
_CPU = lm.PRESETS["cpu"]
DEFAULTS = dict(tokenizer="char", vocab_size=1000, block_size=_CPU.max_len, batch_size=22,
                layers=_CPU.n_layers, d_model=_CPU.d_model, heads=_CPU.n_heads, d_ff=_CPU.d_ff,
                dropout=_CPU.dropout, lr=6e-3, min_lr=6e-4, warmup=100, schedule="cosine",
                weight_decay=0.1, steps=1000)
# the options that define a run: --resume refuses to change them
RUN_OPTIONS = ("tokenizer", "vocab_size", "block_size", "batch_size", "layers", "d_model",
               "heads", "d_ff", "dropout", "learned_positions", "post_ln", "lr", "min_lr",
               "warmup", "schedule", "weight_decay", "seed", "best_metric")
EVAL_BATCH = 64          # validation blocks per forward pass
CHAR_VOCAB_AT_LEAST = 8  # the characters are known only once the text is read: a lower bound
THREADS = 1              # BLAS threads at most by default: the matrices are too small for more
POSITIVE = number(0, low_open=True)


# ---- command line -----------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", metavar="PATH", help="the text file to train on (UTF-8, may be "
                                                  "gzipped)")
    p.add_argument("--tokenizer", choices=("char", "bpe"),
                   help=f"characters or sentencepiece BPE (default {DEFAULTS['tokenizer']})")
    p.add_argument("--vocab-size", type=limits.vocab_size_option(8),
                   help=f"BPE vocabulary size (default {DEFAULTS['vocab_size']})")
    p.add_argument("--cache-dir", help="keep the encoded tokens here, memory-mapped (for large "
                                       "files; default: encode in memory)")
    add_model_options(p.add_argument_group("model"))
    opt = p.add_argument_group("training")
    opt.add_argument("--batch-size", type=positive_int,
                     help=f"blocks per step (default {DEFAULTS['batch_size']})")
    opt.add_argument("--steps", type=positive_int, help=f"default {DEFAULTS['steps']}")
    options.add_max_epochs_option(opt, "an epoch: as many tokens as the training split holds, "
                                       "--batch-size x --block-size of them per step")
    options.add_schedule_options(opt, choices=("cosine", "linear", "paper"),
                                 default=f"default {DEFAULTS['schedule']}",
                                 lr_help=f"peak learning rate (default {DEFAULTS['lr']:g}; with "
                                         f"--schedule paper, the factor of the paper's rate)",
                                 min_lr=(None, f"default {DEFAULTS['min_lr']:g}"), steps="--steps")
    options.add_optimiser_options(opt, warmup=f"default {DEFAULTS['warmup']}",
                                  warmup_type=integer(0),
                                  weight_decay=f"default {DEFAULTS['weight_decay']:g}")
    opt.add_argument("--time-limit", type=POSITIVE, help="seconds of training, over all "
                                                         "sessions of the run")
    options.add_logging_options(opt, valid_every=(0, "default 0: only at the end"),
                                valid_option="--eval-every")
    opt.add_argument("--eval-blocks", type=integer(0), default=0,
                     help="validation blocks, evenly spaced (default 0: the whole split)")
    options.add_checkpoint_options(opt, save_every=(0, "default 0: at the end and on a signal"))
    options.add_validation_options(opt, ("loss",), "--eval-every")
    options.add_seed_option(opt)
    cli.add_placement_options(p, "numpy", THREADS)
    cli.add_run_options(p, "lm")
    add_sampling_options(p.add_argument_group(
        "sampling (after training, or from --checkpoint with --sample)"))
    args = p.parse_args(argv)
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
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.min_lr > args.lr and args.schedule != "paper":
        p.error(f"--min-lr {args.min_lr:g} is above --lr {args.lr:g}")
    if args.schedule != "paper" and args.warmup >= args.steps:
        p.error(f"--warmup {args.warmup} must be below --steps {args.steps}")
    if args.schedule == "paper" and args.warmup < 1:
        p.error("--schedule paper needs --warmup >= 1")
    options.check_validation_options(p, args, args.eval_every, "--eval-every")
    return args


def add_model_options(model) -> None:
    model.add_argument("--block-size", type=positive_int,
                       help=f"context, in tokens (default {DEFAULTS['block_size']})")
    model.add_argument("--layers", type=positive_int, help=f"default {DEFAULTS['layers']}")
    model.add_argument("--d-model", type=positive_int, help=f"default {DEFAULTS['d_model']}")
    model.add_argument("--heads", type=positive_int, help=f"default {DEFAULTS['heads']}")
    model.add_argument("--d-ff", type=positive_int, help=f"default {DEFAULTS['d_ff']}")
    model.add_argument("--dropout", type=number(0, 1, high_open=True),
                       help=f"default {DEFAULTS['dropout']}")
    model.add_argument("--learned-positions", action="store_true",
                       help="a learned position table instead of the sinusoids")
    model.add_argument("--post-ln", action="store_true",
                       help="the paper's post-LN instead of pre-LN with a final LayerNorm")


def add_sampling_options(gen) -> None:
    gen.add_argument("--sample", action="store_true",
                     help="only sample from --checkpoint, streaming the text")
    gen.add_argument("--checkpoint", help="the checkpoint to sample from")
    gen.add_argument("--prompt", default="\n", help="the text to continue (default a newline)")
    gen.add_argument("--max-new-tokens", type=integer(0), default=300)
    gen.add_argument("--temperature", type=POSITIVE, default=0.8)
    gen.add_argument("--top-k", type=positive_int, help="keep the k most likely tokens")
    gen.add_argument("--top-p", type=number(0, 1, low_open=True),
                     help="keep the most likely tokens holding this much probability")
    gen.add_argument("--greedy", action="store_true", help="the most likely token every time")
    gen.add_argument("--samples", type=integer(0), default=2,
                     help="samples printed after training (default 2)")


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
    is read (minitfm.limits): training, then sampling with the model state kept."""
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


def tokenizer_id(tokenizer: textdata.Tokenizer) -> str:
    return f"{tokenizer.kind}:{tokenizer.identifier}"


def stored_tokenizer(ckpt: checkpoint.Checkpoint) -> textdata.Tokenizer:
    kind = (ckpt.vocab_id or "").split(":", 1)[0]
    if ckpt.vocab_model is None or kind not in ("char", "bpe"):
        raise checkpoint.CheckpointError(f"checkpoint {ckpt.path} holds no tokenizer: it was not "
                                         f"written by train_lm.py")
    return textdata.tokenizer_from_array(kind, numpy.frombuffer(ckpt.vocab_model, numpy.uint8))


def make_tokenizer(args: argparse.Namespace) -> textdata.Tokenizer:
    if args.tokenizer == "char":
        return textdata.CharTokenizer.from_file(args.data)
    say(f"training a {args.vocab_size}-piece BPE vocabulary on {args.data}")
    return textdata.BPETokenizer.train(args.data, args.vocab_size)


def train_batches(tokens, args: argparse.Namespace):
    """``factory(epoch)`` for train(): batch k of the endless stream is random_blocks(step k)."""
    def factory(epoch: int):
        step = 1
        while True:
            yield textdata.random_blocks(tokens, args.batch_size, args.block_size, args.seed,
                                         step)
            step += 1
    return factory


def encode_prompt(tokenizer: textdata.Tokenizer, prompt: str):
    """The prompt's token ids, checked before any work: known characters, at least one token."""
    ids = tokenizer.encode(prompt)
    if not len(ids):
        raise UsageError("--prompt must hold at least one token")
    return ids


def stream_sample(params: dict, cfg: lm.LMConfig, tokenizer, prompt, args: argparse.Namespace,
                  seed: int) -> str:
    """Print the prompt, then the text as each token is drawn; return the whole text."""
    ids = [int(i) for i in prompt]
    shown = tokenizer.decode(ids)
    sys.stdout.write(shown)
    sys.stdout.flush()
    tokens = generation.generate(params, cfg, prompt, args.max_new_tokens,
                                 temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                 seed=seed, greedy=args.greedy)
    for token in tokens:
        ids.append(int(token[0]))
        text = tokenizer.decode(ids)        # the whole text: BPE pieces join with their spaces
        sys.stdout.write(text[len(shown):])
        sys.stdout.flush()
        shown = text
    sys.stdout.write("\n")
    sys.stdout.flush()
    return shown


def run_training(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    cli.reuse_freed_memory()
    chosen = cli.select_backend(args.backend, "numpy")
    # GPU or threads, precision, kernels: the first line
    cli.place(args.threads, THREADS, args.precision, kernels=args.kernels)
    check_sizes(args)
    resumed = cli.check_resumable(args, RUN_OPTIONS, lm.KIND)
    tokenizer = make_tokenizer(args) if resumed is None else stored_tokenizer(resumed)
    prompt = encode_prompt(tokenizer, args.prompt) if args.samples else None
    with distributed.world().root_first():   # rank 0 writes the token cache, the others read it
        data = textdata.load_text(args.data, tokenizer, block_size=args.block_size,
                                  cache_dir=args.cache_dir)
    cfg = model_config(args, tokenizer.size)
    steps = phases.budget_steps(args.steps, args.max_epochs,
                                len(data.train) / (args.batch_size * args.block_size))
    if args.schedule != "paper" and args.warmup >= steps:
        raise UsageError(f"--max-epochs {args.max_epochs:g} is {steps} steps, not more than "
                         f"--warmup {args.warmup}: the {args.schedule} decay ends at the last step")
    valid = list(textdata.validation_blocks(data.valid, EVAL_BATCH, args.block_size,
                                            args.eval_blocks or None))
    train_options = train.TrainOptions(
        steps=steps, out_dir=args.out, seed=args.seed, warmup=max(args.warmup, 1),
        schedule=cli.lr_schedule(args.schedule, d_model=cfg.d_model, warmup=args.warmup,
                                 steps=steps, lr=args.lr, min_lr=args.min_lr),
        **options.validation_options(args), **options.precision_options(args),
        weight_decay=args.weight_decay,
        clip_norm=args.clip_norm, log_every=10, valid_every=args.eval_every,
        save_every=args.save_every, keep_last=2, resume=args.resume,
        time_limit=args.time_limit, vocab_id=tokenizer_id(tokenizer),
        vocab_model=tokenizer.as_array().tobytes(),
        run_meta={"tokens": len(data.train) + len(data.valid), "block_size": args.block_size,
                  "batch_size": args.batch_size},
        run_info={"args": vars(args), "config": cfg.to_dict()}, progress=not args.quiet)
    n_valid = sum(x.size for x, _ in valid)
    say(f"{args.data}: {len(data.train):,} training and {len(data.valid):,} validation tokens "
        f"({tokenizer.kind}, {tokenizer.size} in the vocabulary; validating on {n_valid:,}); "
        f"{cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads, d_ff {cfg.d_ff}, "
        f"{'learned' if cfg.learned_positions else 'sinusoidal'} positions, "
        f"{'pre' if cfg.pre_ln else 'post'}-LN; {steps} steps"
        + (f" ({args.max_epochs:g} epochs)" if args.max_epochs else "")
        + f" of {args.batch_size} x "
        f"{args.block_size} tokens; backend {chosen}; run {args.out}")
    state = train.train(cfg, train_batches(data.train, args), train_options, valid_batches=valid)
    if state.interrupted:
        return cli.stopped(state, args.out)
    if state.out_of_time:
        say(f"time limit of {args.time_limit:g} s reached at step {state.step}")
    if state.out_of_patience:
        say(f"stopped at step {state.step}: no better validation loss in {args.patience} "
            f"validations ({state.record.describe_best()})")
    if "valid_loss" not in state.valid:          # the run was complete already
        state.valid = train.evaluate(state.params, cfg, valid)
    for k in range(args.samples):
        say(f"--- sample {k + 1} (temperature {args.temperature:g}, seed {args.seed + k})")
        stream_sample(state.params, cfg, tokenizer, prompt, args, seed=args.seed + k)
    say(f"validation loss {state.valid['valid_loss']:.4f} nats per token (perplexity "
        f"{state.valid['valid_ppl']:.2f}) at step {state.step}"
        + (f" ({state.record.describe_best()})" if state.record.best is not None else "")
        + f"; {state.elapsed:.1f} s of "
        f"training, {time.perf_counter() - started:.1f} s in all")
    return 0


def run_sampling(args: argparse.Namespace) -> int:
    cli.select_backend(args.backend, "numpy")
    cli.place(args.threads, THREADS, args.precision, announce=False,
              kernels=args.kernels)    # output: the text alone
    checked = usable.load(args.checkpoint, lm.KIND, with_optimizer=False)
    tokenizer = stored_tokenizer(checked.ckpt)
    params, cfg = checkpoint.params_to_device(checked.ckpt.params), checked.config
    limits.check_fits("sampling", {"--max-new-tokens": (args.max_new_tokens,
                                                        range(0, args.max_new_tokens + 1))},
                      lambda v: limits.sampling_estimate(cfg, new_tokens=v["--max-new-tokens"],
                                                         params=False))
    stream_sample(params, cfg, tokenizer, encode_prompt(tokenizer, args.prompt), args,
                  seed=args.seed)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sample:
        return cli.report_errors(lambda: run_sampling(args), sizes="--max-new-tokens")
    return cli.report_errors(lambda: cli.run_in_directory(args, "lm", lambda: run_training(args)),
                             sizes="--batch-size or --block-size")


if __name__ == "__main__":
    sys.exit(main())
