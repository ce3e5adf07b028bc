"""Tests of minitfm.decoding.beam's search itself: a beam wide enough to hold every candidate finds the n
best sequences that brute force finds; both stopping rules give what a plain, unbatched beam
search gives, the exact one what a search to the length limit gives, and so does a batch
refilled as its sentences end (continuous batching), and the candidates taken a block of
sentences at a time; the exact rule keeps
searching while a live hypothesis can still win; and CTranslate2, called as the export records,
gives minitfm's tokens on a trained test model, at alpha 0 and with the power penalty."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from minitfm.decoding import batched, beam as search
from minitfm.decoding import decode
from minitfm.export.__main__ import main as export_main
from minitfm.export.ctranslate2 import UNIT_LENGTH_PENALTY
from minitfm.layers.positional import Positions
from tests.test_decode import A, B, C, D, markov_step, sequence_log_prob, sources, tiny
from tests.test_export import (MAX_OUT, check_equal, load_params, needs, test_sources,
                               translator, vocab)  # noqa: F401  (fixtures)

PENALTIES = [(0.0, "gnmt"), (0.6, "gnmt"), (1.5, "gnmt"), (0.6, "power"), (1.5, "power")]


# ---- a plain beam search, one sentence, no batching, no cache ----------------------------------

def plain_beam(next_log_probs, k, limit, alpha, form, nbest, stopping):
    """Beam search as the module docstring says it, written plainly: ``next_log_probs(t, prefix)``
    gives the log-probabilities (V,) after ``prefix``; every list is sorted and searched."""
    live, finished = [([], 0.0)], []
    for t in range(limit):
        candidates = []
        for prefix, score in live:
            row = next_log_probs(t, prefix)
            candidates += [(score + row[v], prefix, v) for v in range(len(row))
                           if v not in (0, 2) and score + row[v] > -math.inf]   # no PAD, BOS
        candidates = sorted(candidates, key=lambda c: -c[0])[:2 * k]
        for rank, (score, prefix, v) in enumerate(candidates):
            if rank < k and (v == 3 or t + 1 == limit):
                tokens = prefix + ([] if v == 3 else [v])
                finished.append((tokens, score / search.length_penalty(t + 1, alpha, form)))
        live = [(prefix + [v], score) for score, prefix, v in candidates if v != 3][:k]
        ranked = sorted((s for _, s in finished), reverse=True)
        if stopping == "first-k" and len(finished) >= k:
            break
        if stopping == "exact" and len(ranked) >= nbest and live and \
                ranked[nbest - 1] >= live[0][1] / search.length_penalty(limit, alpha, form):
            break
        if not live:
            break
    return sorted(finished, key=lambda h: -h[1])[:nbest]


# ---- against brute force and the plain search --------------------------------------------------

@pytest.mark.parametrize("stopping", search.STOPPING_RULES)
@pytest.mark.parametrize("alpha, form", PENALTIES)
def test_a_beam_holding_every_candidate_finds_the_brute_force_best(alpha, form, stopping):
    """Target vocabulary of 6 ids: 3 tokens besides EOS can be generated (PAD and BOS cannot).
    Up to 3 output tokens there are 4 + 12 + 36 candidates at the three steps: a beam of 36
    keeps every one, so beam search is exhaustive and must rank as brute force does."""
    params, cfg = tiny(seed=5, tgt_vocab=6, share_embeddings=False)
    src = sources([4, 2, 6], seed=5)
    limit, words = 3, [1, 4, 5]
    found = search.beam_search(params, cfg, src, beam=36, alpha=alpha, max_len=limit, nbest=5,
                               lenpen_form=form, stopping=stopping)
    lengths = set()
    for row, hyps in zip(src, found):
        every = []
        for n in range(limit + 1):
            for tokens in itertools.product(words, repeat=n):
                ended = n < limit                      # at the limit: no EOS
                logp = sequence_log_prob(params, cfg, row, list(tokens), with_eos=ended)
                lp = search.length_penalty(n + ended, alpha, form)
                every.append((list(tokens), logp / lp))
        best = sorted(every, key=lambda h: -h[1])[:5]
        assert [h[0] for h in hyps] == [h[0] for h in best]
        np.testing.assert_allclose([h[1] for h in hyps], [h[1] for h in best], atol=1e-9)
        lengths.update(len(h[0]) for h in hyps)
    assert len(lengths) > 1, "the n best should have several lengths, to rank across them"


def random_chain(seed):
    """A stand-in for decode.step: the next-token distribution depends on the step and the last
    token, drawn at random with EOS often likely, so hypotheses end at many different steps."""
    tables = np.log(np.random.default_rng(seed).dirichlet(np.full(11, 0.4), size=(30, 11)))

    def fake_step(params, cfg, kv, tokens, t):
        return tables[t][np.asarray(tokens)].copy()                      # (R, V) logits

    def next_log_probs(t, prefix):
        return tables[t][prefix[-1] if prefix else 2]                    # after BOS at first

    return fake_step, next_log_probs


@pytest.mark.parametrize("stopping", ["exact", "first-k"])
@pytest.mark.parametrize("alpha, form", PENALTIES)
@pytest.mark.parametrize("beam, nbest", [(1, 1), (4, 1), (4, 3), (5, 2)])
def test_both_rules_search_as_the_plain_beam_search(monkeypatch, stopping, alpha, form, beam,
                                                    nbest):
    """Random next-token tables (by step and last token, EOS often likely), six sentences
    batched, against the plain search one at a time; the exact rule also equals the plain search
    run to the length limit."""
    params, cfg = tiny()
    src = sources([3, 8, 1, 5, 0, 9])
    for seed in range(6):
        fake_step, next_log_probs = random_chain(seed)
        monkeypatch.setattr(decode, "step", fake_step)
        found = search.beam_search(params, cfg, src, beam, alpha, max_len=12, nbest=nbest,
                                   lenpen_form=form, stopping=stopping)
        expected = plain_beam(next_log_probs, beam, 12, alpha, form, nbest, stopping)
        assert [[h[0] for h in hyps] for hyps in found] == [[h[0] for h in expected]] * len(src)
        np.testing.assert_allclose([h[1] for h in found[0]], [h[1] for h in expected], atol=1e-9)
        if stopping == "exact":
            to_the_limit = plain_beam(next_log_probs, beam, 12, alpha, form, nbest, None)
            assert [h[0] for h in expected] == [h[0] for h in to_the_limit]


def chain_by_source(seed):
    """A stand-in for decode.step whose next-token tables depend on the sentence too (by its
    source length, read from the cache's mask), the step (each row's own position, when rows
    stand at different ones) and the last token: sentences end at different steps."""
    tables = np.log(np.random.default_rng(seed).dirichlet(np.full(11, 0.4), size=(4, 30, 11)))

    def fake_step(params, cfg, kv, tokens, t):
        lengths = (kv.src_mask[:, 0, 0] == 0).sum(axis=-1)                  # (n,) with EOS
        table = np.repeat(lengths % 4, len(tokens) // kv.sentences)          # (R,)
        at = t.at if isinstance(t, Positions) else t
        return tables[table, at, np.asarray(tokens)].copy()                  # (R, V) logits

    def next_log_probs(sentence):
        return lambda t, prefix: tables[(len(sentence) + 1) % 4, t, prefix[-1] if prefix else 2]

    return fake_step, next_log_probs


@pytest.mark.parametrize("stopping", ["exact", "first-k"])
@pytest.mark.parametrize("alpha, form", [(0.0, "gnmt"), (0.6, "gnmt"), (1.5, "power")])
@pytest.mark.parametrize("beam, nbest", [(1, 1), (4, 2)])
def test_continuous_batching_searches_as_the_plain_beam_search(monkeypatch, stopping, alpha,
                                                                form, beam, nbest):
    """Nine sentences, at most three in the cache at once, each place refilled as its sentence
    ends: each sentence's search is the plain one, though it shares its steps with sentences at
    other positions."""
    params, cfg = tiny()
    sentences = [[4] * n for n in (3, 8, 1, 5, 0, 9, 2, 6, 7)]
    for seed in range(4):
        fake_step, next_log_probs = chain_by_source(seed)
        monkeypatch.setattr(decode, "step", fake_step)
        found = batched.translate_ids(params, cfg, sentences, beam=beam, alpha=alpha, max_len=12,
                                     nbest=nbest, batch_size=3, lenpen_form=form,
                                     stopping=stopping)
        for sentence, hyps in zip(sentences, found):
            expected = plain_beam(next_log_probs(sentence), beam, 12, alpha, form, nbest,
                                  stopping)
            assert [h[0] for h in hyps] == [h[0] for h in expected]
            np.testing.assert_allclose([h[1] for h in hyps], [h[1] for h in expected], atol=1e-9)


def test_candidates_in_blocks_of_sentences_are_those_of_one_block(monkeypatch):
    """The log-softmax and the shortlist run a block of sentences at a time (in the cache): one
    sentence a block gives the hypotheses and scores of all at once, bit for bit."""
    params, cfg = tiny(seed=3)
    sentences = [[4, 5, 6][:n % 3 + 1] * (n % 4 + 1) for n in range(7)]

    def search_with(block_bytes):
        monkeypatch.setattr(search, "CANDIDATE_BLOCK_BYTES", block_bytes)
        return batched.translate_ids(params, cfg, sentences, beam=3, alpha=0.6, max_len=10,
                                     nbest=2, batch_size=4)

    assert search_with(1) == search_with(1 << 40)


def late_winner():
    """Next-token probabilities by last token, beam 4: from BOS, A (0.55) goes on A B C EOS
    (0.55 * 0.9 * 0.9 * 0.95), while D, 8 and 9 (0.12, 0.11, 0.10) each end at once. Three
    hypotheses finish at step 1, a fourth (A 10 EOS, 10 rare after A) at step 2: then A B, far
    likelier than every finished one, is still alive."""
    rows = {2: {A: .55, D: .12, 8: .11, 9: .10, 10: .05, 1: .02, B: .02, C: .029, 3: .001},
            A: {B: .9, 10: .05, 3: .001}, B: {C: .9, 3: .001}, C: {3: .95}, D: {3: .95},
            8: {3: .95}, 9: {3: .95}, 10: {3: .99}}
    table = np.full((11, 11), 0.5)                     # any other token: EOS half the time
    table[:, 3] = 0.5 * 10
    for last, probs in rows.items():
        table[last] = 0.001 * (1 + np.arange(11) / 100)    # the rest: small, and no ties
        for token, p in probs.items():
            table[last, token] = p
    table /= table.sum(axis=1, keepdims=True)
    return table, math.log(table[2, A] * table[A, B] * table[B, C] * table[C, 3])


@pytest.mark.parametrize("alpha, form", [(0.0, "gnmt"), (0.6, "gnmt"), (1.0, "power")])
def test_the_exact_rule_keeps_searching_while_a_live_hypothesis_can_win(monkeypatch, alpha,
                                                                        form):
    params, cfg = tiny()
    table, winner = late_winner()
    monkeypatch.setattr(decode, "step", markov_step(table))
    src = sources([3])
    first_k = search.beam_search(params, cfg, src, beam=4, alpha=alpha, lenpen_form=form,
                                 nbest=4, stopping="first-k")[0]
    exact = search.beam_search(params, cfg, src, beam=4, alpha=alpha, lenpen_form=form,
                               nbest=4, stopping="exact")[0]
    assert [h[0] for h in first_k] == [[D], [8], [9], [A, 10]]   # the fourth ended the search
    assert exact[0][0] == [A, B, C]
    assert exact[0][1] == pytest.approx(winner / search.length_penalty(4, alpha, form))
    assert exact[0][1] > first_k[0][1]
    assert [h[0] for h in exact[1:]] == [[D], [8], [9]]


def test_auto_stops_exactly_without_a_penalty_and_after_k_with_one(monkeypatch):
    params, cfg = tiny()
    monkeypatch.setattr(decode, "step", markov_step(late_winner()[0]))
    src = sources([3])
    assert [search.stopping_rule("auto", a) for a in (0.0, 0.6)] == ["exact", "first-k"]
    for alpha, rule in ((0.0, "exact"), (0.6, "first-k")):
        assert search.beam_search(params, cfg, src, alpha=alpha, nbest=4) == \
            search.beam_search(params, cfg, src, alpha=alpha, nbest=4, stopping=rule)
    with pytest.raises(ValueError, match="stopping rule must be one of auto, exact, first-k"):
        search.beam_search(params, cfg, src, stopping="never")


# ---- CTranslate2, called as the export records --------------------------------------------------

def penalised_score(params, cfg, src, tokens, alpha, form):
    """minitfm's score of ``tokens`` in float64, from the full decoder."""
    ended = len(tokens) < MAX_OUT
    row = np.asarray(src + [cfg.eos_id])
    params64 = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    logp = sequence_log_prob(params64, cfg, row, tokens, with_eos=ended)
    return logp / search.length_penalty(len(tokens) + ended, alpha, form)


