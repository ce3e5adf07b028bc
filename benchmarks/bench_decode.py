"""Decoding speed: the incremental cache against recomputation, and beam-search throughput.

Two measurements, printed as one JSON object and as a table:

1. cached vs recomputed greedy decoding of exactly ``--tokens`` output tokens (EOS is masked so
   that every sentence runs the full length): the cached decoder (:func:`minitfm.decoding.decode.step`)
   against re-running the whole decoder over the prefix at every step
   (``translator.decoder_forward``). Both encode the source once and must produce the same tokens.
2. beam search throughput: :func:`minitfm.decoding.batched.translate_ids` with the paper's settings (beam 4,
   alpha 0.6, maximum length source + 50) over ``--sentences`` sentences.

The model is the "small" preset with random weights unless ``--checkpoint`` gives a trained one.
Random weights rarely choose EOS, so their outputs run to the length limit (source + 50 tokens):
the worst case, several times longer than real translations. The source sentences are the first
``--sentences`` lines of SOURCE (plain or gzipped text), encoded with the checkpoint's vocabulary
or, without one, with a sentencepiece model trained on SOURCE itself; with no SOURCE, random ids
with Multi30k-like lengths (about 13 tokens).

    python benchmarks/bench_decode.py [SOURCE] [--sentences 1000] [--tokens 50] [--threads 1]

On a CPU shared with other work, ``--threads 1`` is much faster than letting the BLAS library
spread every small matrix product over cores that are busy.

Results on a 2-core x86 CPU (float32, one BLAS thread, small preset with random weights):

    cached vs recomputed greedy, 32 sentences x 50 tokens     0.65 s vs 4.29 s   (6.6x)
    beam 4, 1,000 sentences, to the source + 50 limit         57.8 s  (64 tokens per sentence)
    the same, Multi30k test_2016_flickr.en as SOURCE           59.1 s  (64 tokens per sentence)
    the same with --max-len 20                                 16.4 s  (20 tokens per sentence)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", nargs="?", help="source sentences, one per line (.gz allowed)")
    parser.add_argument("--checkpoint", help="a trained checkpoint (default: random small preset)")
    parser.add_argument("--sentences", type=int, default=1000, help="sentences to beam-decode")
    parser.add_argument("--tokens", type=int, default=50, help="output tokens of the greedy runs")
    parser.add_argument("--greedy-sentences", type=int, default=32,
                        help="batch of the cached-vs-recomputed runs")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--batch-size", type=int, default=128, help="sentences per beam batch")
    parser.add_argument("--max-len", type=int, default=None,
                        help="output length limit (default: source length + 50)")
    parser.add_argument("--backend", default="numpy", choices=["numpy", "cupy", "auto"])
    parser.add_argument("--threads", type=int, default=None,
                        help="BLAS threads (set before numpy is loaded)")
    parser.add_argument("--skip", choices=["cache", "beam"], action="append", default=[],
                        help="skip a measurement")
    return parser.parse_args(argv)


def load_model(args):
    """``(params, cfg, vocab or None)``: the checkpoint's, or the small preset at random."""
    from minitfm import backend
    from minitfm.models import translator
    if args.checkpoint:
        from minitfm import checkpoint
        from minitfm.data.vocab import Vocab
        ckpt = checkpoint.load(args.checkpoint, with_optimizer=False)
        cfg = translator.Config.from_dict(ckpt.config)
        vocab = Vocab.from_bytes(ckpt.vocab_model) if ckpt.vocab_model is not None else None
        return checkpoint.params_to_device(ckpt.params), cfg, vocab
    cfg = translator.Config.preset("small", dropout=0.0)
    return translator.init_params(cfg, seed=0, dtype=backend.float_dtype()), cfg, None


def source_ids(args, cfg, vocab) -> list[list[int]]:
    """Token ids (without EOS) of the benchmark's source sentences."""
    import numpy as np
    if args.source is None:
        rng = np.random.default_rng(0)
        lengths = np.clip(rng.poisson(13, size=args.sentences), 3, None)   # Multi30k: ~13 pieces
        return [rng.integers(4, cfg.src_vocab, size=n).tolist() for n in lengths]
    from minitfm.data.corpus import read_lines
    lines = read_lines(args.source)[:args.sentences]
    if vocab is None:
        from minitfm.data.vocab import train_vocab
        vocab = train_vocab(lines, min(cfg.src_vocab, 4000), hard_vocab_limit=False, num_threads=1)
    return [ids[:cfg.max_len - 1] for ids in vocab.encode(lines)]


