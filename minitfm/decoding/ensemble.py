"""Several translators decoding as one: an ensemble for greedy and beam search.

Models trained apart (another seed, another recipe) make different errors; decoding with all of
them at once, each step's next-token distribution the mean of theirs, is more accurate than any
one (Multi30k: two 60-minute ``small`` models, 41.40 and 41.56 BLEU on validation alone, 42.52
together; docs: *Recipes and results*). Averaging checkpoints of one run
(:mod:`minitfm.averaging`) costs nothing at decoding time but gains only within one run; an
ensemble of N models costs N times the decoding work.

The mean is of probabilities, as fairseq's ensembles take it:

    log p(y | prefix, x) = log( (1/N) sum_i p_i(y | prefix, x) )
                         = logsumexp_i( log_softmax(z_i)[y] ) - log N

with z_i model i's logits. It is a distribution already, so beam search's log-softmax of it
(``beam.extend_scores``) changes nothing but rounding, and greedy's argmax takes its most
probable token.

How it plugs in: an :class:`Ensemble` stands where the parameters stand, with :attr:`cfg` where
the config stands (``beam_search(ens, ens.cfg, src)``). Its key/value cache is one
:class:`decode.KVCache` whose per-layer lists hold every member's layers, one member after the
other, and whose ``projection`` is the tuple of the members' output projections; reordering,
dropping and widening rows treat every layer alike, so they work on it unchanged. Only
encoding (``decode.init_kv_cache``, ``batched.admit``), the step (``decode.step``) and the
source check ask the ensemble, which runs each member on its part of the cache.

The members must share the vocabulary and its special ids (the same sentencepiece model: see
``translation.load_translators``); their sizes may differ. The output limit is the smallest
``max_len`` among them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from minitfm import backend
from minitfm.models import translator as model     # the model its members are

__all__ = ["Ensemble", "combine"]

SHARED_FIELDS = ("src_vocab", "tgt_vocab", "pad_id", "bos_id", "eos_id")


class Ensemble:
    """Translators ``members``, ``(params, cfg)`` each, decoding as one (see the module
    docstring); :attr:`cfg` is the config to pass beside it."""

    def __init__(self, members: Sequence[tuple[dict, model.Config]]):
        if not members:
            raise ValueError("an ensemble needs at least one model")
        first = members[0][1]
        for i, (_, cfg) in enumerate(members[1:], start=2):
            differing = [f"{name} {getattr(cfg, name)} (model 1: {getattr(first, name)})"
                         for name in SHARED_FIELDS if getattr(cfg, name) != getattr(first, name)]
            if differing:
                raise ValueError(f"model {i} of the ensemble does not share the first model's "
                                 f"vocabulary: {', '.join(differing)}. Ensemble models trained "
                                 f"with the same vocabulary")
        self.members = list(members)
        self.cfg = first.replace(max_len=min(cfg.max_len for _, cfg in members))
        ends = [0]
        for _, cfg in members:
            ends.append(ends[-1] + cfg.n_layers)
        self._layers = list(zip(ends[:-1], ends[1:]))    # each member's slice of the layers

    def __len__(self) -> int:
        return len(self.members)

    def check(self) -> None:
        """Each member's parameters fit its config."""
        for params, cfg in self.members:
            model.check_params(params, cfg)

    def part(self, kv, i: int):
        """Member ``i``'s cache: its layers of the ensemble's cache ``kv``, its projection."""
        a, b = self._layers[i]
        return dataclasses.replace(kv, self_k=kv.self_k[a:b], self_v=kv.self_v[a:b],
                                   cross_k=kv.cross_k[a:b], cross_v=kv.cross_v[a:b],
                                   projection=kv.projection[i])

    def joined(self, parts: Sequence):
        """One cache of the members' caches ``parts`` (their source masks are equal: the mask
        depends on the source alone)."""
        def every(name):
            return [array for kv in parts for array in getattr(kv, name)]
        return dataclasses.replace(parts[0], self_k=every("self_k"), self_v=every("self_v"),
                                   cross_k=every("cross_k"), cross_v=every("cross_v"),
                                   projection=tuple(kv.projection for kv in parts))

    def each(self, kv, run: Callable) -> list:
        """``run(params, cfg, member's cache)`` for every member, in order."""
        return [run(params, cfg, self.part(kv, i))
                for i, (params, cfg) in enumerate(self.members)]


def combine(logits: Sequence):
    """The ensemble's log-probabilities (R, V) from its members' logits (R, V) each: the log of
    the mean of their softmax distributions (see the module docstring)."""
    xp = backend.xp
    logs = []
    for z in logits:
        top = z.max(axis=1, keepdims=True)
        shifted = z - top
        logs.append(shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True)))  # log_softmax
    if len(logs) == 1:
        return logs[0]
    stacked = xp.stack(logs)                                          # (N, R, V)
    top = stacked.max(axis=0)
    return top + xp.log(xp.exp(stacked - top).mean(axis=0))     # logits are finite
