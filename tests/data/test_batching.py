"""Batching: token-count training batches and ordered evaluation batches, with their invariants."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minitfm.data import (DataError, EncodedCorpus, SubwordDropout, collate, epoch_batches,
                          eval_batches, iterate_batches, token_batches, train_vocab)
from minitfm.ids import BOS_ID, EOS_ID, PAD_ID
from tests.data.test_vocab import make_sentences


def random_corpus(lengths: list[tuple[int, int]], seed: int = 0) -> EncodedCorpus:
    """A corpus of random non-special ids with the given (source, target) lengths."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, 50, size=s).tolist() for s, _ in lengths]
    tgt = [rng.integers(4, 50, size=t).tolist() for _, t in lengths]
    return EncodedCorpus.from_ids(src, tgt)


length_pairs = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=80)


@given(length_pairs, st.integers(43, 400), st.integers(0, 2**32 - 1), st.integers(0, 100),
       st.none() | st.integers(2, 45), st.none() | st.integers(1, 9))
def test_token_batches_invariants(lengths, max_tokens, seed, epoch, max_positions, max_sentences):
    corpus = random_corpus(lengths)
    plan = token_batches(corpus.src_lengths, corpus.tgt_lengths, max_tokens, seed=seed,
                         epoch=epoch, max_positions=max_positions, max_sentences=max_sentences)
    # every pair that fits appears exactly once; the others are counted as dropped
    fits = [s + 1 <= (max_positions or 99) and t + 1 <= (max_positions or 99) for s, t in lengths]
    seen = np.concatenate(plan.batches) if plan.batches else np.zeros(0, dtype=np.int64)
    assert sorted(seen.tolist()) == [i for i, ok in enumerate(fits) if ok]
    assert plan.dropped == fits.count(False)

    real = padded = 0
    for indices, src, tgt in iterate_batches(corpus, plan):
        assert len(indices) >= 1 and src.dtype == tgt.dtype == np.int32
        assert len(indices) * max(src.shape[1], tgt.shape[1]) <= max_tokens
        if max_sentences is not None:
            assert len(indices) <= max_sentences
        check_layout(corpus, indices, src, tgt)
        real += np.count_nonzero(src != PAD_ID) + np.count_nonzero(tgt != PAD_ID)
        padded += src.size + tgt.size
    assert (plan.real_tokens, plan.padded_tokens) == (real, padded)

    again = token_batches(corpus.src_lengths, corpus.tgt_lengths, max_tokens, seed=seed,
                          epoch=epoch, max_positions=max_positions, max_sentences=max_sentences)
    assert [b.tolist() for b in again.batches] == [b.tolist() for b in plan.batches]


def check_layout(corpus, indices, src, tgt):
    """Tokens first, then EOS, then only padding; the target starts with BOS."""
    for row, i in enumerate(indices):
        s, t = corpus[i]
        assert src[row].tolist() == [*s.tolist(), EOS_ID] + [PAD_ID] * (src.shape[1] - len(s) - 1)
        assert tgt[row].tolist() == ([BOS_ID, *t.tolist(), EOS_ID]
                                     + [PAD_ID] * (tgt.shape[1] - len(t) - 2))


def test_epochs_differ_and_seeds_differ():
    rng = np.random.default_rng(0)
    src_len, tgt_len = rng.integers(1, 30, size=500), rng.integers(1, 30, size=500)
    plans = {(seed, epoch): [b.tolist() for b in token_batches(
        src_len, tgt_len, 300, seed=seed, epoch=epoch).batches]
        for seed, epoch in [(1, 0), (1, 1), (2, 0)]}
    assert plans[(1, 0)] != plans[(1, 1)] and plans[(1, 0)] != plans[(2, 0)]
    # not just a reordering: the batches' contents change too
    assert {tuple(sorted(b)) for b in plans[(1, 0)]} != {tuple(sorted(b)) for b in plans[(1, 1)]}


def test_sorting_by_length_keeps_padding_low():
    rng = np.random.default_rng(0)
    src_len = rng.integers(1, 100, size=5000)
    tgt_len = np.clip(src_len + rng.integers(-5, 6, size=5000), 1, None)
    plan = token_batches(src_len, tgt_len, 4000, seed=0, epoch=0)
    assert plan.padding_efficiency > 0.9
    assert "padding efficiency" in plan.summary()


def test_max_tokens_smaller_than_a_sentence_is_an_error():
    with pytest.raises(DataError, match="raise max_tokens or set max_positions"):
        token_batches(np.array([3, 50]), np.array([3, 10]), 40, seed=0, epoch=0)
    plan = token_batches(np.array([3, 50]), np.array([3, 10]), 40, seed=0, epoch=0,
                         max_positions=20)
    assert plan.dropped == 1 and "1 pairs over 20 positions dropped" in plan.summary()


def test_eval_batches_keep_order_and_cover_everything():
    corpus = random_corpus([(5, 3), (1, 9), (12, 2), (0, 0), (7, 7)])
    plan = eval_batches(corpus.src_lengths, corpus.tgt_lengths, 2)
    assert [b.tolist() for b in plan.batches] == [[0, 1], [2, 3], [4]]
    for indices, src, tgt in iterate_batches(corpus, plan):
        check_layout(corpus, indices, src, tgt)
    by_length = eval_batches(corpus.src_lengths, corpus.tgt_lengths, 2, sort_by_length=True)
    assert [b.tolist() for b in by_length.batches] == [[3, 1], [0, 4], [2]]


