"""Greedy decoding over a key/value cache, and the pieces beam search shares with it.

The paper's settings (section 6.1): "we used beam search with a beam size of 4 and length
penalty alpha = 0.6 [...] We set the maximum output length during inference to input length +
50, but terminate early when possible." The output limit is here (:func:`output_limits`); beam
search and its length penalties are in :mod:`minitfm.decoding.beam`, which builds on this module.

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

Beam search, and decoding many sentences in batches by length, are in :mod:`minitfm.decoding.beam`.

Outputs are lists of token ids without BOS and EOS. Hypothesis bookkeeping (prefixes, finished
lists) is host-side Python; the array work goes through ``backend.xp``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
import dataclasses
from dataclasses import dataclass

from minitfm import backend
from minitfm.decoding.ensemble import Ensemble, combine
from minitfm.layers.positional import Positions
from minitfm.models import translator as model     # the model this module decodes

__all__ = ["EXTRA_LENGTH", "KVCache", "init_kv_cache", "self_attention_buffers", "step",
           "positions", "reorder", "first_groups", "groups", "output_limits", "prepare_source",
           "forbid_special", "int_array", "greedy"]

EXTRA_LENGTH = 50   # maximum output length = source length + 50 (section 6.1)

# ---- the key/value cache ---------------------------------------------------------------------

@dataclass
class KVCache:
    """Per-layer keys and values for incremental decoding; axis 0 of every array is the row.

    self_k, self_v    one (R, H, L, d_k) buffer per layer, a row per hypothesis; slots < t are
                      filled at step t
    cross_k, cross_v  one (n, H, S, d_k) array per layer, a row per sentence, from the encoder
                      output: the R / n consecutive rows of its hypotheses share it
    src_mask          (n, 1, 1, S) additive mask of the padded source positions
    projection        (d, V) the output projection, contiguous (``model.output_projection``)
    """

    self_k: list
    self_v: list
    cross_k: list
    cross_v: list
    src_mask: object
    projection: object

    @property
    def rows(self) -> int:
        return int(self.self_k[0].shape[0])

    @property
    def sentences(self) -> int:
        return int(self.src_mask.shape[0])

    @property
    def capacity(self) -> int:
        """How many positions the self-attention buffers hold."""
        return int(self.self_k[0].shape[2])


def init_kv_cache(params: dict, cfg: model.Config, src, beam: int = 1,
                  capacity: int | None = None) -> KVCache:
    """Encode ``src`` (B, S) and return a cache of B*beam rows (``beam`` rows per sentence, which
    share its encoder output) with room for ``capacity`` decoding steps (default
    ``cfg.max_len``). The self-attention buffers start empty, not zeroed: no step reads a slot
    before writing it."""
    capacity = cfg.max_len if capacity is None else capacity
    if not 1 <= capacity <= cfg.max_len:
        raise ValueError(f"cache capacity must be in [1, Config.max_len={cfg.max_len}], "
                         f"got {capacity}")
    if isinstance(params, Ensemble):     # every member's layers in one cache
        return params.joined([init_kv_cache(p, c, src, beam, capacity) for p, c in params.members])
    memory, src_mask, _ = model.encoder_forward(params, cfg, src)     # (B, S, d), (B, 1, 1, S)
    cross_k, cross_v = model.cross_kv(params, cfg, memory)            # (B, H, S, d_k) per layer
    self_k, self_v = self_attention_buffers(cfg, memory.shape[0] * beam, capacity, memory.dtype)
    return KVCache(self_k=self_k, self_v=self_v, cross_k=cross_k, cross_v=cross_v,
                   src_mask=src_mask, projection=model.output_projection(params, cfg))


def self_attention_buffers(cfg: model.Config, rows: int, capacity: int, dtype
                           ) -> tuple[list, list]:
    """Every layer's self-attention keys and values for ``rows`` rows and ``capacity``
    positions, (rows, H, capacity, d_k) each, empty (not zeroed)."""
    xp, d_k = backend.xp, cfg.d_model // cfg.n_heads
    buffers = [xp.empty((rows, cfg.n_heads, capacity, d_k), dtype=dtype)
               for _ in range(2 * cfg.n_layers)]
    return buffers[:cfg.n_layers], buffers[cfg.n_layers:]


def reorder(kv: KVCache, rows: Sequence[int], filled: int | Sequence[int]) -> KVCache:
    """The cache whose row j is row ``rows[j]`` of ``kv``; only slots < ``filled`` are copied
    (or < ``filled[j]``, one count for each new row j, for rows at different positions).

    Works in place: only the rows that change are copied (typically fewer than half of the
    beams change parent), and fewer rows (sentences leaving the batch) become a view of the
    first ones, so no buffer is ever reallocated. ``rows`` keeps the rows of a sentence together,
    as many as before, each within its sentence (beams move only within their sentence): the
    cross-attention arrays, a row per sentence, then change only when sentences leave.
    """
    n, group = len(rows), kv.rows // kv.sentences                   # group: rows per sentence
    moved = [j for j, r in enumerate(rows) if r != j]
    slots = [filled] * n if isinstance(filled, int) else filled
    for used, same in itertools.groupby(moved, key=lambda j: slots[j]):
        same = list(same)
        dst, src = int_array(same), int_array([rows[j] for j in same])
        for buf in kv.self_k + kv.self_v:
            buf[dst, :, :used] = buf[src, :, :used]                   # (moved, H, used, d_k)
    if n == kv.rows:
        return kv
    sentences = [rows[j] // group for j in range(0, n, group)]       # each new sentence's old one
    moved = [i for i, s in enumerate(sentences) if s != i]
    if moved:
        dst, src = int_array(moved), int_array([sentences[i] for i in moved])
        for array in kv.cross_k + kv.cross_v + [kv.src_mask]:
            array[dst] = array[src]
    return first_groups(kv, len(sentences))


def first_groups(kv: KVCache, m: int) -> KVCache:
    """The views of ``kv``'s first ``m`` groups of rows (one group per sentence)."""
    return groups(kv, 0, m)


