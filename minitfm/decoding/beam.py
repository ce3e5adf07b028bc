"""Beam search over the key/value cache of :mod:`minitfm.decoding.decode`, one batch of sentences
(many sentences, sorted and refilled: :mod:`minitfm.decoding.batched`).

The paper's settings (section 6.1): beam size 4, length penalty alpha = 0.6, maximum output
length = input length + 50; these are the defaults here.

Length penalty
--------------
A finished hypothesis Y scores log P(Y | X) / lp(|Y|), |Y| counting its tokens with the final
EOS. Without a penalty (alpha = 0) beam search prefers short outputs, since every extra token
lowers log P. Two forms:

    gnmt    lp = ((5 + |Y|) / 6)^alpha      Wu et al. (2016), the paper's (the default)
    power   lp = |Y|^alpha                  CTranslate2's, fairseq's and Marian's

Both grow with |Y| for alpha > 0 and are 1 at alpha = 0. CTranslate2 and fairseq count the EOS
in |Y| too, so the power form scores every hypothesis exactly as they do.

Beam search, batched
--------------------
The cache rows are hypotheses: sentence i's K beams are rows i*K .. i*K + K - 1. Every step
(:func:`beam_search`)

1. scores the next token of every live hypothesis: log-softmax of the step's logits, (R, V);
2. adds each hypothesis' log-probability, and takes each sentence's 2K best (hypothesis, token)
   pairs among its K*V candidates;
3. finishes the pairs ending in EOS that rank among the K best (scored with the length penalty)
   and continues with the K best that do not end in EOS -- at most K of 2K candidates are EOS,
   so K remain (with beam 1 this is greedy decoding exactly, but for exact stopping with a
   length penalty, which may search on past the first EOS);
4. gathers the self-attention cache rows of the continuing hypotheses' parents ("reordering").

A finished hypothesis leaves the beam and is never extended. At its maximum length a sentence's
K best candidates all finish, with EOS or without. The first step runs on one row per sentence
(all K rows would hold the same BOS) and then copies its keys and values to the sentence's
other rows. Done sentences leave the batch, so the work shrinks as the batch finishes. The
cross-attention keys and values are the same for all beams of a sentence: the cache holds them
once per sentence, and as beams move only within their sentence, they are gathered only when
sentences leave.

When a sentence is done
-----------------------
``stopping="exact"``: when no live hypothesis can still beat its best finished one (its
``nbest`` best, with n-best output). Why this is exact: a live hypothesis with log-probability s
can only lose probability as it grows (every token adds a log-probability <= 0), and it ends
with at most L tokens (L: the sentence's length limit), where the penalty is largest; so every
hypothesis it can still become scores at most s / lp(L). Once the best live s gives
s / lp(L) <= the ``nbest``-th best finished score, searching on cannot change the ``nbest``
best: the rule stops where the outcome is settled, and its result is that of the same search run
to the length limit. With alpha = 0 (lp = 1) it is CTranslate2's rule, "the best candidate of a
step ends in EOS": at the first step where that happens the rule holds, and where it holds
earlier CTranslate2 searches on without finding anything better. Its cost in steps: at alpha = 0
a sentence often ends at the step its best hypothesis ends, before K have finished; with a
penalty lp(L) is far above lp(|Y|) (L is the source length + 50), and the search goes on until
the best live log-probability falls below the best finished score times lp(L): several steps
after K have finished, up to the length limit with a large alpha.

``stopping="first-k"``: when K hypotheses have finished (CTranslate2 with a length penalty and
``patience=1``, fairseq; "first come, first served" in Kasai et al., 2022, "A Call for Clarity in
Beam Search"). A live hypothesis that would have won is dropped when the K-th finishes first,
and with a strong penalty that is its use: a search run on finds long, repetitive hypotheses
whose length the penalty rewards more than their probability falls -- the model's own
preference, which early stopping hides.

``stopping="auto"`` (the default): exact without a penalty, first-k with one -- what CTranslate2
does, and what Multi30k's validation set chose (docs: *Recipes and results*). At alpha = 0 both
rules gave the same outputs there and exact ran 22 % fewer decoder rows; with a penalty first-k
was as good or better and cheaper: the same outputs at GNMT's 0.6 with 16 % fewer rows, and at
the strong penalties that score best, exact's outputs grew long (52 tokens on average at GNMT's
2.2, BLEU 6.8, against 13 tokens and 26.4 with first-k).

Outputs are lists of ``(token ids without BOS and EOS, score)``, best first.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Sequence

from minitfm import backend
from minitfm.decoding import decode     # decode.step: read at each step, as greedy reads it
from minitfm.decoding.decode import (KVCache, forbid_special, init_kv_cache, int_array,
                                     output_limits, prepare_source, reorder)
from minitfm.models import translator as model     # the model this module decodes

__all__ = ["LENGTH_PENALTIES", "STOPPING_RULES", "Hypothesis", "Finished", "length_penalty",
           "stopping_rule", "check_search", "beam_search", "step_candidates", "groups_in_place",
           "top_k"]

LENGTH_PENALTIES = ("gnmt", "power")
STOPPING_RULES = ("auto", "exact", "first-k")     # auto: chosen on validation, see above

Hypothesis = tuple[list[int], float]   # (tokens without BOS/EOS, log-probability / lp)


def length_penalty(length: int, alpha: float, form: str = "gnmt") -> float:
    """lp(|Y|) of ``form`` (see the module docstring); ``length`` counts the final EOS."""
    if form == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    return float(length) ** alpha


def stopping_rule(stopping: str, alpha: float) -> str:
    """The rule ``stopping`` names: "auto" is "exact" without a length penalty, else "first-k"."""
    if stopping == "auto":
        return "first-k" if alpha else "exact"
    return stopping


def check_search(beam: int, alpha: float, nbest: int, lenpen_form: str = "gnmt",
                 stopping: str = "auto") -> None:
    """Raise ValueError, saying what is wrong, for settings beam search cannot take."""
    if not isinstance(beam, int) or beam < 1:
        raise ValueError(f"beam size must be a positive integer, got {beam!r}")
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest must be in [1, beam={beam}] (beam search keeps only {beam} "
                         f"hypotheses), got {nbest}")
    if not alpha >= 0.0:
        raise ValueError(f"length penalty alpha must be >= 0, got {alpha!r}")
    if lenpen_form not in LENGTH_PENALTIES:
        raise ValueError(f"length penalty form must be one of {', '.join(LENGTH_PENALTIES)}, "
                         f"got {lenpen_form!r}")
    if stopping not in STOPPING_RULES:
        raise ValueError(f"stopping rule must be one of {', '.join(STOPPING_RULES)}, "
                         f"got {stopping!r}")


# ---- one step's candidates -------------------------------------------------------------------

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


def top_k(x, k: int, block: int = 32, maxima=None):
    """The k largest entries of each row of x (n, m), best first: ``(values, indices)`` (n, k).

    A full selection over the m = K*V candidates of a sentence would cost as much as a decoder
    layer, so it runs on a shortlist: split each row into groups of ``block`` entries and keep
    the k groups with the largest maxima. Every one of the k best entries lies in them: an entry
    of another group is beaten by the k group maxima, so at least k entries are larger. A group
    is every (m // block)-th entry, not a run of neighbours: the maxima are then a reduction
    over a middle axis, as fast as one pass over x, where runs would cost one small reduction
    each. The remainder that fills no whole group is always kept. ``maxima``: the groups'
    maxima, ``group_maxima(x, k, block)``, where the caller has them.
    """
    xp = backend.xp
    n, m = x.shape
    stride, whole = m // block, (m // block) * block
    if stride <= k:                                                    # small rows: no shortlist
        return _select(x, xp.broadcast_to(xp.arange(m), (n, m)), k)
    if maxima is None:
        maxima = group_maxima(x, k, block)                             # (n, m/block)
    best = xp.argpartition(maxima, stride - k, axis=1)[:, stride - k:]  # (n, k) groups
    ids = (best[:, :, None] + stride * xp.arange(block)).reshape(n, k * block)
    ids = xp.concatenate([ids, xp.broadcast_to(xp.arange(whole, m), (n, m - whole))], axis=1)
    return _select(xp.take_along_axis(x, ids, axis=1), ids, k)


def group_maxima(x, k: int, block: int = 32):
    """The maxima of ``top_k``'s groups of x (n, m), (n, m // block); None where it keeps no
    shortlist (m // block <= k)."""
    n, m = x.shape
    stride = m // block
    if stride <= k:
        return None
    return x[:, :stride * block].reshape(n, block, stride).max(axis=1)


def _select(values, ids, k: int):
    """The k largest ``values`` (n, c) of each row and their ``ids`` (n, c), best first."""
    xp = backend.xp
    c = values.shape[1]
    top = xp.argpartition(values, c - k, axis=1)[:, c - k:]            # (n, k), unordered
    top_values = xp.take_along_axis(values, top, axis=1)
    order = xp.argsort(-top_values, axis=1)
    return (xp.take_along_axis(top_values, order, axis=1),
            xp.take_along_axis(xp.take_along_axis(ids, top, axis=1), order, axis=1))


def first_rows(kv: KVCache, beam: int) -> KVCache:
    """``kv`` with the views of its rows 0, K, 2K, ... alone: one per sentence, for the first
    step (the cross-attention arrays have one row per sentence already)."""
    return dataclasses.replace(kv, self_k=[b[::beam] for b in kv.self_k],
                               self_v=[b[::beam] for b in kv.self_v])


def groups_in_place(groups: list[int], positions: Sequence[int] | None = None) -> list[int]:
    """The groups of K rows that go on (their indices, ascending), in their order in the smaller
    batch: a group that lies within it keeps its place, those beyond fill the places that ended
    sentences left -- the cache then moves the fewest rows (the order of sentences is free).
    With ``positions`` (each group's, groups at one position lying together), the same within
    each run of one position, the runs kept in their order: so they still lie together."""
    order = []
    position = (lambda g: 0) if positions is None else (lambda g: positions[g])
    for _, run in itertools.groupby(groups, key=position):
        run, first = list(run), len(order)
        places = range(first, first + len(run))
        beyond = iter(g for g in run if g not in places)
        staying = set(run)
        order += [g if g in staying else next(beyond) for g in places]
    return order


def in_parents_rows(live: list, first: int) -> list:
    """The K ``live`` (parent row, token, score) of a sentence whose rows are ``first`` ..
    ``first`` + K - 1, placed so that as many as can stay in their parent's row: the cache then
    copies the keys and values of the others alone (the order of a sentence's beams is free)."""
    placed, others = [None] * len(live), []
    for hyp in live:
        if placed[hyp[0] - first] is None:
            placed[hyp[0] - first] = hyp
        else:
            others.append(hyp)
    free = iter([j for j, hyp in enumerate(placed) if hyp is None])
    for hyp in others:
        placed[next(free)] = hyp
    return placed


# ---- beam search -----------------------------------------------------------------------------

class Finished:
    """The finished hypotheses of each sentence, and the rule that says when it is done."""

    def __init__(self, sentences: int, beam: int, alpha: float, nbest: int, lenpen_form: str,
                 stopping: str, eos_id: int):
        self.beam, self.nbest, self.eos_id = beam, nbest, eos_id
        self.alpha, self.lenpen_form = alpha, lenpen_form
        self.exact = stopping_rule(stopping, alpha) == "exact"
        self.hyps: list[list[Hypothesis]] = [[] for _ in range(sentences)]
        self.best: list[list[float]] = [[] for _ in range(sentences)]   # nbest best scores, a heap
        self.limits: list[int] = [0] * sentences      # each sentence's length limit
        self.lp: list[float] = []                     # lp(n) by length n

    def set_limits(self, sentences: Sequence[int], limits: Sequence[int]) -> None:
        """The length limits of ``sentences`` (their indices), before their first step."""
        for s, limit in zip(sentences, limits):
            self.limits[s] = limit
        self.lp += [length_penalty(n, self.alpha, self.lenpen_form)
                    for n in range(len(self.lp), max(limits) + 1)]

    def advance(self, s: int, t: int, scores: list, ids: list, vocab: int, first: int,
                prefixes: list) -> list | None:
        """Sentence ``s`` at step t, its beams in rows ``first`` .. ``first`` + K - 1: its 2K best
        candidates (``scores``, best first, and ``ids`` into its K*V) finish or go on. Returns its
        K live ``(parent row, token, score)``, placed in their parents' rows where they can be,
        or None once it is done."""
        k, eos, last = self.beam, self.eos_id, t + 1 >= self.limits[s]
        live = []
        for rank, (score, flat) in enumerate(zip(scores, ids)):
            if score == -math.inf:
                break
            parent, token = first + flat // vocab, flat % vocab
            if rank < k and (token == eos or last):     # out of length: the K best finish
                tail = [] if token == eos else [token]
                self.hyps[s].append((prefixes[parent] + tail, score / self.lp[t + 1]))
                if len(self.best[s]) < self.nbest:
                    heapq.heappush(self.best[s], self.hyps[s][-1][1])
                else:
                    heapq.heappushpop(self.best[s], self.hyps[s][-1][1])
            elif token != eos and len(live) < k:
                live.append((parent, token, score))
        if last or not live:
            return None
        if self.exact:     # done once the best live bound, s / lp(L), cannot beat the nbest-th
            if len(self.best[s]) == self.nbest and \
                    self.best[s][0] >= live[0][2] / self.lp[self.limits[s]]:
                return None
        elif len(self.hyps[s]) >= k:
            return None
        live += [(live[0][0], live[0][1], -math.inf)] * (k - len(live))   # tiny vocabularies
        return in_parents_rows(live, first)

    def results(self, s: int) -> list[Hypothesis]:
        return sorted(self.hyps[s], key=lambda h: -h[1])[:self.nbest]


# The logits of a block of sentences, at most: about a core's L2 cache. The log-softmax's passes
# and the shortlist's maxima then read a block from the cache, not from memory (on the host:
# a GPU takes the whole step at once)
CANDIDATE_BLOCK_BYTES = 1 << 20


def step_candidates(params: dict, cfg: model.Config, kv: KVCache, tokens, t, scores, k: int):
    """One decoding step and its candidates: each sentence's 2K best (hypothesis, token) pairs,
    as host lists ``(scores, flat ids into its K*V)``, and V. ``scores`` (n, K): the live
    hypotheses' (K = 1 on a first step, a row per sentence)."""
    logits = decode.step(params, cfg, kv, tokens, t)                                  # (R, V)
    n, vocab = scores.shape[0], logits.shape[1]
    candidates = logits.reshape(n, -1)                                                # (n, K*V)
    best = min(2 * k, candidates.shape[1])
    per_block = n if backend.is_gpu() else max(1, CANDIDATE_BLOCK_BYTES // candidates[0].nbytes)
    maxima = []
    for first in range(0, n, per_block):
        part = slice(first, first + per_block)
        forbid_special(extend_scores(candidates[part].reshape(-1, vocab), scores[part]), cfg)
        maxima.append(group_maxima(candidates[part], best))
    maxima = None if maxima[0] is None else backend.xp.concatenate(maxima)
    top_scores, top_ids = top_k(candidates, best, maxima=maxima)                      # (n, 2K)
    top_scores, top_ids = (a.tolist() for a in backend.to_host_together(top_scores, top_ids))
    return top_scores, top_ids, vocab


def beam_search(params: dict, cfg: model.Config, src, beam: int = 4, alpha: float = 0.6,
                max_len: int | None = None, nbest: int = 1, *, lenpen_form: str = "gnmt",
                stopping: str = "auto") -> list[list[Hypothesis]]:
    """Beam search for each sentence of ``src`` (B, S): its ``nbest`` best hypotheses.

    Each hypothesis is ``(tokens, score)``: token ids without BOS and EOS, and
    log P(tokens, EOS | src) / lp, lp of the form ``lenpen_form`` with exponent ``alpha``. A
    hypothesis stopped by the length limit has no EOS and its score has no EOS term.
    ``stopping``: when a sentence is done, "exact", "first-k" or "auto" (the one of the two that
    did best on validation at such a penalty). See the module docstring.
    """
    check_search(beam, alpha, nbest, lenpen_form, stopping)
    xp = backend.xp
    src, host_src = prepare_source(params, cfg, src)
    limits = output_limits(host_src, cfg, max_len)
    kv = init_kv_cache(params, cfg, src, beam=beam, capacity=max(limits))
    k = beam
    found = Finished(len(limits), k, alpha, nbest, lenpen_form, stopping, cfg.eos_id)
    found.set_limits(range(len(limits)), limits)
    active = list(range(len(limits)))                    # the sentence of each group of K rows
    prefixes: list[list[int]] = [[] for _ in range(len(active) * k)]   # one per cache row
    tokens = xp.full((len(active),), cfg.bos_id, dtype=xp.int64)       # (R,): first step, BOS
    scores = xp.zeros((len(active), 1), dtype=kv.src_mask.dtype)       # (n, live per sentence)

    for t in range(max(limits)):
        top_scores, top_ids, vocab = step_candidates(
            params, cfg, first_rows(kv, k) if t == 0 else kv, tokens, t, scores, k)
        going_on = {}                                   # group -> (sentence, its K live)
        for i, s in enumerate(active):
            live = found.advance(s, t, top_scores[i], top_ids[i], vocab, i * k, prefixes)
            if live is not None:
                going_on[i] = s, live
        if not going_on:
            break
        order = groups_in_place(list(going_on))
        beams = [hyp for i in order for hyp in going_on[i][1]]   # (parent row, token, score)
        kv = reorder(kv, [parent for parent, _, _ in beams], filled=t + 1)
        active = [going_on[i][0] for i in order]
        prefixes = [prefixes[parent] + [token] for parent, token, _ in beams]
        tokens = int_array([token for _, token, _ in beams])
        scores = xp.asarray([score for _, _, score in beams],
                            dtype=scores.dtype).reshape(len(active), k)

    return [found.results(s) for s in range(len(limits))]
