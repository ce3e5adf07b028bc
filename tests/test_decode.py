"""Tests of minitfm.decoding.decode: the incremental cache against the full decoder, greedy decoding and
beam search (against each other, against a hand-built distribution, batched against one at a
time), the length penalty and the length limits."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitfm.decoding import batched, beam as search
from minitfm.decoding import decode
from minitfm.models import translator

TINY = translator.Config.preset("tiny")
A, B, C, D = 4, 5, 6, 7          # ordinary tokens of the tiny vocabulary (11 ids)


def tiny(pre_ln=False, seed=0, dtype=np.float64, **overrides):
    cfg = TINY.replace(pre_ln=pre_ln, **overrides)
    return translator.init_params(cfg, seed=seed, dtype=dtype), cfg


def sources(lengths, seed=0, vocab=11):
    """A padded source batch: random ordinary tokens, EOS, padding."""
    rng = np.random.default_rng(seed)
    return batched.pad_batch([rng.integers(4, vocab, size=n).tolist() for n in lengths], TINY)


# ---- the cache against the full forward pass ---------------------------------------------------

def full_logits(params, cfg, src, tgt_in):
    memory, src_mask, _ = translator.encoder_forward(params, cfg, src)
    h, _ = translator.decoder_forward(params, cfg, tgt_in, memory, src_mask)
    return translator.logits(params, cfg, h)                                # (B, T, V)


def cached_logits(params, cfg, src, tgt_in):
    kv = decode.init_kv_cache(params, cfg, src, capacity=tgt_in.shape[1])
    steps = [decode.step(params, cfg, kv, tgt_in[:, t], t) for t in range(tgt_in.shape[1])]
    return np.stack(steps, axis=1)                                     # (B, T, V)


@settings(max_examples=12, deadline=None)
@given(pre_ln=st.booleans(), share=st.booleans(), seed=st.integers(0, 10_000),
       src_lengths=st.lists(st.integers(0, 9), min_size=1, max_size=3),
       steps=st.integers(1, 12))
def test_cached_steps_equal_full_forward_float64(pre_ln, share, seed, src_lengths, steps):
    params, cfg = tiny(pre_ln, seed, share_embeddings=share)
    src = sources(src_lengths, seed)
    rng = np.random.default_rng(seed + 1)
    tgt_in = np.concatenate([np.full((len(src_lengths), 1), cfg.bos_id),
                             rng.integers(3, 11, size=(len(src_lengths), steps - 1))], axis=1)
    np.testing.assert_allclose(cached_logits(params, cfg, src, tgt_in),
                               full_logits(params, cfg, src, tgt_in), rtol=0, atol=1e-10)


@pytest.mark.parametrize("pre_ln", [False, True])
def test_cached_steps_equal_full_forward_float32(pre_ln):
    cfg = translator.Config.preset("toy", pre_ln=pre_ln, src_vocab=40, tgt_vocab=40)
    params = translator.init_params(cfg, seed=3, dtype=np.float32)
    src = sources([7, 3, 12], seed=3, vocab=40)
    tgt_in = np.concatenate([np.full((3, 1), cfg.bos_id),
                             np.random.default_rng(4).integers(3, 40, size=(3, 15))], axis=1)
    cached = cached_logits(params, cfg, src, tgt_in)
    assert cached.dtype == np.float32
    np.testing.assert_allclose(cached, full_logits(params, cfg, src, tgt_in), rtol=0, atol=1e-5)


def test_reorder_gathers_rows_and_drops_sentences():
    params, cfg = tiny()
    kv = decode.init_kv_cache(params, cfg, sources([3, 5]), beam=2, capacity=4)
    for t, tokens in enumerate(([A, B, C, D], [B, A, D, C])):
        decode.step(params, cfg, kv, np.array(tokens), t)
    before = [k.copy() for k in kv.self_k]
    kv = decode.reorder(kv, [1, 1, 2, 3], filled=2)             # beam 0 of sentence 0 is pruned
    np.testing.assert_array_equal(kv.self_k[0][:, :, :2], before[0][[1, 1, 2, 3], :, :2])
    cross, mask = kv.cross_k[0].copy(), kv.src_mask.copy()   # a row per sentence
    assert cross.shape[0] == 2 and mask[0].min() < 0 == mask[1].min()   # sentence 0 is padded
    kv = decode.reorder(kv, [3, 2], filled=2)                   # sentence 0 leaves the batch
    assert kv.rows == 2 and kv.sentences == 1
    for i in range(cfg.n_layers):
        np.testing.assert_array_equal(kv.self_k[i][:, :, :2], before[i][[3, 2], :, :2])
    np.testing.assert_array_equal(kv.cross_k[0], cross[[1]])
    np.testing.assert_array_equal(kv.src_mask, mask[[1]])


# ---- search on the real (tiny, random) model ---------------------------------------------------

# seeds whose random tiny models end some outputs with EOS and run others to the length limit
MIXED_SEEDS = [1, 6, 7, 11]


@pytest.mark.parametrize("pre_ln", [False, True])
@pytest.mark.parametrize("seed", MIXED_SEEDS)
def test_beam_size_one_is_greedy(pre_ln, seed):
    """Beam 1 stopping at its first finished hypothesis: first-k, or exact without a penalty
    (with one, the exact rule may search past an EOS that a longer hypothesis can beat)."""
    params, cfg = tiny(pre_ln, seed)
    src = sources([1, 8, 3, 5, 0], seed)
    greedy = decode.greedy(params, cfg, src, max_len=20)
    for alpha, stopping in ((0.6, "first-k"), (0.0, "exact")):
        beam = search.beam_search(params, cfg, src, beam=1, alpha=alpha, max_len=20,
                                  stopping=stopping)
        assert [hyps[0][0] for hyps in beam] == greedy


@pytest.mark.parametrize("seed", MIXED_SEEDS)
def test_batch_equals_one_at_a_time(seed):
    params, cfg = tiny(seed=seed)
    lengths = [1, 8, 3, 5, 0]
    src = sources(lengths, seed=seed)
    batched = search.beam_search(params, cfg, src, beam=3, nbest=3, max_len=20)
    greedy = decode.greedy(params, cfg, src, max_len=20)
    for i, n in enumerate(lengths):
        alone = src[i:i + 1, :n + 1]                                  # no padding at all
        one = search.beam_search(params, cfg, alone, beam=3, nbest=3, max_len=20)[0]
        assert [h[0] for h in one] == [h[0] for h in batched[i]]
        np.testing.assert_allclose([h[1] for h in one], [h[1] for h in batched[i]], atol=1e-10)
        assert decode.greedy(params, cfg, alone, max_len=20)[0] == greedy[i]


def greedy_by_full_forward(params, cfg, src_row, max_len):
    """Greedy decoding of one sentence the plain way: the whole decoder over the prefix at every
    step, no key/value cache, no batching."""
    prefix = [cfg.bos_id]
    for _ in range(max_len):
        logits = full_logits(params, cfg, src_row[None], np.array([prefix]))[0, -1]     # (V,)
        logits[[cfg.pad_id, cfg.bos_id]] = -np.inf
        token = int(logits.argmax())
        if token == cfg.eos_id:
            break
        prefix.append(token)
    return prefix[1:]


@pytest.mark.parametrize("pre_ln", [False, True])
@pytest.mark.parametrize("seed", MIXED_SEEDS)
def test_greedy_equals_the_full_forward_reference(pre_ln, seed):
    params, cfg = tiny(pre_ln, seed)
    lengths = [1, 8, 3, 5, 0]
    src = sources(lengths, seed)
    expected = [greedy_by_full_forward(params, cfg, src[i, :n + 1], 20)
                for i, n in enumerate(lengths)]
    assert decode.greedy(params, cfg, src, max_len=20) == expected


def sequence_log_prob(params, cfg, src_row, tokens, with_eos=True):
    """log P(tokens [EOS] | src) from the full decoder, in float64."""
    target = [cfg.bos_id] + tokens + ([cfg.eos_id] if with_eos else [])
    logits = full_logits(params, cfg, src_row[None], np.array([target[:-1]]))[0]
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return float(sum(logp[t, y] for t, y in enumerate(target[1:])))


def test_scores_are_length_normalised_log_probs():
    params, cfg = tiny(seed=6)
    src = sources([1, 8, 3, 5, 0], seed=6)
    results = search.beam_search(params, cfg, src, beam=4, nbest=4, max_len=12)
    for row, hyps in zip(src, results):
        assert [h[1] for h in hyps] == sorted((h[1] for h in hyps), reverse=True)
        for tokens, score in hyps:
            ended = len(tokens) < 12                                  # else stopped by max_len
            logp = sequence_log_prob(params, cfg, row, tokens, with_eos=ended)
            length = len(tokens) + ended
            assert score == pytest.approx(logp / search.length_penalty(length, 0.6), abs=1e-9)


def test_float32_params_decode():
    params, cfg = tiny(seed=1, dtype=np.float32)
    src = sources([3, 5], seed=1)
    hyps = search.beam_search(params, cfg, src, beam=2)
    assert all(isinstance(h[0][1], float) and math.isfinite(h[0][1]) for h in hyps)
    assert len(decode.greedy(params, cfg, src)) == 2


def test_special_tokens_are_never_generated_nor_fed(monkeypatch):
    params, cfg = tiny(seed=2)
    fed = []

    def spy(params, cfg, kv, tokens, t):
        fed.append((t, np.asarray(tokens).tolist()))
        return real_step(params, cfg, kv, tokens, t)

    real_step = decode.step
    monkeypatch.setattr(decode, "step", spy)
    src = sources([3, 6, 1], seed=2)
    outputs = [h[0] for hyps in search.beam_search(params, cfg, src, beam=4, nbest=4) for h in hyps]
    outputs += decode.greedy(params, cfg, src)
    for t, tokens in fed:
        assert set(tokens) == {cfg.bos_id} if t == 0 else not set(tokens) & {0, 2, 3}
    for tokens in outputs:
        assert not set(tokens) & {cfg.pad_id, cfg.bos_id, cfg.eos_id}


# ---- search on hand-built next-token distributions ---------------------------------------------

def markov_step(table):
    """A stand-in for decode.step: the next-token distribution depends on the last token only."""
    log_table = np.log(np.asarray(table, dtype=np.float64))

    def fake_step(params, cfg, kv, tokens, t):
        fake_step.fed.append(np.asarray(tokens).tolist())
        return log_table[np.asarray(tokens)]                          # (R, V) logits

    fake_step.fed = []
    return fake_step


def distribution(**probs):
    """A row over the 11 tiny ids: the given tokens' probabilities, the rest spread evenly."""
    named = {"A": A, "B": B, "C": C, "D": D, "EOS": 3}
    row = np.zeros(11)
    for name, p in probs.items():
        row[named[name]] = p
    rest = [i for i in range(11) if row[i] == 0]
    row[rest] = (1.0 - row.sum()) / len(rest)
    return row


