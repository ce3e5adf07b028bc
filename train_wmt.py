"""Train a Transformer translation model and score it with sacreBLEU: the paper's recipe end to end.

    # Multi30k (or any corpus) on a CPU, with the small preset
    python train_wmt.py --trainpref DATA/train --validpref DATA/val \\
        --testpref DATA/test_2016_flickr --source-lang en --target-lang de --preset small \\
        --time-limit 60 --out runs/multi30k

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

Choosing by validation: ``--best-metric bleu`` (or ``loss``) judges every validation, saves a
checkpoint at each, names the best ``checkpoint_best.npz``, keeps the ``--keep-best`` best beside
the ``--keep-last`` last, and with ``--patience N`` stops after N validations without
improvement (exit status 0; averaging and the test still run). ``--dropout-start`` and
``--cooldown`` take a fraction of the run, a number of updates (``1200steps``) or epochs
(``8epochs``), and ``--dropout-start auto`` starts dropout once the validation perplexity
improves by less than ``--dropout-start-margin``; counts of updates or epochs, ``--max-epochs``
and ``--patience`` end or shape a run the same way on any machine.

Defaults per preset (``PRESET_DEFAULTS``; any option given wins): ``small`` suits a CPU (8k
vocabulary, 3072-token batches, warmup 1000); ``base`` and ``big`` follow the paper (37k
vocabulary, about 25k tokens per update as 6 batches of 4096 tokens, warmup 4000, 100k / 300k
steps). On a large GPU, fewer and larger batches are faster: ``--max-tokens 12500 --update-freq 2``.

``--resume`` continues the run in ``--out`` from its latest checkpoint, with the same data position
and random state; ``--time-limit`` counts the training time of all sessions of a run together.
Every corpus named is checked before any work, and a resumed run's options and latest checkpoint
before anything is written. Ctrl-C, SIGTERM or SIGHUP saves a checkpoint and exits with 128 + the
signal's number; a user error (bad option values, missing, empty or misaligned files, another
run's checkpoint) prints one ``error:`` line and exits with 2; a full disk, or too little memory, 1.

Under ``mpiexec -n N`` each of the N workers takes ``--update-freq`` batches of every update (the
arithmetic of one worker with N times the ``--update-freq``); rank 0 prepares the data first (the
others then read its cache, so ``--data-dir`` must be on a file system all of them see), and
alone writes the run directory, shows progress and runs the final evaluation. A signal to any
worker stops all of them with a checkpoint; an error in one ends all of them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from minitfm import backend, checkpoint, cli, distributed, limits, options, train, translate
from minitfm.exits import UsageError
from minitfm.options import integer, number, positive_int
from minitfm.data import epoch_batches, eval_arrays, read_parallel, token_batches
from minitfm.models import translator as model
from minitfm.models.translator import Config
from minitfm.wmt import (bleu_metric, check_test_lengths, check_valid_lengths, describe_run,
                         dropout_start, epoch_updates, final_summary, lr_schedule, model_to_test,
                         prepare_data, read_test_set, resolve_corpora, run_steps, say, score_test,
                         subword_dropout)

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
# the options that define a run: --resume refuses to change them
RUN_OPTIONS = ("source_lang", "target_lang", "vocab_size", "no_clean", "preset", "layers",
               "d_model", "d_ff", "heads", "max_len", "dropout", "attention_dropout",
               "relu_dropout", "label_smoothing", "max_tokens", "seed", "schedule", "lr",
               "min_lr", "cooldown", "dropout_start", "dropout_start_margin", "subword_dropout",
               "best_metric")
FRACTION = number(0, 1, high_open=True)
POSITIVE = number(0, low_open=True)


# ---- command line -----------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=preset_table(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_options(p.add_argument_group("data"))
    add_model_options(p.add_argument_group("model (default: the preset's)"))
    add_training_options(p.add_argument_group("training"))
    add_evaluation_options(p.add_argument_group("evaluation"))
    args = p.parse_args(argv)
    check_args(p, args)
    for name, value in PRESET_DEFAULTS[args.preset].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    check_schedule(p, args)
    options.check_validation_options(p, args, args.valid_every)
    if args.dropout_start == "auto" and not args.valid_every:
        p.error("--dropout-start auto decides at validations: give --valid-every N (> 0)")
    return args


def add_data_options(data) -> None:
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
    data.add_argument("--vocab-size", type=limits.vocab_size_option(8),
                      help="joint BPE pieces (default: preset)")
    data.add_argument("--no-clean", action="store_true",
                      help="do not drop empty, overlong or badly proportioned training pairs")


def add_model_options(arch) -> None:
    arch.add_argument("--preset", choices=tuple(PRESET_DEFAULTS), default="small")
    arch.add_argument("--layers", type=positive_int, help="encoder and decoder layers")
    arch.add_argument("--d-model", type=positive_int, help="model width")
    arch.add_argument("--d-ff", type=positive_int, help="feed-forward width")
    arch.add_argument("--heads", type=positive_int, help="attention heads")
    arch.add_argument("--max-len", type=integer(3),
                      help="the longest sentence the model reads, in positions: a sentence of at "
                           "most MAX_LEN - 2 tokens with BOS or EOS (default: preset, 1024); "
                           "validation and test lines must fit")
    arch.add_argument("--dropout", type=FRACTION,
                      help="dropout on the embeddings and every sub-layer's output")
    arch.add_argument("--attention-dropout", type=FRACTION,
                      help="dropout on the attention weights (default: preset, 0)")
    arch.add_argument("--relu-dropout", type=FRACTION,
                      help="dropout on the feed-forward hidden units (default: preset, 0)")
    arch.add_argument("--subword-dropout", type=FRACTION, default=0.0, metavar="RATE",
                      help="BPE-dropout: each training pair segmented anew every time it is "
                           "batched, each merge skipped with this probability (default 0; keeps "
                           "the training text in memory, for small corpora; not repeatable)")
    arch.add_argument("--dropout-start", type=options.phase(auto=True), default=0.0, metavar="PHASE",
                      help="late dropout: none for this first part of the run, then the "
                           "dropouts above: a fraction (of --max-steps, or of --time-limit if "
                           "that comes first), a number of updates (1200steps) or epochs "
                           "(8epochs), or auto: from the first validation whose perplexity "
                           "improved by less than --dropout-start-margin on the previous one "
                           "(default 0: from the start)")
    arch.add_argument("--dropout-start-margin", type=FRACTION, default=0.02,
                      metavar="FRACTION",
                      help="with --dropout-start auto: the relative improvement of the "
                           "validation perplexity below which dropout starts (default 0.02)")
    arch.add_argument("--label-smoothing", type=FRACTION, help="label smoothing")


def add_training_options(opt) -> None:
    opt.add_argument("--max-tokens", type=integer(3), help="padded tokens per batch (default: "
                                                           "preset)")
    opt.add_argument("--update-freq", type=positive_int, help="batches summed into one update "
                                                              "(default: preset)")
    opt.add_argument("--max-steps", type=positive_int, help="training updates (default: preset)")
    options.add_max_epochs_option(opt, "an epoch: its batches over --update-freq; N epochs end "
                                       "with the update that reads the last batch of the N-th")
    opt.add_argument("--time-limit", type=POSITIVE, metavar="MINUTES",
                     help="stop, with a checkpoint, after this much training time")
    options.add_optimiser_options(opt, warmup="default: preset", lr_factor=(1.0, "default 1"))
    options.add_schedule_options(opt, choices=("paper", "linear", "cosine"),
                                 default="default: preset",
                                 lr_help="peak rate of --schedule linear or cosine (default: "
                                         "the paper's rate at the end of the warmup, times "
                                         "--lr-factor)",
                                 min_lr=(0.0, "default 0"), steps="--max-steps", cooldown=True)
    options.add_seed_option(opt, "initialisation, dropout and batch order")
    options.add_logging_options(opt, valid_every=(None, "default: preset; 0: at the end"),
                                log_every=True)
    opt.add_argument("--valid-bleu-sentences", type=integer(0), default=200,
                     help="validation pairs decoded greedily for BLEU (default 200; 0: none)")
    options.add_checkpoint_options(opt, save_every=(None, "default: preset; 0: at the end"),
                                   keep_last=True)
    options.add_validation_options(opt, ("bleu", "loss"))
    opt.add_argument("--average-last", type=positive_int, default=5,
                     help="checkpoints averaged for the test (default 5, as the paper)")
    opt.add_argument("--average-best", type=positive_int, metavar="N",
                     help="average the N best checkpoints by --best-metric for the test instead "
                          "(needs --keep-best >= N)")
    cli.add_placement_options(opt, "auto", None)
    cli.add_run_options(opt, "wmt-<preset>")


def add_evaluation_options(ev) -> None:
    ev.add_argument("--eval-only", action="store_true",
                    help="only translate and score the test set with --checkpoint")
    ev.add_argument("--checkpoint", help="checkpoint to score with --eval-only")
    options.add_search_options(ev)
    ev.add_argument("--eval-batch-size", type=positive_int, default=64,
                    help="sentences per validation or decoding batch (default 64)")
    ev.add_argument("--test-max-sentences", type=positive_int,
                    help="score only the first N test sentences (default: all)")
    ev.add_argument("--bleu-tokenize", default="13a",
                    help="sacreBLEU tokenizer (default 13a, WMT's standard)")


def preset_table() -> str:
    """The per-preset defaults, for --help."""
    lines = ["defaults per preset:"]
    for preset, values in PRESET_DEFAULTS.items():
        lines.append(f"  {preset:5}  " + ", ".join(f"--{name.replace('_', '-')} {value}"
                                                  for name, value in values.items()))
    return "\n".join(lines)


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject options that do not fit together, before any data is read."""
    if bool(args.test_src) != bool(args.test_ref):
        p.error("--test-src and --test-ref go together: give both or neither")
    if args.eval_only and not args.checkpoint:
        p.error("--eval-only needs --checkpoint CKPT, the model to score")
    if args.checkpoint and not args.eval_only:
        p.error("--checkpoint is for --eval-only; to continue training use --out DIR --resume")
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
        if args.dropout_start == "auto" and not args.validpref:
            p.error("--dropout-start auto watches the validation perplexity: give --validpref")


