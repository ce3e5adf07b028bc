"""Batches of sentence pairs: by token count for training, fixed-size and in order for evaluation.

The paper (section 5.1): "Sentence pairs were batched together by approximate sequence length.
Each training batch contained a set of sentence pairs containing approximately 25000 source
tokens and 25000 target tokens."

A batch is a pair of int32 arrays padded on the right with ``PAD_ID``:

    src  (B, S)      source ids, then EOS                  S     = max source length + 1
    tgt  (B, T + 1)  BOS, target ids, then EOS             T + 1 = max target length + 2

The model feeds ``tgt[:, :-1]`` to the decoder and predicts ``tgt[:, 1:]``.

Training batches (:func:`token_batches`, fairseq's ``--max-tokens``): pairs are sorted by length
so that each batch holds pairs of similar length and padding stays small, then packed greedily so
that a batch's size, ``B * max(S, T + 1)``, is at most ``max_tokens``. Sorting breaks ties in a
random order and the batches are shuffled, both from ``numpy.random.default_rng([seed, epoch])``:
the same (seed, epoch) always gives the same batches, and each epoch gives different ones.

Pairs longer than ``max_positions`` (``S > max_positions`` or ``T + 1 > max_positions``, the
lengths the encoder and decoder see) are *dropped* from training and counted: a truncated target
would no longer be a translation of its source. Evaluation (:func:`eval_batches`) must see every
sentence, so there they are *truncated* instead, and counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from minitfm.ids import BOS_ID, EOS_ID, PAD_ID

from .encoded import EncodedCorpus
from .reading import DataError
from .vocab import Vocab

__all__ = ["BatchPlan", "token_batches", "eval_batches", "collate", "iterate_batches",
           "epoch_batches", "eval_arrays", "SubwordDropout"]


@dataclass
class BatchPlan:
    """The batches of one pass over a corpus, as arrays of sentence indices, in iteration order."""

    batches: list[np.ndarray]
    max_positions: int | None  # collate truncates to this (eval plans), or None
    real_tokens: int           # non-pad entries of all src and tgt arrays (EOS/BOS included)
    padded_tokens: int         # all entries of all src and tgt arrays
    dropped: int = 0           # training: pairs over max_positions, left out
    truncated: int = 0         # evaluation: pairs over max_positions, cut

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.batches)

    @property
    def num_sentences(self) -> int:
        return sum(len(batch) for batch in self.batches)

    @property
    def padding_efficiency(self) -> float:
        """Fraction of array entries that are real tokens rather than padding."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0

    def summary(self) -> str:
        text = (f"{len(self)} batches of {self.num_sentences} sentence pairs, "
                f"padding efficiency {100 * self.padding_efficiency:.1f}%")
        if self.dropped:
            text += f", {self.dropped} pairs over {self.max_positions} positions dropped"
        if self.truncated:
            text += f", {self.truncated} pairs truncated to {self.max_positions} positions"
        return text


def token_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, *,
                  seed: int, epoch: int, max_positions: int | None = None,
                  max_sentences: int | None = None) -> BatchPlan:
    """Length-bucketed training batches of at most ``max_tokens`` padded entries each.

    ``src_lengths`` / ``tgt_lengths`` are token counts without EOS/BOS (``EncodedCorpus``'s).
    ``max_sentences`` optionally caps the pairs per batch as well.
    """
    src_lengths, tgt_lengths = _check_lengths(src_lengths, tgt_lengths)
    if max_sentences is not None and max_sentences < 1:
        raise DataError(f"max_sentences must be at least 1, got {max_sentences}")
    src_size, tgt_size = src_lengths + 1, tgt_lengths + 2  # (n,) entries of src and tgt rows
    fits = _fits(src_lengths, tgt_lengths, max_positions)
    size = np.maximum(src_size, tgt_size)  # (n,) entries a pair costs per batch row
    _check_max_tokens(size[fits], max_tokens)

    rng = np.random.default_rng([seed, epoch])
    shuffled = rng.permutation(np.flatnonzero(fits))
    # stable sort: by row size, then by the shorter side; ties stay in the random order
    order = shuffled[np.lexsort((np.minimum(src_size, tgt_size)[shuffled], size[shuffled]))]
    starts = _pack(size[order], max_tokens, max_sentences)
    plan = _make_plan(order, starts, src_size, tgt_size, max_positions)
    plan.batches = [plan.batches[i] for i in rng.permutation(len(plan.batches))]
    plan.dropped = int(np.count_nonzero(~fits))
    return plan