def greedy_trap():
    """From BOS greedy takes A (0.5) over B (0.4), but only B is followed by a likely EOS."""
    table = np.tile(distribution(EOS=0.002), (11, 1))
    table[2] = distribution(A=0.5, B=0.4)
    table[A] = distribution(C=0.3, D=0.3, EOS=0.001)
    table[B] = distribution(EOS=0.9)
    table[C] = distribution(EOS=0.9)
    table[D] = distribution(EOS=0.9)
    return table


def test_beam_search_finds_what_greedy_misses(monkeypatch):
    params, cfg = tiny()
    monkeypatch.setattr(decode, "step", markov_step(greedy_trap()))
    src = sources([3])
    assert decode.greedy(params, cfg, src) == [[A, C]]
    (best,) = search.beam_search(params, cfg, src, beam=4, alpha=0.6)[0]
    assert best[0] == [B]
    assert best[1] == pytest.approx(math.log(0.4 * 0.9) / ((5 + 2) / 6) ** 0.6)
    greedy_score = math.log(0.5 * 0.3 * 0.9) / ((5 + 3) / 6) ** 0.6
    assert best[1] > greedy_score


def test_finished_hypotheses_are_never_extended(monkeypatch):
    params, cfg = tiny()
    fake = markov_step(greedy_trap())
    monkeypatch.setattr(decode, "step", fake)
    results = search.beam_search(params, cfg, sources([3, 5]), beam=3, nbest=3)
    assert all(cfg.eos_id not in tokens for tokens in fake.fed)
    for hyps in results:
        assert len(hyps) == 3
        assert all(cfg.eos_id not in h[0] for h in hyps)


