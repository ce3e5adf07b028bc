"""The translation recipe of ``train_wmt.py``, beside its command line: the corpora and the
vocabulary, the sizes checked against the memory, subword dropout, validation BLEU, scoring the
test set and the lines the run prints. Each function takes the parsed options
(``argparse.Namespace``) of ``train_wmt.py``; the front end parses and calls, and calls nothing
here that calls back into it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from minitfm import averaging, backend, checkpoint, files
from minitfm.decoding import beam, translation
from minitfm.workers import distributed
from minitfm.cli import limits, translate
from minitfm.bleu import BleuScore, corpus_bleu
from minitfm.data import (BatchPlan, CleanOptions, DataError, EncodedCorpus, ParallelText,
                          SubwordDropout, Vocab, cached_joint_vocab, clean_parallel,
                          encode_corpus, prepare_wmt14, read_parallel, read_parallel_files,
                          require_pairs)
from minitfm.cli.exits import UsageError
from minitfm.models import translator as model
from minitfm.models.translator import Config
from minitfm.training import phases, validation
from minitfm.training.plan import Plan
from minitfm.training.rundir import WriteFailed
from minitfm.training.state import TrainState

VOCAB_SEED = 0          # the vocabulary does not depend on --seed, so runs can share it


def epoch_updates(args: argparse.Namespace, plan: BatchPlan) -> float:
    """The updates of one pass over the training data: the batches of an epoch (the same
    number every epoch) over the batches of an update, of all workers."""
    return len(plan) / (args.update_freq * distributed.world().size)


def train_positions(args: argparse.Namespace, cfg: Config) -> int:
    """The longest sentence trained on, as batching's ``max_positions``: what fits a batch of
    ``--max-tokens`` (a row costs up to max_positions + 1 entries) and the model. The model
    checks the whole target array, BOS to EOS (max_positions + 1 entries), against max_len."""
    return min(cfg.max_len - 1, args.max_tokens - 1)


def check_sizes(args: argparse.Namespace, cfg: Config) -> None:
    """The size options against the memory there is, before any data is read (minitfm.cli.limits):
    training on token-count batches, then the test's beam search with the model state kept;
    ``cfg``: the model of the options, with a vocabulary of ``--vocab-size``."""
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


def check_decoding(args: argparse.Namespace, sizes: dict, kept, config, decoding=None) -> None:
    """The test's beam search (``--beam`` x ``--eval-batch-size`` rows) fits, with ``kept(values)``
    (the model state) in memory too; ``decoding(values, rows)``: its memory, where not one
    model's of ``config(values)`` (an ensemble's)."""
    sizes = {**sizes, "--beam": (args.beam, range(1, args.beam + 1)),
             "--eval-batch-size": (args.eval_batch_size, range(1, args.eval_batch_size + 1))}
    decoding = decoding or (lambda v, rows: limits.decoding_estimate(config(v), rows=rows,
                                                                     params=False))
    limits.check_fits("beam search", sizes, lambda v: kept(v) + decoding(
        v, v["--beam"] * v["--eval-batch-size"]))


def say(text: str) -> None:
    """Print above any progress bar (as one of several workers: rank 0 alone)."""
    if distributed.world().is_root:
        tqdm.write(text)


@contextlib.contextmanager
def writing(path: str, what: str, advice: str) -> Iterator[TextIO]:
    """``path`` (``what`` it holds, in words), opened to be written whole (``files.replacing``)
    before the work that fills it: a folder that cannot be written is found before that work
    is done. A failure is a run-time failure (``WriteFailed``: a full disk, a read-only mount,
    an I/O error), or bad input where the path cannot be used as named (a file on the way, no
    rights: ``UsageError``); its message says which file and ``advice``."""
    opened = False
    try:
        with files.replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            opened = True
            yield f
    except OSError as exc:
        if opened and not isinstance(exc, files.WriteError):
            raise                       # the work's own error, not this file's
        text = f"cannot write {what} {path}: {exc.strerror or exc}; {advice}"
        raise (UsageError if files.bad_path(exc) else WriteFailed)(text) from exc


def resolve_corpora(args: argparse.Namespace) -> None:
    """With ``--prepare DIR``, fill in the prefixes DIR/train, DIR/valid and DIR/test."""
    if not args.prepare:
        return
    say(f"preparing WMT14 {args.source_lang}-{args.target_lang} in {args.prepare}")
    prepare_wmt14(args.prepare, src_lang=args.source_lang, tgt_lang=args.target_lang,
                  progress=not args.quiet)
    args.trainpref = args.trainpref or os.path.join(args.prepare, "train")
    args.validpref = args.validpref or os.path.join(args.prepare, "valid")
    if not (args.testpref or args.test_src):
        args.testpref = os.path.join(args.prepare, "test")


def read_test_set(args: argparse.Namespace) -> ParallelText | None:
    """The raw test pairs: ``--test-src``/``--test-ref`` (any format), else ``--testpref``."""
    if args.test_src:
        text = read_parallel_files(args.test_src, args.test_ref)
    elif args.testpref:
        text = read_parallel(args.testpref, args.source_lang, args.target_lang)
    else:
        return None
    if not len(text):
        raise DataError(f"no sentence pairs in {text.src_path} / {text.tgt_path}: nothing to "
                        f"score; check the test set's files")
    if args.test_max_sentences:
        text.src, text.tgt = text.src[:args.test_max_sentences], text.tgt[:args.test_max_sentences]
    return text


# ---- lines longer than the model reads ---------------------------------------------------------
# Validation and test sets are scored whole or not at all: a line the model cannot read whole
# would be cut (the loss of a cut pair, the translation of a cut source), and the score would no
# longer be that of the set named. So such lines are refused before training, with the fix. BLEU
# always compares against the references as written: they are never cut.

def _longest(lengths) -> tuple[int, int]:
    """``(index, length)`` of the longest entry of a 1-D array of lengths."""
    index = int(lengths.argmax())
    return index, int(lengths[index])


def check_valid_lengths(corpus: EncodedCorpus, cfg: Config, prefix: str) -> None:
    """Refuse validation pairs longer than the model reads: ``max_len - 2`` tokens a side (with
    EOS, or BOS, in the ``max_len - 1`` positions the training batches use)."""
    most = cfg.max_len - 2
    lengths = corpus.src_lengths.clip(min=corpus.tgt_lengths)           # (n,) the longer side
    over = int((lengths > most).sum())
    if over:
        index, longest = _longest(lengths)
        raise DataError(
            f"{over} of {len(corpus)} validation pairs of {prefix} are longer than the model "
            f"reads ({most} tokens a side with --max-len {cfg.max_len}): the longest, pair "
            f"{index + 1}, has {longest} tokens; their loss and BLEU would be of sentences cut "
            f"short. Train with --max-len {longest + 2} or more, or remove those pairs from the "
            f"validation set")


def check_test_lengths(test: ParallelText, vocab: Vocab, cfg: Config, model_name: str,
                       fix: str | None = None) -> None:
    """Refuse test sources longer than the model reads (``max_len - 1`` tokens with EOS, as
    translation encodes them): their translations would be of sentences cut short."""
    most = cfg.max_len - 1
    lengths = [len(ids) for ids in vocab.encode(test.src)]
    over = sum(n > most for n in lengths)
    if over:
        longest = max(lengths)
        line = lengths.index(longest) + 1
        fix = fix or (f"Train with --max-len {longest + 1} or more, or score on a test set "
                      f"without those lines")
        raise DataError(
            f"{over} of {len(lengths)} test sources of {test.src_path} are longer than "
            f"{model_name} reads ({most} tokens with --max-len {cfg.max_len}): the longest, line "
            f"{line}, has {longest} tokens; they would be translated cut short. {fix}")


def bleu_metric(vocab: Vocab, valid: ParallelText, args: argparse.Namespace):
    """The ``valid_metric`` callback: greedy BLEU on the first validation pairs."""
    sources = valid.src[:args.valid_bleu_sentences]
    references = valid.tgt[:args.valid_bleu_sentences]

    def valid_bleu(params: dict, cfg: Config) -> dict:
        hypotheses = translation.translate_texts(params, cfg, vocab, sources, beam=1, alpha=0.0,
                                                 batch_size=args.eval_batch_size,
                                                 warn=lambda message: None)
        return {"valid_bleu": corpus_bleu(hypotheses, references,
                                          tokenize=args.bleu_tokenize).bleu}
    return valid_bleu


def score_test(params: dict, cfg: Config, vocab: Vocab, test: ParallelText, stem: str,
               args: argparse.Namespace, out_dir: str, info: dict) -> BleuScore:
    """Translate the test set with beam search, score it, write hypotheses and scores."""
    hyp_path = os.path.join(out_dir, f"{stem}.test.hyp.{args.target_lang}")
    score_path = os.path.join(out_dir, f"{stem}.test.bleu.json")
    advice = ("nothing was saved: pass an --out where files can be written (free space, or a "
              "writable folder), and score again")
    with writing(hyp_path, "hypotheses", advice) as hyp_file, \
            writing(score_path, "scores", advice) as score_file:
        started = time.perf_counter()
        hypotheses = translation.translate_texts(params, cfg, vocab, test.src, beam=args.beam,
                                                 alpha=args.lenpen,
                                                 batch_size=args.eval_batch_size,
                                                 progress=not args.quiet,
                                                 lenpen_form=args.lenpen_form,
                                                 stopping=args.stopping)
        seconds = time.perf_counter() - started
        score = corpus_bleu(hypotheses, test.tgt, tokenize=args.bleu_tokenize)
        record = {**score.to_dict(), **info, "test_src": str(test.src_path),
                  "test_ref": str(test.tgt_path), "hypotheses": hyp_path, "beam": args.beam,
                  "lenpen": args.lenpen, "lenpen_form": args.lenpen_form,
                  "stopping": beam.stopping_rule(args.stopping, args.lenpen),
                  "decode_seconds": round(seconds, 1)}
        hyp_file.write("".join(line + "\n" for line in hypotheses))
        score_file.write(json.dumps(record, indent=1) + "\n")
    say(f"test: {score}\n  {len(hypotheses)} sentences decoded in {seconds:.1f} s; "
        f"hypotheses in {hyp_path}")
    return score


def model_to_test(args: argparse.Namespace, state: TrainState) -> tuple[dict, str, dict]:
    """``(params, stem, info)`` of the model to test: the average of the last ``--average-last``
    checkpoints, or of the ``--average-best`` best by validation, saved as ``averaged.npz``; when
    there is only one to average, the final parameters (with ``--average-best``, the best)."""
    if args.average_best:
        best = averaging.best_checkpoints([args.out], args.average_best)
        say(f"the {len(best)} best by {state.record.metric}: " + ", ".join(
            f"step {c.step} ({validation.recorded_metric(c)[1]:.4g})" for c in best))
        if len(best) == 1:
            ckpt = checkpoint.load(best[0].path, with_optimizer=False)
            return (checkpoint.params_to_device(ckpt.params), Path(ckpt.path).stem,
                    {"checkpoint": ckpt.path, "step": ckpt.step})
        paths, chosen = [c.path for c in sorted(best, key=lambda c: c.step)], \
            f"--best {args.average_best}"
    else:
        paths = [path for _, path in checkpoint.list_checkpoints(args.out)][-args.average_last:]
        if args.average_last == 1 or len(paths) <= 1:
            stem = Path(state.last_checkpoint or "final").stem
            return state.params, stem, {"checkpoint": state.last_checkpoint, "step": state.step}
        chosen = f"--last {args.average_last}"
    path = os.path.join(args.out, "averaged.npz")
    try:
        params, last = averaging.save_average(paths, path)
    except files.ReadError:
        raise                           # a checkpoint the disk did not give back: said as such
    except OSError as exc:
        raise (UsageError if files.bad_path(exc) else WriteFailed)(
            f"cannot write the averaged model {path}: {exc.strerror or exc}; the checkpoints are "
            f"intact: free space and average them with python -m minitfm.average --inputs "
            f"{args.out} {chosen} --output {path}") from exc
    names = [os.path.basename(p) for p in paths]
    say(f"averaged {len(paths)} checkpoints ({', '.join(names)}) into {path}")
    return (checkpoint.params_to_device(params), "averaged",
            {"checkpoint": path, "step": last.step, "averaged_from": names})


def describe_run(args: argparse.Namespace, corpora: dict, vocab: Vocab, cfg: Config,
                 test: ParallelText | None, plan: BatchPlan, run_plan: Plan) -> str:
    """The summary printed before training; ``plan`` is the first epoch's batches, ``run_plan``
    the run's updates and schedule."""
    train_corpus, manifest = corpora["train"], corpora["train"].manifest
    world = distributed.world()
    per_update = (int(train_corpus.tgt_lengths.sum()) + len(train_corpus)) / len(plan) \
        * args.update_freq * world.size                                 # targets, EOS included
    kept = "not cleaned"
    if manifest.get("clean"):
        dropped = ", ".join(f"{reason} {n}" for reason, n in manifest["clean"]["dropped"].items()
                            if n)
        kept = (f"{manifest.get('pairs')} of {manifest.get('read')} kept after cleaning"
                + (f"; dropped: {dropped}" if dropped else ""))
    params = sum(math.prod(shape) for shape in model.parameter_shapes(cfg).values())
    lines = [f"train  {args.trainpref}: {len(train_corpus)} pairs ({kept}), "
             f"{len(train_corpus.src_tokens)} + {len(train_corpus.tgt_tokens)} tokens"]
    if "valid" in corpora:
        lines.append(f"valid  {args.validpref}: {len(corpora['valid'])} pairs")
    lines.append(f"test   {test.src_path} / {test.tgt_path}: {len(test)} pairs"
                 if test is not None else "test   none (no --testpref / --test-src)")
    lines += [
        f"vocab  {vocab.size} joint {vocab.kind} pieces ({vocab.identifier})",
        f"model  {args.preset}: {cfg.n_layers} layers, d_model {cfg.d_model}, d_ff {cfg.d_ff}, "
        f"{cfg.n_heads} heads, {'pre' if cfg.pre_ln else 'post'}-LN, dropout {cfg.dropout}"
        + (f" (attention {cfg.attention_dropout}, ReLU {cfg.relu_dropout})"
           if cfg.attention_dropout or cfg.relu_dropout else "")
        + (f", word dropout {cfg.word_dropout}" if cfg.word_dropout else "")
        + (f", BPE-dropout {args.subword_dropout}" if args.subword_dropout else "")
        + (f" after the first {phases.describe(args.dropout_start)}"
           if args.dropout_start and args.dropout_start != phases.AUTO else "")
        + (f" once the validation perplexity improves by less than "
           f"{args.dropout_start_margin:.0%}" if args.dropout_start == phases.AUTO else "")
        + f", label smoothing {cfg.label_smoothing}; "
        f"{params:,} parameters; backend {backend.describe()}",
        f"batch  {plan.summary()} per epoch; <= {args.max_tokens} tokens x {args.update_freq} "
        + (f"x {world.size} workers " if world.distributed else "")
        + f"= ~{per_update:.0f} target tokens per update",
        f"train  {run_plan.steps} steps"
        + (f" ({args.max_epochs:g} epochs of {epoch_updates(args, plan):.4g} updates)"
           if args.max_epochs else "")
        + (f" or {phases.describe_duration(args.time_limit)}" if args.time_limit else "")
        + f", warmup {args.warmup}, {run_plan.schedule_words}; run {args.out}"]
    if world.distributed:
        lines.append(f"workers  {world.describe()}")
    return "\n".join(lines)