@needs["ctranslate2"]
@pytest.mark.parametrize("translator", ["post-LN, shared embeddings"], indirect=True)
@pytest.mark.parametrize("alpha, stopping", [(0.0, "exact"), (0.0, "first-k"), (1.0, "exact"),
                                             (1.0, "first-k")])
def test_ctranslate2_with_the_recorded_call_gives_minitfms_tokens(translator, tmp_path, capsys,
                                                                  alpha, stopping):
    import ctranslate2
    path, _ = translator
    out = str(tmp_path / "ct2")
    assert export_main([path, "--to", "ctranslate2", "--out", out, "--lenpen-form", "power",
                        "--lenpen", str(alpha), "--stopping", stopping,
                        "--max-len", str(MAX_OUT)]) == 0
    assert "warning" not in capsys.readouterr().err
    with open(f"{out}/decoding.json", encoding="utf-8") as f:
        settings = json.load(f)
    assert settings["minitfm"]["exact"]
    params, cfg = load_params(path)
    sentences = test_sources(cfg)
    found = batched.translate_ids(params, cfg, sentences, alpha=alpha, max_len=MAX_OUT,
                                 lenpen_form="power", stopping=stopping)
    ours = [hyps[0][0] for hyps in found]
    if alpha:              # the penalty changes what wins: the comparison tests the penalty too
        plain = batched.translate_ids(params, cfg, sentences, alpha=0.0, max_len=MAX_OUT)
        assert sum(a != b for a, b in zip(ours, (h[0][0] for h in plain))) >= 0.05 * len(ours)
    with open(f"{out}/shared_vocabulary.json", encoding="utf-8") as f:
        tokens = json.load(f)
    engine = ctranslate2.Translator(out, device="cpu", intra_threads=1)
    results = engine.translate_batch([[tokens[i] for i in s] for s in sentences],
                                     return_scores=True, **settings["kwargs"])
    theirs = [[tokens.index(t) for t in r.hypotheses[0]] for r in results]
    check_equal(ours, theirs, lambda i, a, b: abs(
        penalised_score(params, cfg, sentences[i], a, alpha, "power")
        - penalised_score(params, cfg, sentences[i], b, alpha, "power")), f"alpha {alpha:g}")
    same = [i for i in range(len(ours)) if ours[i] == theirs[i]]
    np.testing.assert_allclose([results[i].scores[0] for i in same],
                               [found[i][0][1] for i in same], atol=1e-3)


