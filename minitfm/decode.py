"""Greedy decoding and beam search over a key/value cache.

The paper's settings (section 6.1): "we used beam search with a beam size of 4 and length
penalty alpha = 0.6 [...] We set the maximum output length during inference to input length +
50, but terminate early when possible." These are the defaults here. The length penalty is that
of Wu et al. (2016, GNMT):

    lp(Y) = ((5 + |Y|) / 6)^alpha          score(Y) = log P(Y | X) / lp(Y)

where |Y| counts the output tokens including the final EOS. Without it, beam search prefers short
outputs, since every extra token lowers log P.

Incremental decoding
--------------------
The decoder is causal: the output at position t depends only on the inputs at positions <= t.
Re-running the whole prefix at every step makes step t cost O(t) projections and O(t^2)
attention. Instead a :class:`KVCache` keeps, for every decoder layer,

- the cross-attention keys and values, a function of the encoder output alone: computed once per
  sentence, before the first step (``model.cross_kv``);
- the self-attention keys and values of the positions decoded so far, in buffers allocated once
  at the maximum length: step t writes position t's K and V into slot t, and position t's query
  attends to slots 0..t.

Step t then runs every layer on one position (:func:`step`, i.e. ``model.decoder_step``): O(1)
projections and O(t) attention. No mask is needed in the self-attention, because slots after t
are never read and decoding never feeds a padding token. The one-position computations sit
beside the full-sequence ones they mirror: ``inputs.forward(..., offset=t)``,
``decoder.stack_step`` / ``layer_step``, ``attention.self_step`` / ``cross_step``; this module
holds only the key/value arrays and the search.

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

Outputs are lists of token ids without BOS and EOS. Hypothesis bookkeeping (prefixes, finished
lists) is host-side Python; the array work goes through ``backend.xp``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from minitfm import backend
from minitfm.models import translator as model     # the model this module decodes

__all__ = [
    "EXTRA_LENGTH", "KVCache", "init_kv_cache", "step", "reorder", "length_penalty",
    "output_limits", "greedy", "beam_search", "translate_ids", "length_batches", "pad_batch",
]

EXTRA_LENGTH = 50   # maximum output length = source length + 50 (section 6.1)

Hypothesis = tuple[list[int], float]   # (tokens without BOS/EOS, length-normalised log-prob)


# ---- the key/value cache ---------------------------------------------------------------------

@dataclass
class KVCache:
    """Per-layer keys and values for incremental decoding; axis 0 of every array is the row.

    self_k, self_v    one (R, H, L, d_k) buffer per layer; slots < t are filled at step t
    cross_k, cross_v  one (R, H, S, d_k) array per layer, from the encoder output
    src_mask          (R, 1, 1, S) additive mask of the padded source positions
    """

    self_k: list
    self_v: list
    cross_k: list
    cross_v: list
    src_mask: object

    @property
    def rows(self) -> int:
        return int(self.src_mask.shape[0])

    @property
    def capacity(self) -> int:
        """How many positions the self-attention buffers hold."""
        return int(self.self_k[0].shape[2])


def init_kv_cache(params: dict, cfg: model.Config, src, beam: int = 1,
                  capacity: int | None = None) -> KVCache:
    """Encode ``src`` (B, S) and return a cache of B*beam rows (each sentence repeated ``beam``
    times) with room for ``capacity`` decoding steps (default ``cfg.max_len``)."""
    xp = backend.xp
    capacity = cfg.max_len if capacity is None else capacity
    if not 1 <= capacity <= cfg.max_len:
        raise ValueError(f"cache capacity must be in [1, Config.max_len={cfg.max_len}], "
                         f"got {capacity}")
    memory, src_mask, _ = model.encoder_forward(params, cfg, src)     # (B, S, d), (B, 1, 1, S)
    cross_k, cross_v = model.cross_kv(params, cfg, memory)            # (B, H, S, d_k) per layer
    rows = memory.shape[0] * beam
    d_k = cfg.d_model // cfg.n_heads

    def buffer():
        return xp.zeros((rows, cfg.n_heads, capacity, d_k), dtype=memory.dtype)

    return KVCache(self_k=[buffer() for _ in range(cfg.n_layers)],
                   self_v=[buffer() for _ in range(cfg.n_layers)],
                   cross_k=[xp.repeat(k, beam, axis=0) for k in cross_k],   # (B*beam, H, S, d_k)
                   cross_v=[xp.repeat(v, beam, axis=0) for v in cross_v],
                   src_mask=xp.repeat(src_mask, beam, axis=0))


def reorder(kv: KVCache, rows: Sequence[int], filled: int) -> KVCache:
    """The cache whose row j is row ``rows[j]`` of ``kv``; only slots < ``filled`` are copied.

    Works in place: only the rows that change are copied (typically fewer than half of the
    beams change parent), and fewer rows (sentences leaving the batch) become a view of the
    first ones, so no buffer is ever reallocated. ``rows`` must keep every row within its
    sentence (beams move only within their sentence): the cross-attention arrays, the same for
    all beams of a sentence, then need copying only when sentences leave.
    """
    n = len(rows)
    moved = [j for j, r in enumerate(rows) if r != j]
    if moved:
        dst, src = _int_array(moved), _int_array([rows[j] for j in moved])
        for buf in kv.self_k + kv.self_v:
            buf[dst, :, :filled] = buf[src, :, :filled]               # (moved, H, filled, d_k)
        if n < kv.rows:
            for array in kv.cross_k + kv.cross_v + [kv.src_mask]:
                array[dst] = array[src]
    if n == kv.rows:
        return kv
    return KVCache(self_k=[b[:n] for b in kv.self_k], self_v=[b[:n] for b in kv.self_v],
                   cross_k=[k[:n] for k in kv.cross_k], cross_v=[v[:n] for v in kv.cross_v],
                   src_mask=kv.src_mask[:n])


# ---- one decoding step -----------------------------------------------------------------------

def step(params: dict, cfg: model.Config, kv: KVCache, tokens, t: int):
    """Feed ``tokens`` (R,), the decoder inputs at position t, and return the logits (R, V) of
    the tokens at position t + 1. Writes slot t of the cache's self-attention buffers."""
    if t >= kv.capacity:
        raise ValueError(f"decoding step {t} is past the cache capacity {kv.capacity}")
    h = model.decoder_step(params, cfg, tokens, t, kv.self_k, kv.self_v,
                           kv.cross_k, kv.cross_v, kv.src_mask)                # (R, d)
    return model.logits(params, cfg, h)                                         # (R, V)


