"""Decoding speed against CTranslate2: one trained translator, exported, and the same sentences
through minitfm's beam search and through CTranslate2 float32 called as the export records it.

    python benchmarks/bench_export.py CHECKPOINT SOURCE [--ref REFERENCE] [--threads 1]
        [--beam 4] [--lenpen 0] [--lenpen-form gnmt|power] [--stopping auto|exact|first-k]
        [--rounds 3] [--sentences 1000] [--batch-size 64] [--batch-by-batch] [--profile N]
        [--products]

SOURCE (and REFERENCE, for BLEU) hold one sentence per line, plain or gzipped: e.g. Multi30k's
test_2016_flickr.en.gz and .de.gz. Every engine gets the same token ids (the checkpoint's
sentencepiece model encodes SOURCE once; tokenization is not timed), sorted by length, at most
--batch-size sentences at a time, at most the longest source + 50 output tokens: CTranslate2
decodes each batch to its end (max_batch_size), minitfm refills the places of ended sentences
(continuous batching, ``translate_ids``'s default; with --batch-by-batch also timed batch by
batch, as CTranslate2 does). CTranslate2 float32
runs the call that ``python -m minitfm.export`` writes into decoding.json for the same search
settings (a warning says where no call decodes exactly as minitfm does).

The engines take turns, round after round (minitfm, then CTranslate2, on each thread count), so
that a busy machine slows both alike; each round's ratio of the two times is printed, and the
median, with the median ratio of the processes' CPU times (which a shared machine's waiting
does not inflate). minitfm runs with the BLAS threads limited by threadpoolctl; CTranslate2 with
intra_threads (inter_threads 1). Printed for each engine: sentences per second (median round),
BLEU (sacreBLEU, detokenized, when --ref is given) and the share of sentences whose output is
minitfm's exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def parse_args(argv=None):
    from minitfm.cli import options
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", help="a trained translator (train_wmt.py), e.g. averaged.npz")
    p.add_argument("source", help="source sentences, one per line (.gz allowed)")
    p.add_argument("--ref", help="reference translations, for BLEU")
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    options.add_search_options(p)
    p.set_defaults(lenpen=0.0)
    p.add_argument("--rounds", type=int, default=3, help="timed turns of each engine")
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batch-by-batch", action="store_true",
                   help="also time minitfm decoding each batch to its end, without refilling")
    p.add_argument("--profile", type=int, metavar="N", default=0,
                   help="after the rounds, profile one more minitfm round and print the N "
                        "functions that took most of its time (their own time, cProfile)")
    p.add_argument("--products", action="store_true",
                   help="also time the decoder's matrix products, one thread, at batch-size x "
                        "beam rows: NumPy's BLAS and, where PyTorch is installed, torch.mm")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import ctranslate2
    from threadpoolctl import threadpool_limits

    from minitfm import bleu, checkpoint
    from minitfm.decoding import batched, beam, decode
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
    search = dict(beam=args.beam, alpha=args.lenpen, lenpen_form=args.lenpen_form,
                  stopping=args.stopping)

    def minitfm_engine(threads, continuous=True):
        def run(sentences):
            with threadpool_limits(threads):
                found = batched.translate_ids(params, cfg, sentences, max_len=limit,
                                           batch_size=args.batch_size, continuous=continuous,
                                           **search)
            return [h[0][0] for h in found]
        return run

    def ctranslate2_engine(directory, kwargs, threads):
        translator = ctranslate2.Translator(directory, device="cpu", compute_type="float32",
                                            inter_threads=1, intra_threads=threads)

        def run(sentences):
            results = translator.translate_batch([[tokens[i] for i in s] for s in sentences],
                                                 max_batch_size=args.batch_size, **kwargs)
            return [[token_ids[t] for t in r.hypotheses[0]] for r in results]
        return run

    with tempfile.TemporaryDirectory() as tmp:
        directory = os.path.join(tmp, "float32")
        with source.output_directory(directory) as out:
            settings = export_ct2.export(loaded, out, max_len=limit,
                                         warn=lambda m: print("warning:", m), **search)
        engines = {}
        for threads in args.threads:
            engines["minitfm", threads] = minitfm_engine(threads)
            if args.batch_by_batch:
                engines["minitfm batch by batch", threads] = minitfm_engine(threads, False)
            engines["ctranslate2 float32", threads] = ctranslate2_engine(
                directory, settings["kwargs"], threads)
        times = {key: [] for key in engines}
        cpu_times = {key: [] for key in engines}
        outputs = {}
        for engine in engines.values():
            engine(ids[:8])                                                  # warm-up
        for _ in range(args.rounds):
            for key, engine in engines.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                outputs[key] = engine(ids)
                times[key].append(time.perf_counter() - start)
                cpu_times[key].append(time.process_time() - start_cpu)
            print(json.dumps({f"{name} {threads}t": [round(t[-1], 2), round(c[-1], 2)]
                              for ((name, threads), t), c in zip(times.items(),
                                                                 cpu_times.values())}),
                  flush=True)

    if args.profile:
        profile(engines["minitfm", args.threads[0]], ids, args.profile)
    if args.products:
        products(cfg, args.batch_size * args.beam)
    print(f"\n{len(lines)} sentences, beam {args.beam}, length penalty {args.lenpen:g} "
          f"({args.lenpen_form}), stopping {beam.stopping_rule(args.stopping, args.lenpen)}, "
          f"at most {limit} output tokens, "
          f"batches of {args.batch_size}, {args.rounds} rounds")
    print(f"CTranslate2 float32: {export_ct2.call_example(settings)}")
    print(f"{'engine':22} {'threads':>7} {'sent/s':>8} {'time / ct2 fp32':>16} "
          f"{'per round':>22} {'CPU time / ct2':>15} {'BLEU':>6} {'same as minitfm':>16}")
    for (name, threads), seconds in times.items():
        ratios = [a / b for a, b in zip(seconds, times["ctranslate2 float32", threads])]
        cpu = [a / b for a, b in zip(cpu_times[name, threads],
                                     cpu_times["ctranslate2 float32", threads])]
        same = sum(a == b for a, b in zip(outputs[name, threads], outputs["minitfm", threads]))
        score = (bleu.corpus_bleu(vocab.decode(outputs[name, threads]), refs).bleu
                 if refs is not None else float("nan"))
        print(f"{name:22} {threads:7d} {len(ids) / statistics.median(seconds):8.1f} "
              f"{statistics.median(ratios):15.2f}x {' '.join(f'{r:.2f}' for r in ratios):>22} "
              f"{statistics.median(cpu):14.2f}x {score:6.2f} {100 * same / len(ids):15.2f}%")
    return 0


def products(cfg, rows: int, seconds: float = 0.5) -> None:
    """GFLOP/s of each (rows, n) @ (n, m) product of a decoder step, one thread: NumPy's BLAS
    (minitfm's) and PyTorch's (MKL on Intel builds), where it is installed."""
    import numpy as np
    from threadpoolctl import threadpool_limits
    try:
        import torch
    except ImportError:
        torch = None
    d, f, v = cfg.d_model, cfg.d_ff, cfg.tgt_vocab
    rng = np.random.default_rng(0)

    def rate(multiply, flops):
        multiply()
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            multiply()
            count += 1
        return flops * count / (time.perf_counter() - start) / 1e9

    print(f"\nmatrix products of a decoder step, {rows} rows, one thread, GFLOP/s:")
    for n, m, what in ((d, 3 * d, "self-attention Q, K, V"), (d, d, "attention outputs"),
                       (d, f, "feed-forward in"), (f, d, "feed-forward out"),
                       (d, v, "output projection")):
        x = rng.standard_normal((rows, n), dtype=np.float32)
        w = rng.standard_normal((n, m), dtype=np.float32)
        out = np.empty((rows, m), dtype=np.float32)
        flops = 2 * rows * n * m
        with threadpool_limits(1):
            numpy_rate = rate(lambda: np.matmul(x, w, out=out), flops)
        line = f"  {what:24} ({n:5d}, {m:5d})  NumPy {numpy_rate:6.1f}"
        if torch is not None:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            tx, tw, to = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(out)
            line += f"   torch.mm {rate(lambda: torch.mm(tx, tw, out=to), flops):6.1f}"
            torch.set_num_threads(threads)
        print(line)


def profile(engine, ids, count: int) -> None:
    """One more round of ``engine`` under cProfile: the ``count`` functions with the most time of
    their own (a matrix product is the time of the function that calls it)."""
    import cProfile
    import pstats
    profiler = cProfile.Profile()
    profiler.runcall(engine, ids)
    stats = pstats.Stats(profiler)
    total = sum(row[2] for row in stats.stats.values())
    print(f"\nminitfm under cProfile: {total:.2f} s; the functions with most time of their own")
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:count]
    for (path, line, name), (_, calls, own, _, _) in rows:
        where = (f" ({os.path.relpath(path, ROOT)}:{line})" if path.startswith(ROOT) else
                 "" if path == "~" else f" ({path}:{line})")
        print(f"  {own:6.2f} s {own / total:6.1%} {calls:8d} calls  {name}{where}")


if __name__ == "__main__":
    sys.exit(main())