def check_schedule(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The learning-rate options fit together (after the preset's defaults are filled in)."""
    if args.schedule == "paper":
        if args.lr is not None:
            p.error("--lr is the peak of --schedule linear or cosine; scale the paper's "
                    "schedule with --lr-factor")
        return
    if args.warmup >= args.max_steps:
        p.error(f"--warmup {args.warmup} must be below --max-steps {args.max_steps}: the "
                f"{args.schedule} decay ends at --max-steps")
    if args.lr is not None and args.min_lr > args.lr:
        p.error(f"--min-lr {args.min_lr:g} is above --lr {args.lr:g}")


# ---- data -------------------------------------------------------------------------------------


def train_positions(args: argparse.Namespace, cfg: Config) -> int:
    """The longest sentence trained on, as batching's ``max_positions``: what fits a batch of
    ``--max-tokens`` (a row costs up to max_positions + 1 entries) and the model. The model
    checks the whole target array, BOS to EOS (max_positions + 1 entries), against max_len."""
    return min(cfg.max_len - 1, args.max_tokens - 1)


def check_sizes(args: argparse.Namespace) -> None:
    """The size options against the memory there is, before any data is read (minitfm.limits):
    training on token-count batches, then the test's beam search with the model state kept."""
    cfg = cli.model_config(args.preset, args.vocab_size, args)
    sizes = {"--vocab-size": (args.vocab_size, range(8, args.vocab_size + 1)),
             "--max-tokens": (args.max_tokens, range(3, args.max_tokens + 1)),
             **limits.model_sizes(cfg)}

    def config(values: dict) -> Config:
        vocab = values["--vocab-size"]
        return limits.with_model_sizes(cfg, values, src_vocab=vocab, tgt_vocab=vocab)

    limits.check_fits("training", sizes, lambda v: limits.training_estimate(
        config(v), rows=1, src_len=v["--max-tokens"], tgt_len=v["--max-tokens"],
        update_freq=args.update_freq, attention=False))
    del sizes["--max-tokens"]
    check_decoding(args, sizes, lambda v: limits.state_estimate(config(v), args.update_freq),
                   config)


def check_decoding(args: argparse.Namespace, sizes: dict, kept, config) -> None:
    """The test's beam search (``--beam`` x ``--eval-batch-size`` rows) fits, with ``kept(values)``
    (the model state) in memory too."""
    sizes = {**sizes, "--beam": (args.beam, range(1, args.beam + 1)),
             "--eval-batch-size": (args.eval_batch_size, range(1, args.eval_batch_size + 1))}
    limits.check_fits("beam search", sizes, lambda v: kept(v) + limits.decoding_estimate(
        config(v), rows=v["--beam"] * v["--eval-batch-size"], params=False))


# ---- decoding and BLEU ------------------------------------------------------------------------


# ---- training ---------------------------------------------------------------------------------


def run_training(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    cli.reuse_freed_memory()
    world = distributed.world()
    if world.is_root:                # the run directory (held: cli.run_in_directory) is rank 0's
        cli.check_resumable(args, RUN_OPTIONS, model.KIND)
        check_sizes(args)
    else:
        args.quiet = True
    with world.root_first():         # rank 0 prepares and caches the data, the others read it
        vocab, corpora, test = prepare_data(args)
    langs = (args.source_lang, args.target_lang)
    cfg = cli.model_config(args.preset, vocab.size, args)
    if "valid" in corpora:
        check_valid_lengths(corpora["valid"], cfg, args.validpref)
    if test is not None:
        check_test_lengths(test, vocab, cfg, "the model")
    train_corpus = corpora["train"]
    plan = token_batches(train_corpus.src_lengths, train_corpus.tgt_lengths, args.max_tokens,
                         seed=args.seed, epoch=0, max_positions=train_positions(args, cfg))
    if not len(plan):
        raise UsageError(f"no training pair of {args.trainpref} fits in a batch of --max-tokens "
                         f"{args.max_tokens} (or in the model's {cfg.max_len} positions), of "
                         f"{len(train_corpus)} after cleaning: raise --max-tokens, or check the "
                         f"corpus (--no-clean keeps every pair)")
    say(describe_run(args, corpora, vocab, cfg, test, plan))

    valid_batches = metric = None
    if "valid" in corpora and world.is_root:          # rank 0 validates
        valid_batches = eval_arrays(corpora["valid"], args.eval_batch_size,
                                    max_positions=cfg.max_len - 1)
        if args.valid_bleu_sentences:
            metric = bleu_metric(vocab, read_parallel(args.validpref, *langs), args)
    subwords = subword_dropout(args, vocab, train_corpus)
    steps, one_epoch = run_steps(args, plan), epoch_updates(args, plan)
    train_options = train.TrainOptions(
        steps=steps, out_dir=args.out, seed=args.seed, warmup=args.warmup,
        schedule=lr_schedule(args, cfg, steps, one_epoch),
        **dropout_start(args, steps, one_epoch), **options.validation_options(args),
        **options.precision_options(args),
        on_dropout_start=subwords.start if subwords is not None else None,
        clip_norm=args.clip_norm, update_freq=args.update_freq,
        log_every=args.log_every, valid_every=args.valid_every, save_every=args.save_every,
        keep_last=args.keep_last, resume=args.resume,
        time_limit=None if args.time_limit is None else args.time_limit * 60.0,
        vocab_id=vocab.identifier, vocab_model=vocab.serialized_model(),
        run_meta={"languages": list(langs), "max_tokens": args.max_tokens,
                  "train_pairs": len(train_corpus), "clean": not args.no_clean},
        run_info={"args": vars(args), "config": cfg.to_dict()}, progress=not args.quiet)
    batches = epoch_batches(train_corpus, args.max_tokens, seed=args.seed,
                            max_positions=train_positions(args, cfg), subword_dropout=subwords)
    state = train.train(cfg, batches, train_options, valid_batches=valid_batches,
                        valid_metric=metric)
    if state.interrupted:
        return cli.stopped(state, args.out)
    if not world.is_root:            # the final evaluation is rank 0's
        return 0
    if state.out_of_time:
        say(f"time limit of {args.time_limit:g} min reached at step {state.step}")
    if state.out_of_patience:
        say(f"stopped at step {state.step}: no better validation {args.best_metric} in "
            f"{args.patience} validations ({state.record.describe_best()})")
    elif args.max_epochs and state.step == steps < args.max_steps:
        say(f"{args.max_epochs:g} epochs done at step {state.step}")
    score = None
    if test is not None:
        params, stem, info = model_to_test(args, state)
        score = score_test(params, cfg, vocab, test, stem, args, args.out, info)
    say(final_summary(state, score, time.perf_counter() - started))
    return 0


# ---- evaluation only --------------------------------------------------------------------------

def run_eval_only(args: argparse.Namespace) -> int:
    resolve_corpora(args)
    test = read_test_set(args)
    if test is None:
        raise UsageError("--eval-only needs a test set: --testpref PREFIX, --test-src FILE "
                         "--test-ref FILE, or --prepare DIR")
    try:
        params, cfg, vocab = translate.load_translator(args.checkpoint)
    except translate.TranslateError as exc:
        raise UsageError(str(exc)) from exc
    check_decoding(args, {}, lambda v: limits.Estimate(), lambda v: cfg)
    check_test_lengths(test, vocab, cfg, f"the model of {args.checkpoint}",
                       fix="Score a model trained with a larger --max-len, or a test set without "
                           "those lines")
    step = checkpoint.load(args.checkpoint, with_optimizer=False).step
    out_dir = args.out or os.path.dirname(os.path.abspath(args.checkpoint))
    say(f"scoring {args.checkpoint} (step {step}) on {len(test)} test pairs; "
        f"backend {backend.describe()}")
    score_test(params, cfg, vocab, test, Path(args.checkpoint).stem, args, out_dir,
               {"checkpoint": args.checkpoint, "step": step})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    def run() -> int:
        args = parse_args(argv)
        chosen = cli.select_backend(args.backend, "auto")
        world = distributed.world()
        # GPU or threads, precision, kernels: the first line
        cli.place(args.threads, None, args.precision, kernels=args.kernels)
        if args.preset in ("base", "big") and backend.name == "numpy" and not args.eval_only:
            print(f"warning: the {args.preset} preset on the CPU ({chosen}) will take days; "
                  f"train it on a CUDA GPU with --backend cupy (pip install -e '.[gpu]')",
                  file=sys.stderr)
        if args.eval_only:
            return run_eval_only(args) if world.is_root else 0
        return cli.run_in_directory(args, f"wmt-{args.preset}", lambda: run_training(args))
    return cli.report_errors(run, sizes="--max-tokens (or --max-len)")


if __name__ == "__main__":
    sys.exit(main())
