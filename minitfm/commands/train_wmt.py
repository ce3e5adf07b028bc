"""Train a Transformer translation model and score it with sacreBLEU: the paper's recipe end to end.

    # Multi30k (or any corpus) on a CPU, with the small preset
    python train_wmt.py --trainpref DATA/train --validpref DATA/val \\
        --testpref DATA/test_2016_flickr --source-lang en --target-lang de --preset small \\
        --time-limit 60m --out runs/multi30k

    # WMT14 English-German on a GPU, the paper's base model
    python train_wmt.py --prepare wmt14 --preset base --backend cupy --out runs/base

    # N data-parallel workers (pip install -e ".[mpi]"); one per GPU with --backend cupy
    mpiexec -n 2 python train_wmt.py --trainpref DATA/train ... --out runs/multi30k

    # score a checkpoint on a test set only (WMT SGML, plain or gzipped text)
    python train_wmt.py --eval-only --checkpoint runs/base/averaged.npz \\
        --test-src newstest2014-deen-src.en.sgm --test-ref newstest2014-deen-ref.de.sgm

What it does, in order (paper, sections 5 and 6.1; docs/results.md has the details): prepare or read
the corpora (``PREFIX.LANG``, plain or gzipped) and check each is not empty; train or reuse one
joint sentencepiece BPE vocabulary; encode every corpus once into memory-mapped arrays (training
pairs cleaned by Moses' rules unless ``--no-clean``); train with Adam, the warmup schedule, label
smoothing and token-count batches, validating (loss, greedy BLEU) and saving checkpoints on the
way, until ``--max-steps``, ``--max-epochs``, ``--time-limit`` or ``--patience``; average the last
``--average-last`` checkpoints (or the ``--average-best`` best by validation) into
``averaged.npz``; translate the test set with beam search and score it with sacreBLEU
(``STEM.test.hyp.LANG``, ``STEM.test.bleu.json``).

Choosing by validation (``--best-metric``, ``--keep-best``, ``--patience``: a run stopped by
patience still averages and tests), late dropout and the cool-down (``--dropout-start``,
``--cooldown``: in updates or epochs, the same on any machine): ``--help`` says what each does.
Defaults per preset (``PRESET_DEFAULTS``, listed by ``--help``): ``small`` suits a CPU; ``base``
and ``big`` follow the paper (about 25k tokens per update as 6 batches of 4096 tokens; on a large
GPU ``--max-tokens 12500 --update-freq 2`` is faster). ``--resume`` continues the run in
``--out`` from its latest checkpoint, with the same data position and random state. Every
corpus named is checked before any work, and a resumed run's options and latest checkpoint
before anything is written. Ctrl-C, SIGTERM or SIGHUP saves a checkpoint and exits with 128 +
the signal's number; a user error (bad option values, missing, empty or misaligned files,
another run's checkpoint) prints one ``error:`` line and exits with 2; a full disk, or too
little memory, 1.

Under ``mpiexec -n N`` each of the N workers takes ``--update-freq`` batches of every update (the
arithmetic of one worker with N times the ``--update-freq``); rank 0 prepares the data first (the
others then read its cache, so ``--data-dir`` must be on a file system all of them see), and
alone writes the run directory, shows progress and runs the final evaluation. A signal to any
worker stops all of them with a checkpoint; an error in one ends all of them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from minitfm import backend
from minitfm.workers import distributed
from minitfm.cli import wmt
from minitfm.cli import exits, options, placing, reporting, runs
from minitfm.data import epoch_batches, eval_arrays, read_parallel, token_batches
from minitfm.cli.exits import UsageError
from minitfm.models import translator as model
from minitfm.cli.argtypes import Parser, integer, positive_int
from minitfm.cli.options import Words
from minitfm.training import loop, phases
from minitfm.training.run import Run

PRESET_DEFAULTS = {
    # a CPU: Multi30k-sized corpora
    "small": dict(vocab_size=8000, max_tokens=3072, update_freq=1, warmup=1000, max_steps=20000,
                  schedule="paper", save_every=250, valid_every=500),
    # the paper's models on one GPU: 6 x 4096 = about 25k tokens per update (section 5.1)
    "base": dict(vocab_size=37000, max_tokens=4096, update_freq=6, warmup=4000,
                 max_steps=100_000, schedule="paper", save_every=1000, valid_every=2000),
    "big": dict(vocab_size=37000, max_tokens=4096, update_freq=6, warmup=4000,
                max_steps=300_000, schedule="paper", save_every=1000, valid_every=2000),
}
PRESET = Words("the preset's")
TRAINER = options.Trainer(
    shared=("preset", "layers", "d_model", "d_ff", "heads", "dropout", "label_smoothing",
            "vocab_size", "dropout_start", "dropout_start_margin", "max_steps", "max_epochs",
            "time_limit", "update_freq", "warmup", "lr_factor", "weight_decay", "clip_norm",
            "schedule", "lr", "min_lr", "cooldown", "seed", "log_every", "valid_every",
            "save_every", "keep_last", "best_metric", "keep_best", "patience", "checkpoint",
            *options.SEARCH, *options.PLACEMENT, *options.RUN),
    defaults=dict(preset="small", layers=PRESET, d_model=PRESET, d_ff=PRESET, heads=PRESET,
                  dropout=PRESET, label_smoothing=PRESET, dropout_start=0.0,
                  dropout_start_margin=0.02, lr_factor=1.0, weight_decay=0.0, min_lr=0.0,
                  seed=0, log_every=10, keep_last=5, keep_best=0, patience=0,
                  **options.SEARCH_DEFAULTS, **placing.placement_defaults("auto", None),
                  **runs.run_defaults("wmt-<preset>")),
    by="preset", varying=PRESET_DEFAULTS,
    choices=dict(preset=tuple(PRESET_DEFAULTS), best_metric=("bleu", "loss")),
    # the options that define a run: --resume refuses to change them
    defining=("source_lang", "target_lang", "vocab_size", "no_clean", "preset", "layers",
              "d_model", "d_ff", "heads", "max_len", "dropout", "attention_dropout",
              "relu_dropout", "word_dropout", "pre_ln", "label_smoothing", "max_tokens", "seed",
              "schedule", "lr", "min_lr", "cooldown", "dropout_start", "dropout_start_margin",
              "subword_dropout", "best_metric"))


# ---- command line -----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = Parser(description=__doc__.split("\n")[0], epilog=TRAINER.table(),
               formatter_class=argparse.RawDescriptionHelpFormatter)
    data = p.add_argument_group("data")
    data.add_argument("--trainpref", help="training corpus PREFIX (PREFIX.SRC, PREFIX.TGT)")
    data.add_argument("--validpref", help="validation corpus prefix (loss and BLEU)")
    data.add_argument("--testpref", help="test corpus prefix (final BLEU)")
    data.add_argument("--test-src", help="test source file: plain, gzipped or WMT SGML")
    data.add_argument("--test-ref", help="test reference file, same format as --test-src")
    data.add_argument("--source-lang", default="en", help="source language suffix (default en)")
    data.add_argument("--target-lang", default="de", help="target language suffix (default de)")
    data.add_argument("--prepare", metavar="DIR",
                      help="download and prepare WMT14 into DIR, then use DIR/train, DIR/valid "
                           "and DIR/test (explicit prefixes win)")
    data.add_argument("--data-dir", help="vocabulary and encoded-corpus cache (default OUT/data)")
    TRAINER.add_options(data, ["vocab_size"])
    data.add_argument("--no-clean", action="store_true",
                      help="do not drop empty, overlong or badly proportioned training pairs")
    arch = p.add_argument_group("model")
    TRAINER.add_options(arch, ["preset", "layers", "d_model", "d_ff", "heads", "dropout"])
    arch.add_argument("--max-len", type=integer(3),
                      help="the longest sentence the model reads, in positions: a sentence of at "
                           "most MAX_LEN - 2 tokens with BOS or EOS (default: the preset's, "
                           "1024); validation and test lines must fit")
    arch.add_argument("--attention-dropout", type=options.FRACTION,
                      help="dropout on the attention weights (default: the preset's, 0)")
    arch.add_argument("--relu-dropout", type=options.FRACTION,
                      help="dropout on the feed-forward hidden units (default: the preset's, 0)")
    arch.add_argument("--word-dropout", type=options.FRACTION,
                      help="word dropout: each source and target input token's embedding "
                           "dropped whole with this probability, its position kept (default: "
                           "the preset's, 0); starts with the other dropouts")
    arch.add_argument("--pre-ln", action="store_true", default=None,
                      help="LayerNorm before each sublayer, and once after each stack (default: "
                           "the paper's post-LN, a LayerNorm after each residual sum)")
    arch.add_argument("--subword-dropout", type=options.FRACTION, default=0.0, metavar="RATE",
                      help="BPE-dropout: each training pair segmented anew every time it is "
                           "batched, each merge skipped with this probability (default 0; keeps "
                           "the training text in memory, for small corpora; not repeatable)")
    TRAINER.add_options(arch, ["dropout_start", "dropout_start_margin", "label_smoothing"])
    add_training_options(p.add_argument_group("training"))
    add_evaluation_options(p.add_argument_group("evaluation"))
    TRAINER.add_options(p.add_argument_group("placement"), options.PLACEMENT)
    TRAINER.add_options(p.add_argument_group("run"), options.RUN)
    return p


def add_training_options(opt) -> None:
    opt.add_argument("--max-tokens", type=integer(3),
                     help="padded tokens per batch (default: per preset)")
    TRAINER.add_options(opt, ["max_steps", "max_epochs", "time_limit", "update_freq", "warmup",
                              "lr_factor", "schedule", "lr", "min_lr", "cooldown",
                              "weight_decay", "clip_norm", "seed", "log_every", "valid_every"])
    opt.add_argument("--valid-bleu-sentences", type=integer(0), default=200,
                     help="validation pairs decoded greedily for BLEU (default 200; 0: none)")
    TRAINER.add_options(opt, ["save_every", "keep_last", "best_metric", "keep_best", "patience"])
    opt.add_argument("--average-last", type=positive_int, default=5,
                     help="checkpoints averaged for the test (default 5, as the paper)")
    opt.add_argument("--average-best", type=positive_int, metavar="N",
                     help="average the N best checkpoints by --best-metric for the test instead "
                          "(needs --keep-best >= N)")


def add_evaluation_options(ev) -> None:
    ev.add_argument("--eval-only", action="store_true",
                    help="only translate and score the test set with --checkpoint")
    TRAINER.add_options(ev, ["checkpoint"])
    options.add_ensemble_option(ev)
    TRAINER.add_options(ev, options.SEARCH)
    ev.add_argument("--eval-batch-size", type=positive_int, default=64,
                    help="sentences per validation or decoding batch (default 64)")
    ev.add_argument("--test-max-sentences", type=positive_int,
                    help="score only the first N test sentences (default: all)")
    ev.add_argument("--bleu-tokenize", default="13a",
                    help="sacreBLEU tokenizer (default 13a, WMT's standard)")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = build_parser()
    args = options.parse(p, TRAINER, argv)
    check_args(p, args)
    return args


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject options of this command that do not fit together, before any data is read."""
    if bool(args.test_src) != bool(args.test_ref):
        p.error("--test-src and --test-ref go together: give both or neither")
    if args.eval_only and not args.checkpoint:
        p.error("--eval-only needs --checkpoint CKPT, the model to score")
    if args.checkpoint and not args.eval_only:
        p.error("--checkpoint is for --eval-only; to continue training use --out DIR --resume")
    if args.ensemble and not args.eval_only:
        p.error("--ensemble is for --eval-only (with --checkpoint): it decodes trained models "
                "together")
    if not args.eval_only and not (args.trainpref or args.prepare):
        p.error("give the training data: --trainpref PREFIX, or --prepare DIR for WMT14")
    if args.average_best:
        if not args.best_metric:
            p.error("--average-best ranks checkpoints by --best-metric: give that too")
        if args.average_best > args.keep_best:
            p.error(f"--average-best {args.average_best} needs --keep-best >= "
                    f"{args.average_best}: only the --keep-best best checkpoints are kept on disk")
    elif args.average_last > args.keep_last:
        p.error(f"--average-last {args.average_last} needs --keep-last >= {args.average_last}: "
                f"only the last --keep-last checkpoints are kept on disk")
    if not args.eval_only:
        if args.best_metric and not args.validpref:
            p.error(f"--best-metric {args.best_metric} needs the validation corpus: --validpref")
        if args.best_metric == "bleu" and not args.valid_bleu_sentences:
            p.error("--best-metric bleu needs --valid-bleu-sentences N (> 0)")
        if args.dropout_start == phases.AUTO and not args.validpref:
            p.error("--dropout-start auto watches the validation perplexity: give --validpref")