def prepare_data(args: argparse.Namespace) -> tuple[Vocab, dict, ParallelText | None]:
    """The vocabulary, the encoded corpora (train, and valid if given) and the raw test pairs,
    made once and cached in the data directory (default OUT/data)."""
    resolve_corpora(args)
    langs = (args.source_lang, args.target_lang)
    for prefix in (args.trainpref, args.validpref):
        if prefix:
            require_pairs(prefix, *langs)
    test = read_test_set(args)
    data_dir = Path(args.data_dir or os.path.join(args.out, "data"))
    vocab = cached_joint_vocab(args.trainpref, *langs, args.vocab_size, data_dir,
                               seed=VOCAB_SEED, announce=say)
    cache = data_dir / f"encoded-{vocab.identifier}"
    corpora = {"train": encode_corpus(args.trainpref, *langs, vocab, cache / "train",
                                      clean=None if args.no_clean else CleanOptions(),
                                      progress=not args.quiet)}
    if args.validpref:
        corpora["valid"] = encode_corpus(args.validpref, *langs, vocab, cache / "valid",
                                         progress=not args.quiet)
    return vocab, corpora, test


def subword_dropout(args: argparse.Namespace, vocab: Vocab,
                    train_corpus: EncodedCorpus) -> SubwordDropout | None:
    """``--subword-dropout``'s sampler, over the training text cleaned as the encoded corpus was."""
    if not args.subword_dropout:
        return None
    text = read_parallel(args.trainpref, args.source_lang, args.target_lang)
    src, tgt = text.src, text.tgt
    if not args.no_clean:
        src, tgt, _ = clean_parallel(src, tgt, CleanOptions())
    sampler = SubwordDropout(vocab, args.subword_dropout, src, tgt)
    sampler.check_matches(train_corpus)
    return sampler


