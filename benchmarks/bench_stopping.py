"""Both stopping rules of beam search side by side: BLEU, time and decoder work per length penalty.

    python benchmarks/bench_stopping.py CHECKPOINT SOURCE REFERENCE
        [--penalties gnmt:0 gnmt:0.6 power:1] [--beam 4] [--threads 1] [--batch-size 64]

For each length penalty (FORM:ALPHA) the sentences of SOURCE are translated with
``stopping="exact"`` and ``stopping="first-k"`` (minitfm.decoding.beam), the two runs one after the other;
printed for each: sacreBLEU against REFERENCE, wall and CPU seconds (CPU time: what a shared
machine's waiting does not inflate), the hypothesis rows the decoder ran (rows x steps, the work),
the mean output length, and how many sentences' outputs the two rules give differently. Meant for
the validation set: the default rule is chosen there, not on a test set.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", help="a trained translator (train_wmt.py)")
    p.add_argument("source", help="source sentences, one per line (.gz allowed)")
    p.add_argument("reference", help="reference translations")
    p.add_argument("--penalties", nargs="+", default=["gnmt:0", "gnmt:0.6", "power:1"],
                   help="length penalties, FORM:ALPHA")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from threadpoolctl import threadpool_limits

    from minitfm import bleu
    from minitfm.decoding import batched, decode, translation
    from minitfm.data.corpus import read_lines

    params, cfg, vocab = translation.load_translator(args.checkpoint)
    lines, refs = read_lines(args.source), read_lines(args.reference)
    ids = [s[:cfg.max_len - 1] for s in vocab.encode(lines)]
    rows = [0]
    step = decode.step

    def counted_step(params, cfg, kv, tokens, t):
        rows[0] += len(tokens)
        return step(params, cfg, kv, tokens, t)

    decode.step = counted_step
    print(f"{len(ids)} sentences, beam {args.beam}, {args.threads} thread(s), batches of "
          f"{args.batch_size}")
    print(f"{'penalty':>12} {'stopping':>8} {'BLEU':>6} {'wall s':>7} {'CPU s':>7} "
          f"{'rows x steps':>12} {'length':>6} {'differ':>6}")
    for penalty in args.penalties:
        form, alpha = penalty.split(":")
        outputs = {}
        for stopping in ("exact", "first-k"):
            rows[0] = 0
            start, start_cpu = time.perf_counter(), time.process_time()
            with threadpool_limits(args.threads):
                found = batched.translate_ids(params, cfg, ids, beam=args.beam, alpha=float(alpha),
                                           lenpen_form=form, stopping=stopping,
                                           batch_size=args.batch_size)
            wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            outputs[stopping] = [h[0][0] for h in found]
            score = bleu.corpus_bleu(vocab.decode(outputs[stopping]), refs).bleu
            length = sum(map(len, outputs[stopping])) / len(ids)
            differ = sum(a != b for a, b in zip(*outputs.values())) if len(outputs) == 2 else ""
            print(f"{penalty:>12} {stopping:>8} {score:6.2f} {wall:7.1f} {cpu:7.1f} "
                  f"{rows[0]:12d} {length:6.2f} {differ:>6}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