# ---- training ---------------------------------------------------------------------------------

def start(run: Run, args: argparse.Namespace):
    """The data and the model of the run, and the run started; returns what the end needs."""
    world = distributed.world()
    with world.root_first():         # rank 0 prepares and caches the data, the others read it
        vocab, corpora, test = wmt.prepare_data(args)
    cfg = runs.model_config(args.preset, vocab.size, args)
    if "valid" in corpora:
        wmt.check_valid_lengths(corpora["valid"], cfg, args.validpref)
    if test is not None:
        wmt.check_test_lengths(test, vocab, cfg, "the model")
    train_corpus, positions = corpora["train"], wmt.train_positions(args, cfg)
    plan = token_batches(train_corpus.src_lengths, train_corpus.tgt_lengths, args.max_tokens,
                         seed=args.seed, epoch=0, max_positions=positions)
    if not len(plan):
        raise UsageError(f"no training pair of {args.trainpref} fits in a batch of --max-tokens "
                         f"{args.max_tokens} (or in the model's {cfg.max_len} positions), of "
                         f"{len(train_corpus)} after cleaning: raise --max-tokens, or check the "
                         f"corpus (--no-clean keeps every pair)")
    valid_batches = metric = None
    if "valid" in corpora and world.is_root:          # rank 0 validates
        valid_batches = eval_arrays(corpora["valid"], args.eval_batch_size,
                                    max_positions=cfg.max_len - 1)
        if args.valid_bleu_sentences:
            metric = wmt.bleu_metric(vocab, read_parallel(args.validpref, args.source_lang,
                                                          args.target_lang), args)
    subwords = wmt.subword_dropout(args, vocab, train_corpus)
    run.start(cfg, epoch_updates=wmt.epoch_updates(args, plan), vocab_id=vocab.identifier,
              vocab_model=vocab.serialized_model(), valid_batches=valid_batches,
              valid_metric=metric, on_dropout_start=subwords.start if subwords else None,
              run_meta={"languages": [args.source_lang, args.target_lang],
                        "max_tokens": args.max_tokens, "train_pairs": len(train_corpus),
                        "clean": not args.no_clean})
    wmt.say(wmt.describe_run(args, corpora, vocab, cfg, test, plan, run.plan))
    batches = epoch_batches(train_corpus, args.max_tokens, seed=args.seed,
                            max_positions=positions, subword_dropout=subwords)
    return batches, cfg, vocab, test