def final_summary(state: TrainState, score: BleuScore | None, seconds: float) -> str:
    parts = [f"done: step {state.step}, {state.elapsed / 60:.1f} min of training, "
             f"{seconds / 60:.1f} min in all"]
    if "valid_ppl" in state.valid:
        parts.append(f"valid ppl {state.valid['valid_ppl']:.2f}")
    if "valid_bleu" in state.valid:
        parts.append(f"valid BLEU (greedy) {state.valid['valid_bleu']:.2f}")
    if state.record.dropout_from is not None:
        parts.append(f"dropout from step {state.record.dropout_from} (auto)")
    if state.record.best is not None:
        parts.append(state.record.describe_best())
    if score is not None:
        parts.append(f"test BLEU {score.bleu:.2f} ({score.signature})")
    return "; ".join(parts)


# ---- scoring a checkpoint ---------------------------------------------------------------------

def score_checkpoint(args: argparse.Namespace) -> int:
    """``--eval-only``: translate and score the test set with ``--checkpoint``."""
    resolve_corpora(args)
    test = read_test_set(args)
    if test is None:
        raise UsageError("--eval-only needs a test set: --testpref PREFIX, --test-src FILE "
                         "--test-ref FILE, or --prepare DIR")
    paths = [args.checkpoint, *args.ensemble]
    try:
        params, cfg, vocab = translation.load_translators(paths)
    except translation.TranslateError as exc:
        raise UsageError(str(exc)) from exc
    check_decoding(args, {}, lambda v: limits.Estimate(), lambda v: cfg, lambda v, rows:
                   translate.decoding_estimate(params, cfg, rows))
    model_words = f"the model of {args.checkpoint}" if len(paths) == 1 else \
        f"the ensemble of {', '.join(paths)}"
    check_test_lengths(test, vocab, cfg, model_words,
                       fix="Score a model trained with a larger --max-len, or a test set "
                           "without those lines")
    steps = [checkpoint.load(path, with_optimizer=False).step for path in paths]
    out_dir = args.out or os.path.dirname(os.path.abspath(args.checkpoint))
    scored = " + ".join(f"{path} (step {step})" for path, step in zip(paths, steps))
    say(f"scoring {scored} on {len(test)} test pairs; backend {backend.describe()}")
    info = {"checkpoint": args.checkpoint, "step": steps[0]}
    if args.ensemble:
        info["ensemble"] = [{"checkpoint": path, "step": step}
                            for path, step in zip(paths, steps)]
    score_test(params, cfg, vocab, test, "+".join(Path(path).stem for path in paths), args,
               out_dir, info)
    return 0