def forbid_eos(logits, cfg):
    logits[:, [cfg.pad_id, cfg.bos_id, cfg.eos_id]] = -float("inf")
    return logits


def greedy_cached(params, cfg, src, n_tokens):
    from minitfm import backend
    from minitfm.decoding import decode
    xp = backend.xp
    kv = decode.init_kv_cache(params, cfg, src, capacity=n_tokens)
    tokens = xp.full((src.shape[0],), cfg.bos_id, dtype=xp.int64)
    out = []
    for t in range(n_tokens):
        tokens = forbid_eos(decode.step(params, cfg, kv, tokens, t), cfg).argmax(axis=-1)
        out.append(tokens)
    return backend.to_host(xp.stack(out, axis=1))


def greedy_recomputed(params, cfg, src, n_tokens):
    from minitfm import backend
    from minitfm.models import translator
    xp = backend.xp
    memory, src_mask, _ = translator.encoder_forward(params, cfg, src)
    prefix = xp.full((src.shape[0], 1), cfg.bos_id, dtype=xp.int64)
    for _ in range(n_tokens):
        h, _ = translator.decoder_forward(params, cfg, prefix, memory, src_mask)   # the whole prefix
        tokens = forbid_eos(translator.logits(params, cfg, h[:, -1]), cfg).argmax(axis=-1)
        prefix = xp.concatenate([prefix, tokens[:, None]], axis=1)
    return backend.to_host(prefix[:, 1:])


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def bench_cache(args, params, cfg, sentences) -> dict:
    from minitfm.decoding import batched
    src = batched.pad_batch(sentences[:args.greedy_sentences], cfg)
    greedy_cached(params, cfg, src[:2], 2)                             # warm up
    cached, t_cached = timed(greedy_cached, params, cfg, src, args.tokens)
    recomputed, t_recomputed = timed(greedy_recomputed, params, cfg, src, args.tokens)
    if (cached != recomputed).any():
        raise AssertionError("cached and recomputed greedy decoding disagree")
    return {"greedy_sentences": int(src.shape[0]), "output_tokens": args.tokens,
            "cached_s": round(t_cached, 3), "recomputed_s": round(t_recomputed, 3),
            "speedup": round(t_recomputed / t_cached, 2)}


def bench_beam(args, params, cfg, sentences) -> dict:
    from minitfm.decoding import batched
    results, seconds = timed(batched.translate_ids, params, cfg, sentences, beam=args.beam,
                             alpha=args.alpha, max_len=args.max_len, batch_size=args.batch_size)
    out_tokens = sum(len(hyps[0][0]) for hyps in results)
    return {"sentences": len(sentences), "beam": args.beam, "batch_size": args.batch_size,
            "source_tokens_mean": round(sum(map(len, sentences)) / len(sentences), 2),
            "output_tokens_mean": round(out_tokens / len(sentences), 2),
            "beam_s": round(seconds, 2), "sentences_per_s": round(len(sentences) / seconds, 2)}


def table(report: dict) -> str:
    rows = [("setting", "value")]
    for section in ("setup", "cache", "beam"):
        rows += [(f"{section}.{k}", str(v)) for k, v in report.get(section, {}).items()]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{width}}  {b}" for a, b in rows)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads is not None:
        if "numpy" in sys.modules:
            print("warning: numpy is already loaded, --threads has no effect", file=sys.stderr)
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    from minitfm import backend
    backend.use(args.backend)
    params, cfg, vocab = load_model(args)
    sentences = source_ids(args, cfg, vocab)
    report = {"setup": {"backend": backend.name, "threads": args.threads,
                        "model": args.checkpoint or "small preset, random weights",
                        "source": args.source or "random ids, Multi30k-like lengths",
                        "d_model": cfg.d_model, "layers": cfg.n_layers, "vocab": cfg.tgt_vocab}}
    if "cache" not in args.skip:
        report["cache"] = bench_cache(args, params, cfg, sentences)
    if "beam" not in args.skip:
        report["beam"] = bench_beam(args, params, cfg, sentences)
    print(json.dumps(report))
    print(table(report))
    return report


if __name__ == "__main__":
    main()