def run_training(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    placing.reuse_freed_memory()
    world = distributed.world()
    with Run(options.train_options(args, TRAINER), model.KIND) as run:  # a resume: checked now
        if world.is_root:
            wmt.check_sizes(args, runs.model_config(args.preset, args.vocab_size, args))
        else:
            args.quiet = True
        batches, cfg, vocab, test = start(run, args)
        state = loop.train(run, batches)
    if state.interrupted:
        return runs.stopped(state, args.out)
    if not world.is_root:            # the final evaluation is rank 0's
        return 0
    if state.out_of_time:
        wmt.say(f"time limit of {phases.describe_duration(args.time_limit)} reached at step "
                f"{state.step}")
    if state.out_of_patience:
        wmt.say(f"stopped at step {state.step}: no better validation {args.best_metric} in "
                f"{args.patience} validations ({state.record.describe_best()})")
    elif args.max_epochs and state.step == run.plan.steps < args.max_steps:
        wmt.say(f"{args.max_epochs:g} epochs done at step {state.step}")
    score = None
    if test is not None:
        with exits.after_training(
                "the test set's evaluation", state.last_checkpoint, state.step,
                "--eval-batch-size or --beam", f"score it alone with python train_wmt.py "
                f"--eval-only --checkpoint {state.last_checkpoint} and the same test options"):
            params, stem, info = wmt.model_to_test(args, state)
            score = wmt.score_test(params, cfg, vocab, test, stem, args, args.out, info)
    wmt.say(wmt.final_summary(state, score, time.perf_counter() - started))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def run() -> int:
        chosen = placing.select_backend(args.backend, "auto")
        world = distributed.world()
        placing.place(args.threads, None, args.precision, kernels=args.kernels)  # the first line
        if args.preset in ("base", "big") and backend.name == "numpy" and not args.eval_only:
            print(f"warning: the {args.preset} preset on the CPU ({chosen}) will take days; "
                  f"train it on a CUDA GPU with --backend cupy (pip install -e '.[gpu]')",
                  file=sys.stderr)
        if args.eval_only:
            return wmt.score_checkpoint(args) if world.is_root else 0
        with runs.run_directory(args, f"wmt-{args.preset}"):
            return run_training(args)
    return reporting.report_errors(run, sizes="--max-tokens (or --max-len)")


if __name__ == "__main__":
    sys.exit(main())