def test_eval_batches_truncate_over_long_sentences():
    corpus = random_corpus([(3, 3), (10, 2), (2, 12)])
    plan = eval_batches(corpus.src_lengths, corpus.tgt_lengths, 8, max_positions=6)
    assert plan.truncated == 2 and "2 pairs truncated to 6" in plan.summary()
    [(indices, src, tgt)] = list(iterate_batches(corpus, plan))
    assert src.shape == (3, 6) and tgt.shape == (3, 7)  # S <= 6, decoder input T <= 6
    assert src[1].tolist() == [*corpus[1][0][:5].tolist(), EOS_ID]
    assert tgt[2].tolist() == [BOS_ID, *corpus[2][1][:5].tolist(), EOS_ID]
    assert plan.real_tokens == np.count_nonzero(src) + np.count_nonzero(tgt)


def test_collate_with_a_memory_mapped_corpus(tmp_path):
    corpus = random_corpus([(4, 2), (1, 3)])
    for name in ("src_tokens", "src_offsets", "tgt_tokens", "tgt_offsets"):
        np.save(tmp_path / f"{name}.npy", getattr(corpus, name))
    mapped = EncodedCorpus(*(np.load(tmp_path / f"{name}.npy", mmap_mode="r") for name in
                             ("src_tokens", "src_offsets", "tgt_tokens", "tgt_offsets")))
    src, tgt = collate(mapped, np.array([1, 0]))
    assert src.shape == (2, 5) and tgt.shape == (2, 5)
    check_layout(mapped, [1, 0], src, tgt)


def test_collate_needs_indices():
    with pytest.raises(DataError, match="non-empty"):
        collate(random_corpus([(1, 1)]), np.array([], dtype=np.int64))


# ---- BPE-dropout: the corpus segmented anew every epoch once started ---------------------------

@pytest.fixture(scope="module")
def sentence_pairs():
    texts = make_sentences(300)
    vocab = train_vocab(texts, 120, hard_vocab_limit=False)
    src, tgt = texts[::2], texts[1::2]
    return vocab, src, tgt, EncodedCorpus.from_ids(vocab.encode(src), vocab.encode(tgt))


def texts_of(vocab, batch):
    """The (source, target) texts of a batch's rows."""
    src, tgt = batch
    return list(zip(vocab.decode(src.tolist()), vocab.decode(tgt.tolist())))


def test_subword_dropout_segments_the_same_batches_anew_once_started(sentence_pairs):
    vocab, src, tgt, corpus = sentence_pairs
    sampler = SubwordDropout(vocab, 0.2, src, tgt)
    sampler.check_matches(corpus)
    with_sampler = epoch_batches(corpus, 200, seed=5, subword_dropout=sampler)
    plain = epoch_batches(corpus, 200, seed=5)
    as_lists = lambda batches: [(s.tolist(), t.tolist()) for s, t in batches]   # noqa: E731
    assert as_lists(with_sampler(0)) == as_lists(plain(0))       # nothing sampled before start

    sampler.start()
    sampled, usual = list(with_sampler(1)), list(plain(1))
    assert len(sampled) == len(usual)
    for a, b in zip(sampled, usual):         # each batch: the same pairs, in the same rows
        assert texts_of(vocab, a) == texts_of(vocab, b)
        check_rows(a)
    count = lambda batches: sum(np.count_nonzero(s) + np.count_nonzero(t)   # noqa: E731
                                for s, t in batches)
    assert count(sampled) > count(usual)     # in smaller pieces
    assert as_lists(with_sampler(1)) != as_lists(sampled)          # anew every time


def check_rows(batch):
    """Each row: tokens, EOS, then padding; targets start with BOS (as collate lays them out)."""
    src, tgt = batch
    for row in src.tolist():
        n = row.index(EOS_ID)
        assert PAD_ID not in row[:n] and set(row[n + 1:]) <= {PAD_ID}
    assert (tgt[:, 0] == BOS_ID).all()
    for row in tgt[:, 1:].tolist():
        n = row.index(EOS_ID)
        assert PAD_ID not in row[:n] and set(row[n + 1:]) <= {PAD_ID}


def test_subword_dropout_keeps_the_usual_segmentation_where_a_sample_is_too_long(sentence_pairs):
    vocab, src, tgt, corpus = sentence_pairs
    sampler = SubwordDropout(vocab, 0.9, src, tgt)
    longest = max(max(len(s), len(t)) for s, t in (corpus[i] for i in range(len(corpus))))
    indices = np.arange(len(corpus))
    batch = sampler.collate(corpus, indices, max_positions=longest + 1)
    assert batch[0].shape[1] <= longest + 1 and batch[1].shape[1] <= longest + 2
    assert texts_of(vocab, batch) == list(zip(src, tgt))
    unlimited = sampler.collate(corpus, indices)
    assert unlimited[0].shape[1] > longest + 1 or unlimited[1].shape[1] > longest + 2


def test_subword_dropout_checks_its_input(sentence_pairs):
    vocab, src, tgt, corpus = sentence_pairs
    for rate in (0.0, 1.0):
        with pytest.raises(DataError, match=r"must be in \(0, 1\)"):
            SubwordDropout(vocab, rate, src, tgt)
    with pytest.raises(DataError, match="aligned"):
        SubwordDropout(vocab, 0.1, src, tgt[:-1])
    with pytest.raises(DataError, match=f"text of {len(src) - 1} pairs, but the encoded corpus "
                                        f"holds {len(src)}"):
        SubwordDropout(vocab, 0.1, src[:-1], tgt[:-1]).check_matches(corpus)