def groups(kv: KVCache, first: int, end: int) -> KVCache:
    """The views of ``kv``'s groups of rows ``first`` .. ``end`` - 1 (one group per sentence)."""
    group = kv.rows // kv.sentences
    rows, sentences = slice(first * group, end * group), slice(first, end)
    return dataclasses.replace(
        kv, self_k=[b[rows] for b in kv.self_k], self_v=[b[rows] for b in kv.self_v],
        cross_k=[k[sentences] for k in kv.cross_k], cross_v=[v[sentences] for v in kv.cross_v],
        src_mask=kv.src_mask[sentences])


# ---- one decoding step -----------------------------------------------------------------------

def step(params: dict, cfg: model.Config, kv: KVCache, tokens, t):
    """Feed ``tokens`` (R,), the decoder inputs at position t, and return the logits (R, V) of
    the tokens at position t + 1. Writes slot t of the cache's self-attention buffers. ``t``: an
    integer, or :func:`positions` for rows at different positions. For an ensemble
    (:mod:`minitfm.decoding.ensemble`), its log-probabilities (R, V) in place of logits."""
    last = t.end - 1 if isinstance(t, Positions) else t
    if last >= kv.capacity:
        raise ValueError(f"decoding step {last} is past the cache capacity {kv.capacity}")
    if isinstance(params, Ensemble):     # log-probabilities: the mean of the members' softmax
        return combine(params.each(kv, lambda p, c, part: step(p, c, part, tokens, t)))
    h = model.decoder_step(params, cfg, tokens, t, kv.self_k, kv.self_v,
                           kv.cross_k, kv.cross_v, kv.src_mask)                # (R, d)
    return model.logits(params, cfg, h, kv.projection)                          # (R, V)


def positions(at: Sequence[int], group: int = 1) -> Positions:
    """The positions of a step whose rows stand at different positions: ``at`` has one for each
    ``group`` consecutive rows (a sentence's beams). Rows at one position should lie together:
    each run of them attends as a step of its own (``attention.self_step``)."""
    runs, first = [], 0
    for u, same in itertools.groupby(at):
        end = first + group * len(list(same))
        runs.append((first, end, u))
        first = end
    return Positions(int_array([u for u in at for _ in range(group)]), tuple(runs))


# ---- search helpers --------------------------------------------------------------------------

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


def prepare_source(params: dict, cfg: model.Config, src):
    """``(src on the device, src on the host)``: the ids are checked, and the output limits are
    counted, on the host (a host array costs no wait for the device; a device array one copy).
    ``params`` may be an :class:`~minitfm.decoding.ensemble.Ensemble`, ``cfg`` its ``cfg``."""
    if isinstance(params, Ensemble):
        params.check()
    else:
        model.check_params(params, cfg)
    src = model.check_tokens(backend.host_copy(src, "src"), "src", cfg.src_vocab, cfg, host=True)
    return backend.to_device(src), src


def forbid_special(scores, cfg: model.Config):
    """Padding and BOS are never generated: fed back, padding would be masked as a key."""
    scores[:, cfg.pad_id] = -math.inf
    scores[:, cfg.bos_id] = -math.inf
    return scores


def int_array(values: Sequence[int]):
    xp = backend.xp
    return xp.asarray(list(values), dtype=xp.int64)


# ---- greedy decoding -------------------------------------------------------------------------

def greedy(params: dict, cfg: model.Config, src, max_len: int | None = None) -> list[list[int]]:
    """The most probable next token at every step, for each sentence of ``src`` (B, S).

    Stops a sentence at EOS or after its maximum number of output tokens (see
    :func:`output_limits`). Returns the token ids of each sentence, without BOS and EOS.
    """
    src, host_src = prepare_source(params, cfg, src)
    limits = output_limits(host_src, cfg, max_len)
    kv = init_kv_cache(params, cfg, src, beam=1, capacity=max(limits))
    outputs: list[list[int]] = [[] for _ in limits]
    active = list(range(len(limits)))                       # the sentence of each cache row
    tokens = backend.xp.full((len(active),), cfg.bos_id, dtype=backend.xp.int64)   # (R,)
    for t in range(max(limits)):
        logits = forbid_special(step(params, cfg, kv, tokens, t), cfg)             # (R, V)
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
            tokens = tokens[int_array(keep)]
            active = [active[r] for r in keep]
    return outputs
