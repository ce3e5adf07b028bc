"""Beam search over the key/value cache of :mod:`minitfm.decode`, and many sentences at once.

The paper's settings (section 6.1): beam size 4, length penalty alpha = 0.6 (GNMT's, see
:func:`minitfm.decode.length_penalty`), maximum output length = input length + 50; these are the
defaults here.

Beam search, batched
--------------------
The cache rows are hypotheses: sentence i's K beams are rows i*K .. i*K + K - 1. Every step
(:func:`beam_search`)

1. scores the next token of every live hypothesis: log-softmax of the step's logits, (R, V);
2. adds each hypothesis' log-probability, and takes each sentence's 2K best (hypothesis, token)
   pairs among its K*V candidates;
3. finishes the pairs ending in EOS that rank among the K best (their score is normalised by the
   length penalty) and continues with the K best that do not end in EOS -- at most K of 2K
   candidates are EOS, so K remain (with beam 1 this is greedy decoding exactly);
4. gathers the self-attention cache rows of the continuing hypotheses' parents ("reordering").

A finished hypothesis leaves the beam and is never extended. A sentence is done when K of its
hypotheses have ended in EOS, or at its maximum length (its live hypotheses then finish as they
are); done sentences leave the batch, so the work shrinks as the batch finishes. Beams move only
within their sentence, so the cross-attention keys and values -- the same for all beams of a
sentence -- are gathered only when sentences leave.

Outputs are lists of ``(token ids without BOS and EOS, length-normalised log-probability)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from minitfm import backend, decode     # decode.step: read at each step, as greedy reads it
from minitfm.decode import (Hypothesis, forbid_special, init_kv_cache, int_array,
                            length_penalty, output_limits, prepare_source, reorder)
from minitfm.models import translator as model     # the model this module decodes

__all__ = ["beam_search", "extend_scores", "top_k", "translate_ids", "length_batches", "pad_batch"]


# ---- scoring and choosing the candidates -----------------------------------------------------

def extend_scores(logits, scores):
    """Every hypothesis' log-probability plus each next token's: scores (n, K) + log-softmax of
    logits (n*K, V), as (n*K, V), computed in place over ``logits`` with one temporary array."""
    xp = backend.xp
    top = logits.max(axis=1, keepdims=True)                            # (R, 1)
    e = logits - top
    xp.exp(e, out=e)
    log_z = top + xp.log(e.sum(axis=1, keepdims=True))                 # (R, 1) log-normaliser
    logits -= log_z - scores.reshape(-1, 1)
    return logits


def top_k(x, k: int, block: int = 128):
    """The k largest entries of each row of x (n, m), best first: ``(values, indices)`` (n, k).

    A full selection over the m = K*V candidates of a sentence would cost as much as a decoder
    layer, so it runs on a shortlist: cut each row into blocks of ``block`` entries and keep the
    k blocks with the largest maxima. Every one of the k best entries lies in them: an entry of
    another block is beaten by the k block maxima, so at least k entries are larger. The
    remainder that fills no whole block is always kept.
    """
    xp = backend.xp
    n, m = x.shape
    n_blocks, whole = m // block, (m // block) * block
    if n_blocks <= k:                                                  # small rows: no shortlist
        return _select(x, xp.broadcast_to(xp.arange(m), (n, m)), k)
    blocks = x[:, :whole].reshape(n, n_blocks, block)                  # (n, m/block, block)
    best = xp.argpartition(blocks.max(axis=2), n_blocks - k, axis=1)[:, n_blocks - k:]   # (n, k)
    ids = (best[:, :, None] * block + xp.arange(block)).reshape(n, k * block)
    ids = xp.concatenate([ids, xp.broadcast_to(xp.arange(whole, m), (n, m - whole))], axis=1)
    return _select(xp.take_along_axis(x, ids, axis=1), ids, k)


def _select(values, ids, k: int):
    """The k largest ``values`` (n, c) of each row and their ``ids`` (n, c), best first."""
    xp = backend.xp
    c = values.shape[1]
    top = xp.argpartition(values, c - k, axis=1)[:, c - k:]            # (n, k), unordered
    top_values = xp.take_along_axis(values, top, axis=1)
    order = xp.argsort(-top_values, axis=1)
    return (xp.take_along_axis(top_values, order, axis=1),
            xp.take_along_axis(xp.take_along_axis(ids, top, axis=1), order, axis=1))



# ---- beam search -----------------------------------------------------------------------------

def _check_beam(beam: int, alpha: float, nbest: int) -> None:
    if not isinstance(beam, int) or beam < 1:
        raise ValueError(f"beam size must be a positive integer, got {beam!r}")
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest must be in [1, beam={beam}] (beam search keeps only {beam} "
                         f"hypotheses), got {nbest}")
    if not alpha >= 0.0:
        raise ValueError(f"length penalty alpha must be >= 0, got {alpha!r}")


def _settled(finished: list[Hypothesis], live: list, nbest: int, limit: int,
             alpha: float) -> bool:
    """True when no live hypothesis can end better than the ``nbest``-th finished one.

    A live hypothesis with log-probability s < 0 can only lose probability, and its length
    penalty is at most lp(limit), so its final score is at most s / lp(limit): if the nbest best
    finished scores are all at least that for the best live s, searching on cannot change them.
    (With alpha = 0 this is "the best candidate of a step ended in EOS", CTranslate2's rule.)
    """
    if len(finished) < nbest:
        return False
    bound = max(score for _, _, score in live) / length_penalty(limit, alpha)
    return sorted((h[1] for h in finished), reverse=True)[nbest - 1] >= bound


def beam_search(params: dict, cfg: model.Config, src, beam: int = 4, alpha: float = 0.6,
                max_len: int | None = None, nbest: int = 1,
                stop_early: bool = False) -> list[list[Hypothesis]]:
    """Beam search for each sentence of ``src`` (B, S): its ``nbest`` best hypotheses.

    Each hypothesis is ``(tokens, score)``: token ids without BOS and EOS, and
    log P(tokens, EOS | src) / lp, best first. A hypothesis stopped by the length limit has no EOS
    and its score has no EOS term. See the module docstring for the algorithm.

    ``stop_early``: a sentence also leaves the batch as soon as no live hypothesis can beat its
    ``nbest``-th finished one (:func:`_settled`): the same results in fewer steps.
    """
    _check_beam(beam, alpha, nbest)
    xp = backend.xp
    src, host_src = prepare_source(params, cfg, src)
    limits = output_limits(host_src, cfg, max_len)
    kv = init_kv_cache(params, cfg, src, beam=beam, capacity=max(limits))
    k = beam
    finished: list[list[Hypothesis]] = [[] for _ in limits]
    active = list(range(len(limits)))                       # the sentence of each group of K rows
    prefixes: list[list[int]] = [[] for _ in range(len(active) * k)]   # one per cache row
    tokens = xp.full((len(active) * k,), cfg.bos_id, dtype=xp.int64)   # (R,)
    scores = xp.full((len(active), k), -math.inf, dtype=kv.src_mask.dtype)
    scores[:, 0] = 0.0                    # one live hypothesis (BOS) per sentence at first

    for t in range(max(limits)):
        extended = extend_scores(decode.step(params, cfg, kv, tokens, t), scores)            # (R, V)
        vocab = extended.shape[1]
        candidates = forbid_special(extended, cfg).reshape(len(active), k * vocab)      # (n, K*V)
        top_scores, top_ids = top_k(candidates, 2 * k)                                 # (n, 2K)
        top_scores, top_ids = (a.tolist() for a in backend.to_host_together(top_scores, top_ids))

        rows, next_tokens, next_scores, next_prefixes, still_active = [], [], [], [], []
        for i, s in enumerate(active):
            live = []                                       # (parent row, token, score)
            for rank, (score, flat) in enumerate(zip(top_scores[i], top_ids[i])):
                if score == -math.inf:
                    break
                parent, token = i * k + flat // vocab, flat % vocab
                if token != cfg.eos_id:
                    if len(live) < k:
                        live.append((parent, token, score))
                elif rank < k:
                    finished[s].append((prefixes[parent], score / length_penalty(t + 1, alpha)))
            if len(finished[s]) >= k or not live:
                continue
            if stop_early and _settled(finished[s], live, nbest, limits[s], alpha):
                continue
            if t + 1 >= limits[s]:                          # out of length: finish as they are
                finished[s].extend((prefixes[p] + [tok], sc / length_penalty(t + 1, alpha))
                                   for p, tok, sc in live)
                continue
            live += [(live[0][0], live[0][1], -math.inf)] * (k - len(live))   # tiny vocabularies
            still_active.append(s)
            for parent, token, score in live:
                rows.append(parent)
                next_tokens.append(token)
                next_scores.append(score)
                next_prefixes.append(prefixes[parent] + [token])
        if not still_active:
            break
        kv = reorder(kv, rows, filled=t + 1)
        active, prefixes = still_active, next_prefixes
        tokens = int_array(next_tokens)
        scores = xp.asarray(next_scores, dtype=scores.dtype).reshape(len(active), k)

    return [sorted(hyps, key=lambda h: -h[1])[:nbest] for hyps in finished]


# ---- many sentences --------------------------------------------------------------------------

def pad_batch(sentences: Sequence[Sequence[int]], cfg: model.Config):
    """Source ids (B, S) on the active backend: each sentence, EOS, then padding."""
    if not sentences:
        raise ValueError("pad_batch needs at least one sentence")
    width = max(len(s) for s in sentences) + 1
    rows = [list(s) + [cfg.eos_id] + [cfg.pad_id] * (width - len(s) - 1) for s in sentences]
    return backend.xp.asarray(rows, dtype=backend.xp.int64)


def length_batches(sentences: Sequence[Sequence[int] | None], batch_size: int
                   ) -> Iterator[list[int]]:
    """Indices of the sentences, shortest first, ``batch_size`` at a time; None entries skipped."""
    order = sorted((i for i, s in enumerate(sentences) if s is not None),
                   key=lambda i: len(sentences[i]))
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


def translate_ids(params: dict, cfg: model.Config, sentences: Sequence[Sequence[int]], *,
                  beam: int = 4, alpha: float = 0.6, max_len: int | None = None, nbest: int = 1,
                  batch_size: int = 64, stop_early: bool = False) -> list[list[Hypothesis]]:
    """Beam search over many sentences (token ids without EOS, which is appended).

    Sentences are sorted by length and decoded ``batch_size`` at a time, so a batch wastes little
    on padding and its sentences finish at similar steps; results come back in input order.
    """
    _check_beam(beam, alpha, nbest)
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
    results: list[list[Hypothesis]] = [[] for _ in sentences]
    for batch in length_batches(sentences, batch_size):
        src = pad_batch([sentences[i] for i in batch], cfg)
        for i, hyps in zip(batch, beam_search(params, cfg, src, beam, alpha, max_len, nbest,
                                              stop_early)):
            results[i] = hyps
    return results