@pytest.mark.parametrize("translator", ["post-LN, shared embeddings"], indirect=True)
@pytest.mark.parametrize("options, length_penalty, patience, warning", [
    (["--lenpen", "0"], 0.0, 1, None),                                    # auto: exact
    (["--lenpen", "0", "--stopping", "first-k"], UNIT_LENGTH_PENALTY, 1, None),
    (["--lenpen-form", "power", "--lenpen", "1.2"], 1.2, 1, None),        # auto: first-k
    (["--lenpen-form", "power", "--lenpen", "1.2", "--stopping", "exact"], 1.2, MAX_OUT + 1,
     None),
    (["--lenpen", "1.2"], 0.96, 1, "agree only at alpha = 0"),
    (["--lenpen", "1.2", "--beam", "1", "--stopping", "exact"], 0.0, 1,
     "with beam 1 CTranslate2 decodes greedily"),
])
def test_the_export_records_the_rule_and_warns_only_without_an_exact_call(
        translator, tmp_path, capsys, options, length_penalty, patience, warning):
    path, _ = translator
    out = tmp_path / "ct2"
    assert export_main([path, "--to", "ctranslate2", "--out", str(out), "--max-len",
                        str(MAX_OUT), *options]) == 0
    captured = capsys.readouterr()
    settings = json.loads((out / "decoding.json").read_text())
    assert settings["kwargs"]["length_penalty"] == length_penalty
    assert settings["kwargs"]["patience"] == patience
    assert f"length_penalty={length_penalty!r}, patience={patience}" in captured.out
    assert settings["minitfm"]["exact"] == (warning is None)
    if warning:
        assert warning in captured.err
    else:
        assert captured.err == ""