def never_ends():
    table = np.full((11, 11), 1.0)
    table[:, 3] = 1e-30                                               # EOS all but impossible
    return table / table.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_default_max_length_is_source_length_plus_50(monkeypatch, method):
    params, cfg = tiny()
    monkeypatch.setattr(decode, "step", markov_step(never_ends()))
    src = sources([2, 5, 30])                  # 3, 6 and 31 positions with EOS; max_len is 64
    if method == "greedy":
        outputs = decode.greedy(params, cfg, src)
    else:
        outputs = [hyps[0][0] for hyps in search.beam_search(params, cfg, src, beam=2)]
    assert [len(o) for o in outputs] == [3 + 50, 6 + 50, cfg.max_len]


def test_explicit_max_length_is_respected():
    params, cfg = tiny(seed=3)
    src = sources([4, 9], seed=3)
    for hyps in search.beam_search(params, cfg, src, beam=3, nbest=3, max_len=5):
        assert all(len(h[0]) <= 5 for h in hyps)
    assert all(len(o) <= 5 for o in decode.greedy(params, cfg, src, max_len=5))
    with pytest.raises(ValueError, match="max_len"):
        decode.greedy(params, cfg, src, max_len=cfg.max_len + 1)


# ---- pieces ------------------------------------------------------------------------------------

