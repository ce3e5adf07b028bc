"""Beam search over many sentences: sorted by length, and decoded a batch at a time or, by
default, continuously, the places of ended sentences refilled with waiting ones.

:func:`translate_ids` sorts the sentences by length. Decoded a batch at a time
(:func:`beam_search`), each batch ends with a few sentences searching on towards the length
limit alone, on a few rows: such a step costs nearly as many array operations as a full one,
for little arithmetic. Continuous batching (:func:`continuous_search`, the default) fills the
places of ended sentences with waiting ones, encoded together once a quarter of the places are
free: the steps stay full, and the long searches run on few rows once, at the end (on
Multi30k's test2016, 1,000 sentences, 64 at a time: 278 steps instead of 621, the same
tokens). Sentences admitted together share a position, and each step feeds every run of rows
its own. Each sentence's search is the one :func:`beam_search` makes; only the rounding of its
scores may differ (its source is padded to the width of other sentences, its rows share
matrix products with others).

The search of each sentence is :mod:`minitfm.decoding.beam`'s; this module decides which sentences share
the cache, step by step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from minitfm import backend
from minitfm.decoding import decode     # decode.positions: each step's runs of rows
from minitfm.decoding.beam import (Finished, Hypothesis, beam_search, check_search, first_rows,
                                   groups_in_place, step_candidates)
from minitfm.decoding.decode import (KVCache, first_groups, int_array, output_limits,
                                     prepare_source, reorder, self_attention_buffers)
from minitfm.decoding.ensemble import Ensemble
from minitfm.layers.attention import MASKED
from minitfm.models import translator as model     # the model this module decodes

__all__ = ["pad_batch", "by_length", "length_batches", "translate_ids", "continuous_search"]


# ---- many sentences --------------------------------------------------------------------------

def pad_batch(sentences: Sequence[Sequence[int]], cfg: model.Config):
    """Source ids (B, S) on the active backend: each sentence, EOS, then padding."""
    if not sentences:
        raise ValueError("pad_batch needs at least one sentence")
    width = max(len(s) for s in sentences) + 1
    rows = [list(s) + [cfg.eos_id] + [cfg.pad_id] * (width - len(s) - 1) for s in sentences]
    return backend.xp.asarray(rows, dtype=backend.xp.int64)


def by_length(sentences: Sequence[Sequence[int] | None]) -> list[int]:
    """Indices of the sentences, shortest first; None entries skipped."""
    return sorted((i for i, s in enumerate(sentences) if s is not None),
                  key=lambda i: len(sentences[i]))


def length_batches(sentences: Sequence[Sequence[int] | None], batch_size: int
                   ) -> Iterator[list[int]]:
    """Indices of the sentences, shortest first, ``batch_size`` at a time; None entries skipped."""
    order = by_length(sentences)
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


def translate_ids(params: dict, cfg: model.Config, sentences: Sequence[Sequence[int]], *,
                  beam: int = 4, alpha: float = 0.6, max_len: int | None = None, nbest: int = 1,
                  batch_size: int = 64, lenpen_form: str = "gnmt", stopping: str = "auto",
                  continuous: bool = True) -> list[list[Hypothesis]]:
    """Beam search over many sentences (token ids without EOS, which is appended); None entries
    are skipped (their result is empty). Results come back in input order.

    Sentences are sorted by length, so a batch wastes little on padding. With ``continuous``
    (:func:`continuous_search`) at most ``batch_size`` sentences are decoded at once, and the
    places of those that end are refilled from the waiting ones; without, ``batch_size``
    sentences at a time, each batch to its end (:func:`beam_search`). Both search alike; the
    refilled batch stays full where a batch of its own would decode its last few sentences on
    a few rows, step after step.
    """
    check_search(beam, alpha, nbest, lenpen_form, stopping)
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
    if continuous:
        return continuous_search(params, cfg, sentences, beam, alpha, max_len, nbest,
                                 batch_size, lenpen_form=lenpen_form, stopping=stopping)
    results: list[list[Hypothesis]] = [[] for _ in sentences]
    for batch in length_batches(sentences, batch_size):
        src = pad_batch([sentences[i] for i in batch], cfg)
        found = beam_search(params, cfg, src, beam, alpha, max_len, nbest,
                            lenpen_form=lenpen_form, stopping=stopping)
        for i, hyps in zip(batch, found):
            results[i] = hyps
    return results


# ---- continuous batching ---------------------------------------------------------------------

def continuous_search(params: dict, cfg: model.Config, sentences: Sequence[Sequence[int] | None],
                      beam: int = 4, alpha: float = 0.6, max_len: int | None = None,
                      nbest: int = 1, batch_size: int = 64, *, lenpen_form: str = "gnmt",
                      stopping: str = "auto") -> list[list[Hypothesis]]:
    """:func:`beam_search` over many sentences (None entries skipped), at most ``batch_size``
    of them in the cache at once, shortest first: when a quarter of the places are free (or all
    the sentences still waiting fit), the next waiting sentences are encoded into them and start
    their search while the others go on (continuous batching; see the module docstring).

    The sentences admitted together stand at one position, step after step: the groups of
    rows are kept in runs of one position, the oldest first (:func:`groups_in_place`), and each
    run attends over its own slots as a step of its own would (``decode.positions``); the
    matrix products run on all rows at once. The cross-attention arrays are as wide as the
    longest source in the cache, the rest of a shorter one masked. The sentences admitted at a
    step make their first step apart, on the first of their K rows alone (from BOS, the K rows
    would be alike), as :func:`beam_search`'s first step does; the cache then copies that row's
    keys and values to the other K - 1.
    """
    check_search(beam, alpha, nbest, lenpen_form, stopping)
    waiting = by_length(sentences)[::-1]                 # pop() takes the shortest
    found = Finished(len(sentences), beam, alpha, nbest, lenpen_form, stopping, cfg.eos_id)
    if not waiting:
        return [[] for _ in sentences]
    longest = prepare_source(params, cfg, pad_batch([sentences[waiting[0]]], cfg))[1]
    full = empty_cache(params, cfg, batch_size, beam, output_limits(longest, cfg, max_len)[0])
    k, xp, dtype = beam, backend.xp, full.src_mask.dtype
    active, at = [], []                                  # each group's sentence and position
    prefixes, tokens, scores = [], [], []                # each row's
    while waiting or active:
        new = admitted(waiting, len(active), batch_size)
        if new:
            src, host_src = prepare_source(params, cfg, pad_batch([sentences[i] for i in new],
                                                                  cfg))
            found.set_limits(new, output_limits(host_src, cfg, max_len))
            full = admit(params, cfg, full, len(active), src)
        top_scores, top_ids, vocab = [], [], None
        if active:                                       # the sentences under way: K rows each
            top_scores, top_ids, vocab = step_candidates(
                params, cfg, first_groups(full, len(active)), int_array(tokens),
                decode.positions(at, k),
                xp.asarray(scores, dtype=dtype).reshape(len(active), k), k)
        if new:
            new_scores, new_ids, vocab = first_step(params, cfg, full, len(active), len(new), k)
            top_scores, top_ids = top_scores + new_scores, top_ids + new_ids
            active, at = active + new, at + [0] * len(new)
            prefixes += [[] for _ in range(len(new) * k)]
        going_on = {}                                   # group -> (sentence, its K live)
        for i, s in enumerate(active):
            live = found.advance(s, at[i], top_scores[i], top_ids[i], vocab, i * k, prefixes)
            if live is not None:
                going_on[i] = s, live
        order = groups_in_place(list(going_on), at)
        beams = [hyp for i in order for hyp in going_on[i][1]]   # (parent row, token, score)
        reorder(first_groups(full, len(active)), [parent for parent, _, _ in beams],  # in place
                filled=[at[i] + 1 for i in order for _ in range(k)])
        active, at = [going_on[i][0] for i in order], [at[i] + 1 for i in order]
        prefixes = [prefixes[parent] + [token] for parent, token, _ in beams]
        tokens = [token for _, token, _ in beams]
        scores = [score for _, _, score in beams]
    return [found.results(s) for s in range(len(sentences))]


def admitted(waiting: list[int], active: int, batch_size: int) -> list[int]:
    """The sentences taken from ``waiting`` (its last, the shortest, first) into the places
    that ``active`` groups leave free: once a quarter of the places are free, or all the
    sentences still waiting fit; else none."""
    free = batch_size - active
    if waiting and free >= min(max(1, batch_size // 4), len(waiting)):
        return [waiting.pop() for _ in range(min(free, len(waiting)))]
    return []


def first_step(params: dict, cfg: model.Config, full: KVCache, first: int, count: int,
               beam: int):
    """The first step of the ``count`` sentences just admitted into groups ``first`` ..
    ``first`` + count - 1, on the first of each group's rows alone (from BOS, its K rows would
    be alike), as :func:`beam_search`'s first step: their candidates, as ``step_candidates``
    gives them."""
    xp = backend.xp
    kv = first_rows(decode.groups(full, first, first + count), beam)
    return step_candidates(params, cfg, kv, xp.full((count,), cfg.bos_id, dtype=xp.int64), 0,
                           xp.zeros((count, 1), dtype=full.src_mask.dtype), beam)


def empty_cache(params: dict, cfg: model.Config, groups: int, beam: int, capacity: int
                ) -> KVCache:
    """A cache for ``groups`` sentences of ``beam`` rows with room for ``capacity`` positions,
    holding no sentence yet: cross-attention arrays of no width (:func:`admit` widens them).
    The self-attention buffers start empty: a run of rows reads only the slots it wrote."""
    if isinstance(params, Ensemble):     # every member's layers in one cache
        return params.joined([empty_cache(p, c, groups, beam, capacity) for p, c in params.members])
    xp = backend.xp
    projection = model.output_projection(params, cfg)
    d_k, dtype = cfg.d_model // cfg.n_heads, projection.dtype
    self_k, self_v = self_attention_buffers(cfg, groups * beam, capacity, dtype)
    cross = [xp.zeros((groups, cfg.n_heads, 0, d_k), dtype=dtype)
             for _ in range(2 * cfg.n_layers)]
    return KVCache(self_k=self_k, self_v=self_v,
                   cross_k=cross[:cfg.n_layers], cross_v=cross[cfg.n_layers:],
                   src_mask=xp.zeros((groups, 1, 1, 0), dtype=dtype), projection=projection)


def admit(params: dict, cfg: model.Config, full: KVCache, first: int, src) -> KVCache:
    """``full`` with the sentences of ``src`` (m, S) encoded into its groups ``first`` ..
    ``first`` + m - 1: their cross-attention keys, values and mask (masked beyond S, where an
    earlier sentence's keys and values stay: finite, so a masked score is still -1e9); the
    cross-attention arrays widened to S where they are narrower."""
    if isinstance(params, Ensemble):
        return params.joined(params.each(full, lambda p, c, part: admit(p, c, part, first, src)))
    memory, mask, _ = model.encoder_forward(params, cfg, src)          # (m, S, d), (m, 1, 1, S)
    cross_k, cross_v = model.cross_kv(params, cfg, memory)            # (m, H, S, d_k) per layer
    m, width = mask.shape[0], mask.shape[-1]
    if width > full.src_mask.shape[-1]:
        full = widened(full, width)
    new = slice(first, first + m)
    for array, part in zip(full.cross_k + full.cross_v, cross_k + cross_v):
        array[new, :, :width] = part
    full.src_mask[new] = MASKED
    full.src_mask[new, :, :, :width] = mask
    return full


def widened(kv: KVCache, width: int) -> KVCache:
    """``kv`` with cross-attention arrays ``width`` source positions wide, the new ones masked."""
    xp = backend.xp
    old = kv.src_mask.shape[-1]

    def wider(array):                                                  # (n, H, S, d_k)
        out = xp.zeros((*array.shape[:2], width, array.shape[3]), dtype=array.dtype)
        out[:, :, :old] = array
        return out

    mask = xp.full((*kv.src_mask.shape[:3], width), MASKED, dtype=kv.src_mask.dtype)
    mask[..., :old] = kv.src_mask
    return dataclasses.replace(kv, cross_k=[wider(a) for a in kv.cross_k],
                               cross_v=[wider(a) for a in kv.cross_v], src_mask=mask)
