"""Decoding speed against CTranslate2: one trained translator, exported, and the same sentences
through minitfm's beam search and through CTranslate2 in float32 and int8, on 1 and 2 threads.

    python benchmarks/bench_export.py CHECKPOINT SOURCE [--ref REFERENCE] [--threads 1 2]
        [--beam 4] [--lenpen 0] [--sentences 1000] [--batch-size 64] [--stop-early]

SOURCE (and REFERENCE, for BLEU) hold one sentence per line, plain or gzipped: e.g. Multi30k's
test_2016_flickr.en.gz and .de.gz. Every engine gets the same token ids (the checkpoint's
sentencepiece model encodes SOURCE once; tokenization is not timed) in batches of --batch-size
sentences sorted by length, beam 4, length penalty 0 (where minitfm and CTranslate2 rank alike),
and at most the longest source + 50 output tokens. Printed for each run: sentences per second,
the time relative to CTranslate2 float32 on one thread, BLEU (sacreBLEU, detokenized, when
--ref is given) and the share of sentences whose output is minitfm's exactly.

minitfm runs with the BLAS threads limited by threadpoolctl; CTranslate2 with intra_threads
(inter_threads 1). --stop-early also times minitfm's beam search with ``stop_early=True`` (a
sentence leaves the batch once no live hypothesis can beat its best finished one, as
CTranslate2 does at length penalty 0; the same outputs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", help="a trained translator (train_wmt.py), e.g. averaged.npz")
    p.add_argument("source", help="source sentences, one per line (.gz allowed)")
    p.add_argument("--ref", help="reference translations, for BLEU")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--lenpen", type=float, default=0.0)
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--stop-early", action="store_true",
                   help="also time minitfm's beam search with stop_early=True")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import ctranslate2
    from threadpoolctl import threadpool_limits

    from minitfm import bleu, checkpoint, decode
    from minitfm.beam import translate_ids
    from minitfm.data.corpus import read_lines
    from minitfm.data.vocab import Vocab
    from minitfm.export import ctranslate2 as export_ct2
    from minitfm.export import source

    loaded = source.read_checkpoint(args.checkpoint)
    cfg, vocab = loaded.config, Vocab.from_bytes(loaded.vocab_model)
    params = checkpoint.params_to_device(loaded.params)
    lines = read_lines(args.source)[:args.sentences]
    refs = read_lines(args.ref)[:len(lines)] if args.ref else None
    ids = [s[:cfg.max_len - 1] for s in vocab.encode(lines)]
    limit = min(max(len(s) + 1 for s in ids) + decode.EXTRA_LENGTH, cfg.max_len)
    tokens, _ = export_ct2.vocabulary(loaded, cfg.src_vocab)
    token_ids = {t: i for i, t in enumerate(tokens)}
    pieces = [[tokens[i] for i in s] for s in ids]

    rows, reference_output = [], None

    def record(name, threads, outputs, seconds):
        nonlocal reference_output
        if reference_output is None:
            reference_output = outputs
        row = {"engine": name, "threads": threads, "seconds": round(seconds, 2),
               "sentences_per_s": round(len(outputs) / seconds, 1),
               "same_as_minitfm": round(sum(a == b for a, b in zip(outputs, reference_output))
                                        / len(outputs), 4)}
        if refs is not None:
            row["bleu"] = round(bleu.corpus_bleu(vocab.decode(outputs), refs).bleu, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)

    def minitfm_run(threads, **options):
        with threadpool_limits(threads):
            translate_ids(params, cfg, ids[:8], beam=args.beam, alpha=args.lenpen,
                                 max_len=limit, batch_size=args.batch_size, **options)  # warm-up
            start = time.perf_counter()
            found = translate_ids(params, cfg, ids, beam=args.beam, alpha=args.lenpen,
                                         max_len=limit, batch_size=args.batch_size, **options)
            return [h[0][0] for h in found], time.perf_counter() - start

    for threads in args.threads:
        record("minitfm", threads, *minitfm_run(threads))
        if args.stop_early:
            record("minitfm stop_early", threads, *minitfm_run(threads, stop_early=True))

    with tempfile.TemporaryDirectory() as tmp:
        for quantization in ("float32", "int8"):
            directory = os.path.join(tmp, quantization)
            with source.output_directory(directory) as out:
                export_ct2.export(loaded, out, quantization=quantization, alpha=0.0,
                                  max_len=limit, warn=lambda message: None)
            kwargs = export_ct2.translate_kwargs(args.beam, export_ct2.ctranslate2_alpha(
                args.lenpen), limit, cfg.max_len)
            for threads in args.threads:
                engine = ctranslate2.Translator(directory, device="cpu", compute_type=quantization,
                                                inter_threads=1, intra_threads=threads)
                engine.translate_batch(pieces[:8], **kwargs)                          # warm-up
                start = time.perf_counter()
                results = engine.translate_batch(pieces, max_batch_size=args.batch_size,
                                                 **kwargs)
                seconds = time.perf_counter() - start
                record(f"ctranslate2 {quantization}", threads,
                       [[token_ids[t] for t in r.hypotheses[0]] for r in results], seconds)

    base = next(r for r in rows if r["engine"] == "ctranslate2 float32" and r["threads"] == 1)
    print(f"\n{len(lines)} sentences, beam {args.beam}, length penalty {args.lenpen:g}, at most "
          f"{limit} output tokens, batches of {args.batch_size}")
    print(f"{'engine':22} {'threads':>7} {'sent/s':>8} {'time / ct2 fp32 1t':>19} "
          f"{'BLEU':>6} {'same as minitfm':>16}")
    for r in rows:
        print(f"{r['engine']:22} {r['threads']:7d} {r['sentences_per_s']:8.1f} "
              f"{r['seconds'] / base['seconds']:18.2f}x {r.get('bleu', float('nan')):6.2f} "
              f"{100 * r['same_as_minitfm']:15.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