def test_length_penalty_formula():
    assert search.length_penalty(1, 0.6) == 1.0                       # ((5 + 1) / 6)^a
    assert search.length_penalty(10, 0.6) == pytest.approx((15 / 6) ** 0.6)
    assert search.length_penalty(30, 0.0) == 1.0                      # alpha 0: raw log-prob
    assert search.length_penalty(20, 1.0) == pytest.approx(25 / 6)
    lengths = range(1, 100)
    assert all(search.length_penalty(n, 0.6) < search.length_penalty(n + 1, 0.6) for n in lengths)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 4), width=st.integers(1, 700), k=st.integers(1, 8),
       seed=st.integers(0, 10_000))
def test_top_k_matches_a_full_sort(rows, width, k, seed):
    k = min(k, width)
    x = np.random.default_rng(seed).normal(size=(rows, width))
    values, ids = search.top_k(x, k, block=16)
    np.testing.assert_array_equal(values, -np.sort(-x, axis=1)[:, :k])
    np.testing.assert_array_equal(np.take_along_axis(x, ids, axis=1), values)


@pytest.mark.parametrize("continuous", [True, False])
def test_translate_ids_sorts_batches_and_restores_order(continuous):
    """Batches of 2, refilled as sentences end or decoded one after the other: each sentence as
    it is decoded alone (continuous batching: rows at different positions in one step)."""
    params, cfg = tiny(seed=4)
    rng = np.random.default_rng(4)
    sentences = [rng.integers(4, 11, size=n).tolist() for n in (5, 1, 7, 0, 3)]
    results = batched.translate_ids(params, cfg, sentences, beam=2, nbest=2, batch_size=2,
                                   max_len=9, continuous=continuous)
    assert len(results) == 5 and all(len(hyps) == 2 for hyps in results)
    for sentence, hyps in zip(sentences, results):
        alone = search.beam_search(params, cfg, batched.pad_batch([sentence], cfg), beam=2,
                                   nbest=2, max_len=9)
        assert [h[0] for h in alone[0]] == [h[0] for h in hyps]
        np.testing.assert_allclose([h[1] for h in alone[0]], [h[1] for h in hyps], rtol=1e-5)


def test_bad_search_settings_are_rejected():
    params, cfg = tiny()
    src = sources([2])
    with pytest.raises(ValueError, match="nbest"):
        search.beam_search(params, cfg, src, beam=2, nbest=3)
    with pytest.raises(ValueError, match="beam size"):
        search.beam_search(params, cfg, src, beam=0)
    with pytest.raises(ValueError, match="alpha"):
        search.beam_search(params, cfg, src, alpha=-1.0)
    with pytest.raises(ValueError, match="batch_size"):
        batched.translate_ids(params, cfg, [[A]], batch_size=0)