def eval_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, batch_size: int, *,
                 max_positions: int | None = None, sort_by_length: bool = False) -> BatchPlan:
    """Batches of ``batch_size`` consecutive pairs covering every pair once.

    In corpus order by default; with ``sort_by_length`` ordered by source length (less padding
    in decoding); either way each batch's indices say where its outputs go.
    """
    src_lengths, tgt_lengths = _check_lengths(src_lengths, tgt_lengths)
    if batch_size < 1:
        raise DataError(f"batch_size must be at least 1, got {batch_size}")
    truncated = 0
    if max_positions is not None:
        _check_max_positions(max_positions)
        over = (src_lengths + 1 > max_positions) | (tgt_lengths + 1 > max_positions)
        truncated = int(np.count_nonzero(over))
        src_lengths = np.minimum(src_lengths, max_positions - 1)
        tgt_lengths = np.minimum(tgt_lengths, max_positions - 1)
    n = len(src_lengths)
    order = np.argsort(src_lengths, kind="stable") if sort_by_length else np.arange(n)
    plan = _make_plan(order, np.arange(0, n, batch_size), src_lengths + 1, tgt_lengths + 2,
                      max_positions)
    plan.truncated = truncated
    return plan


def collate(corpus: EncodedCorpus, indices: np.ndarray, *,
            max_positions: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The padded ``(src, tgt)`` arrays of pairs ``indices``; see the module docstring.

    With ``max_positions``, longer sentences are cut so that ``S`` and ``T`` fit; the cut
    sentence still ends with EOS.
    """
    indices = np.asarray(indices, dtype=np.int64)
    if indices.ndim != 1 or len(indices) == 0:
        raise DataError(f"collate needs a non-empty 1-D array of indices, got shape "
                        f"{indices.shape}")
    src_len, tgt_len = corpus.src_lengths[indices], corpus.tgt_lengths[indices]  # (B,)
    if max_positions is not None:
        _check_max_positions(max_positions)
        src_len = np.minimum(src_len, max_positions - 1)
        tgt_len = np.minimum(tgt_len, max_positions - 1)
    rows = np.arange(len(indices))
    src = np.full((len(indices), int(src_len.max()) + 1), PAD_ID, dtype=np.int32)  # (B, S)
    tgt = np.full((len(indices), int(tgt_len.max()) + 2), PAD_ID, dtype=np.int32)  # (B, T + 1)
    _gather(src[:, :-1], corpus.src_tokens, corpus.src_offsets[indices], src_len)
    _gather(tgt[:, 1:-1], corpus.tgt_tokens, corpus.tgt_offsets[indices], tgt_len)
    src[rows, src_len] = EOS_ID
    tgt[:, 0] = BOS_ID
    tgt[rows, tgt_len + 1] = EOS_ID
    return src, tgt


def iterate_batches(corpus: EncodedCorpus, plan: BatchPlan
                    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Yield ``(indices, src, tgt)`` for every batch of ``plan``, in order."""
    for indices in plan.batches:
        src, tgt = collate(corpus, indices, max_positions=plan.max_positions)
        yield indices, src, tgt


def epoch_batches(corpus: EncodedCorpus, max_tokens: int, *, seed: int,
                  max_positions: int | None = None,
                  subword_dropout: SubwordDropout | None = None
                  ) -> Callable[[int], Iterator[tuple]]:
    """``batches(epoch)`` for ``minitfm.training.loop.train``: the padded ``(src, tgt)`` arrays of the
    token-count batches of ``epoch`` (:func:`token_batches` from ``seed`` and the epoch).

    With ``subword_dropout``, once it is started, the same batches hold the same pairs, each
    segmented anew (:meth:`SubwordDropout.collate`)."""
    def batches(epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        plan = token_batches(corpus.src_lengths, corpus.tgt_lengths, max_tokens, seed=seed,
                             epoch=epoch, max_positions=max_positions)
        for indices in plan:
            if subword_dropout is not None and subword_dropout.started:
                yield subword_dropout.collate(corpus, indices, max_positions=max_positions)
            else:
                yield collate(corpus, indices)
    return batches


class SubwordDropout:
    """BPE-dropout (Provilkov et al., 2020): every time a training pair is batched, both of its
    sides are segmented anew, each BPE merge skipped with probability ``rate``.

    The model sees the same sentence in different pieces from epoch to epoch, a regulariser for
    small corpora. It needs the text of the pairs in memory, ``src_texts[i]`` / ``tgt_texts[i]``
    being pair i of the encoded corpus (cleaned as it was). The batches stay those planned from
    the usual segmentation, the same on every worker of a run; a sampled segmentation is longer,
    so a batch holds more tokens than ``max_tokens`` (Multi30k with 8k pieces: about 20% more at
    rate 0.05, 40% at 0.1). A pair whose sample does not fit ``max_positions`` keeps its usual
    segmentation. The samples come from sentencepiece's generator, so a run with BPE-dropout
    cannot be repeated exactly.

    Nothing is sampled until :meth:`start` (a run's late dropout calls it when dropout starts).
    """

    def __init__(self, vocab: Vocab, rate: float, src_texts: Sequence[str],
                 tgt_texts: Sequence[str]):
        if not 0.0 < rate < 1.0:
            raise DataError(f"subword dropout rate must be in (0, 1), got {rate}")
        if len(src_texts) != len(tgt_texts):
            raise DataError(f"subword dropout: {len(src_texts)} source but {len(tgt_texts)} "
                            "target texts; the two sides must be aligned")
        self.vocab, self.rate = vocab, rate
        self.src_texts, self.tgt_texts = list(src_texts), list(tgt_texts)
        self.started = False

    def start(self) -> None:
        self.started = True

    def check_matches(self, corpus: EncodedCorpus) -> None:
        """Raise unless the texts are as many as the corpus's pairs."""
        if len(self.src_texts) != len(corpus):
            raise DataError(f"subword dropout has the text of {len(self.src_texts)} pairs, but "
                            f"the encoded corpus holds {len(corpus)}: the texts must be the "
                            "corpus's pairs, cleaned the same way, in the same order")

    def collate(self, corpus: EncodedCorpus, indices: np.ndarray, *,
                max_positions: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The padded ``(src, tgt)`` arrays of pairs ``indices`` of ``corpus``, as
        :func:`collate` lays them out, both sides segmented with BPE-dropout."""
        indices = np.asarray(indices, dtype=np.int64)
        src = self.vocab.encode([self.src_texts[i] for i in indices], dropout=self.rate)
        tgt = self.vocab.encode([self.tgt_texts[i] for i in indices], dropout=self.rate)
        lengths = [np.fromiter(map(len, side), dtype=np.int64, count=len(side))
                   for side in (src, tgt)]
        for row in np.flatnonzero(~_fits(*lengths, max_positions)).tolist():
            src[row], tgt[row] = (side.tolist() for side in corpus[int(indices[row])])
        return collate(EncodedCorpus.from_ids(src, tgt), np.arange(len(indices)))


def eval_arrays(corpus: EncodedCorpus, batch_size: int, *,
                max_positions: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every pair of ``corpus`` once, as padded ``(src, tgt)`` arrays of ``batch_size`` pairs
    ordered by source length, over-long sentences truncated (a validation set in memory)."""
    plan = eval_batches(corpus.src_lengths, corpus.tgt_lengths, batch_size,
                        max_positions=max_positions, sort_by_length=True)
    return [collate(corpus, indices, max_positions=max_positions) for indices in plan]


# ----------------------------------------------------------------------------- helpers

def _check_lengths(src_lengths: np.ndarray,
                   tgt_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    src_lengths = np.asarray(src_lengths, dtype=np.int64)
    tgt_lengths = np.asarray(tgt_lengths, dtype=np.int64)
    if src_lengths.shape != tgt_lengths.shape or src_lengths.ndim != 1:
        raise DataError(f"source and target lengths must be 1-D and of equal size, got "
                        f"{src_lengths.shape} and {tgt_lengths.shape}")
    return src_lengths, tgt_lengths


def _fits(src_lengths: np.ndarray, tgt_lengths: np.ndarray,
          max_positions: int | None) -> np.ndarray:
    """(n,) bool: which pairs (lengths without EOS/BOS) fit ``max_positions`` for training: the
    source with EOS, and the target with BOS or EOS (what the decoder reads or predicts)."""
    if max_positions is None:
        return np.ones(len(src_lengths), dtype=bool)
    _check_max_positions(max_positions)
    return (src_lengths + 1 <= max_positions) & (tgt_lengths + 1 <= max_positions)


def _check_max_positions(max_positions: int) -> None:
    if max_positions < 2:
        raise DataError(f"max_positions must be at least 2 (a token and EOS), got {max_positions}")


def _check_max_tokens(size: np.ndarray, max_tokens: int) -> None:
    largest = int(size.max()) if len(size) else 0
    if largest > max_tokens:
        raise DataError(
            f"max_tokens={max_tokens} cannot hold the longest sentence pair, which alone needs "
            f"{largest} entries (longest side + BOS/EOS); raise max_tokens or set max_positions "
            "to drop such pairs")


def _pack(size: np.ndarray, max_tokens: int, max_sentences: int | None) -> np.ndarray:
    """Start positions of greedy batches over rows sorted by ascending ``size``.

    A batch whose largest row size is L holds at most ``max_tokens // L`` rows. Working run by run
    of equal sizes (hundreds of runs, not millions of rows): the open batch first closes if it
    cannot take even one row of the new size, then fills up to the new capacity, and whole
    batches of the new size follow.
    """
    if len(size) == 0:
        return np.zeros(0, dtype=np.int64)
    values, firsts, counts = np.unique(size, return_index=True, return_counts=True)
    starts, start = [0], 0
    for value, first, count in zip(values.tolist(), firsts.tolist(), counts.tolist()):
        capacity = max_tokens // value
        if max_sentences is not None:
            capacity = min(capacity, max_sentences)
        if first - start > capacity:  # it holds too many rows for the new size
            start = first
            starts.append(start)
        while first + count - start > capacity:
            start += capacity
            starts.append(start)
    return np.asarray(starts, dtype=np.int64)


def _make_plan(order: np.ndarray, starts: np.ndarray, src_size: np.ndarray, tgt_size: np.ndarray,
               max_positions: int | None) -> BatchPlan:
    """Split ``order`` at ``starts`` into batches and count their real and padded entries."""
    if len(order) == 0:
        return BatchPlan([], max_positions, 0, 0)
    rows = np.diff(np.append(starts, len(order)))  # (n_batches,) pairs per batch
    src_sorted, tgt_sorted = src_size[order], tgt_size[order]
    widths = np.maximum.reduceat(src_sorted, starts) + np.maximum.reduceat(tgt_sorted, starts)
    padded = rows * widths  # (n_batches,) entries of src and tgt together
    real = int(src_sorted.sum() + tgt_sorted.sum())
    return BatchPlan(np.split(order, starts[1:]), max_positions, real, int(padded.sum()))


def _gather(out: np.ndarray, tokens: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> None:
    """Copy sentence i, ``tokens[offsets[i]:offsets[i] + lengths[i]]``, to the left of row i."""
    columns = np.arange(out.shape[1])         # (L,)
    mask = columns < lengths[:, None]         # (B, L) True where a token goes
    positions = offsets[:, None] + columns    # (B, L) flat token positions
    out[mask] = tokens[positions[mask]]