# ---- search helpers --------------------------------------------------------------------------

def length_penalty(length: int, alpha: float) -> float:
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def output_limits(src, cfg: model.Config, max_len: int | None = None) -> list[int]:
    """The most output tokens (EOS included) of each sentence of ``src`` (B, S).

    Default: its source length (non-padding positions, EOS included) + 50, at most
    ``cfg.max_len``; an explicit ``max_len`` applies to every sentence.
    """
    if max_len is not None:
        if not 1 <= max_len <= cfg.max_len:
            raise ValueError(f"max_len must be in [1, Config.max_len={cfg.max_len}], got {max_len}")
        return [int(max_len)] * int(src.shape[0])
    lengths = backend.to_host((src != cfg.pad_id).sum(axis=1)).tolist()
    return [min(int(n) + EXTRA_LENGTH, cfg.max_len) for n in lengths]


def _prepare(params: dict, cfg: model.Config, src):
    """``(src on the device, the output limits)``; the ids are checked, and the limits counted,
    on the host (a host array costs no wait for the device; a device array one copy)."""
    model.check_params(params, cfg)
    src = model.check_tokens(backend.host_copy(src, "src"), "src", cfg.src_vocab, cfg, host=True)
    return backend.to_device(src), src


def _forbid_special(scores, cfg: model.Config):
    """Padding and BOS are never generated: fed back, padding would be masked as a key."""
    scores[:, cfg.pad_id] = -math.inf
    scores[:, cfg.bos_id] = -math.inf
    return scores


def _extend_scores(logits, scores):
    """Every hypothesis' log-probability plus each next token's: scores (n, K) + log-softmax of
    logits (n*K, V), as (n*K, V), computed in place over ``logits`` with one temporary array."""
    xp = backend.xp
    top = logits.max(axis=1, keepdims=True)                            # (R, 1)
    e = logits - top
    xp.exp(e, out=e)
    log_z = top + xp.log(e.sum(axis=1, keepdims=True))                 # (R, 1) log-normaliser
    logits -= log_z - scores.reshape(-1, 1)
    return logits


def _top_k(x, k: int, block: int = 128):
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


def _int_array(values: Sequence[int]):
    xp = backend.xp
    return xp.asarray(list(values), dtype=xp.int64)


# ---- greedy decoding -------------------------------------------------------------------------

def greedy(params: dict, cfg: model.Config, src, max_len: int | None = None) -> list[list[int]]:
    """The most probable next token at every step, for each sentence of ``src`` (B, S).

    Stops a sentence at EOS or after its maximum number of output tokens (see
    :func:`output_limits`). Returns the token ids of each sentence, without BOS and EOS.
    """
    src, host_src = _prepare(params, cfg, src)
    limits = output_limits(host_src, cfg, max_len)
    kv = init_kv_cache(params, cfg, src, beam=1, capacity=max(limits))
    outputs: list[list[int]] = [[] for _ in limits]
    active = list(range(len(limits)))                       # the sentence of each cache row
    tokens = backend.xp.full((len(active),), cfg.bos_id, dtype=backend.xp.int64)   # (R,)
    for t in range(max(limits)):
        logits = _forbid_special(step(params, cfg, kv, tokens, t), cfg)             # (R, V)
        tokens = logits.argmax(axis=-1)                                             # (R,)
        keep = []
        for row, (s, token) in enumerate(zip(active, backend.to_host(tokens).tolist())):
            if token == cfg.eos_id:
                continue
            outputs[s].append(token)
            if len(outputs[s]) < limits[s]:
                keep.append(row)
        if not keep:
            break
        if len(keep) < len(active):
            kv = reorder(kv, keep, filled=t + 1)
            tokens = tokens[_int_array(keep)]
            active = [active[r] for r in keep]
    return outputs


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
    src, host_src = _prepare(params, cfg, src)
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
        extended = _extend_scores(step(params, cfg, kv, tokens, t), scores)            # (R, V)
        vocab = extended.shape[1]
        candidates = _forbid_special(extended, cfg).reshape(len(active), k * vocab)      # (n, K*V)
        top_scores, top_ids = _top_k(candidates, 2 * k)                                 # (n, 2K)
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
        tokens = _int_array(next_tokens)
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
