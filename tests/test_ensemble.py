"""Tests of minitfm.decoding.ensemble: a step of an ensemble over its joined cache is the log of the mean
of its members' probabilities from their full forward passes (members of other sizes too); beam
search of an ensemble finds what a plain beam search over those mean probabilities finds, batch
by batch and refilled as sentences end; an ensemble of one searches as its model; and the
commands decode an ensemble, refusing models of another vocabulary."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitfm.decoding import batched, beam as search
from minitfm.decoding import decode, translation
from minitfm.commands import train_wmt
from minitfm.data.vocab import train_vocab
from minitfm.decoding.ensemble import Ensemble
from tests.test_beam import plain_beam
from tests.test_decode import full_logits, sources, tiny
from tests.test_translate import TEXT, run, write_checkpoint


def members(seed, n=2):
    """``n`` tiny translators of different seeds and sizes (shared vocabulary)."""
    shapes = [{}, {"n_layers": 1, "d_ff": 20}, {"pre_ln": True, "d_model": 12, "n_heads": 3}]
    return [tiny(seed=seed + i, **shapes[i % len(shapes)]) for i in range(n)]


def mean_log_probs(models, src_row, prefix):
    """log of the mean of the members' next-token probabilities after ``prefix`` (BOS first),
    from full forward passes, in float64."""
    probs = []
    for params, cfg in models:
        z = full_logits(params, cfg, src_row[None], np.array([prefix]))[0, -1]    # (V,)
        probs.append(np.exp(z - z.max()) / np.exp(z - z.max()).sum())
    return np.log(np.mean(probs, axis=0))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 3),
       src_lengths=st.lists(st.integers(0, 9), min_size=1, max_size=3), steps=st.integers(1, 8))
def test_an_ensemble_step_is_the_log_of_the_mean_of_its_members_probabilities(
        seed, n, src_lengths, steps):
    models = members(seed, n)
    ens = Ensemble(models)
    src = sources(src_lengths, seed)
    rng = np.random.default_rng(seed + 1)
    tgt_in = np.concatenate([np.full((len(src_lengths), 1), ens.cfg.bos_id),
                             rng.integers(3, 11, size=(len(src_lengths), steps - 1))], axis=1)
    kv = decode.init_kv_cache(ens, ens.cfg, src, capacity=steps)
    assert len(kv.self_k) == sum(cfg.n_layers for _, cfg in models)
    for t in range(steps):
        got = decode.step(ens, ens.cfg, kv, tgt_in[:, t], t)                       # (B, V)
        for b in range(len(src_lengths)):
            expected = mean_log_probs(models, src[b], tgt_in[b, :t + 1].tolist())
            np.testing.assert_allclose(got[b], expected, rtol=0, atol=1e-10)


def ensemble_next_log_probs(models, src_row):
    """``plain_beam``'s step for one sentence of an ensemble: BOS, then the prefix."""
    return lambda t, prefix: mean_log_probs(models, src_row, [models[0][1].bos_id] + prefix)


@pytest.mark.parametrize("stopping", ["exact", "first-k"])
@pytest.mark.parametrize("alpha, form", [(0.0, "gnmt"), (0.6, "gnmt"), (1.0, "power")])
@pytest.mark.parametrize("continuous", [False, True])
def test_beam_search_of_an_ensemble_is_the_plain_search_over_the_mean(stopping, alpha, form,
                                                                      continuous):
    models = members(seed=3)
    ens = Ensemble(models)
    lengths = [1, 8, 3, 5, 2, 6]
    src = sources(lengths, seed=3)
    ids = [src[i, :n].tolist() for i, n in enumerate(lengths)]
    found = batched.translate_ids(ens, ens.cfg, ids, beam=3, alpha=alpha, max_len=6, nbest=2,
                                  batch_size=3, lenpen_form=form, stopping=stopping,
                                  continuous=continuous)
    for i, n in enumerate(lengths):
        expected = plain_beam(ensemble_next_log_probs(models, src[i, :n + 1]), 3, 6, alpha, form,
                              2, stopping)
        assert [h[0] for h in found[i]] == [h[0] for h in expected]
        np.testing.assert_allclose([h[1] for h in found[i]], [h[1] for h in expected],
                                   rtol=0, atol=1e-9)


def test_an_ensemble_of_one_searches_as_its_model_and_greedy_takes_the_mean():
    models = members(seed=5)
    lengths = [1, 8, 3, 5, 0]
    src = sources(lengths, seed=5)
    params, cfg = models[0]
    alone = search.beam_search(params, cfg, src, beam=4, nbest=4, max_len=10)
    one = search.beam_search(Ensemble(models[:1]), cfg, src, beam=4, nbest=4, max_len=10)
    assert [[h[0] for h in hyps] for hyps in one] == [[h[0] for h in hyps] for hyps in alone]
    np.testing.assert_allclose([[h[1] for h in hyps] for hyps in one],
                               [[h[1] for h in hyps] for hyps in alone], rtol=0, atol=1e-10)
    ens = Ensemble(models)
    for i, n in enumerate(lengths):                        # greedy: argmax of the mean each step
        prefix = [cfg.bos_id]
        for _ in range(10):
            scores = mean_log_probs(models, src[i, :n + 1], prefix)
            scores[[cfg.pad_id, cfg.bos_id]] = -np.inf
            if scores.argmax() == cfg.eos_id:
                break
            prefix.append(int(scores.argmax()))
        assert decode.greedy(ens, ens.cfg, src[i:i + 1, :n + 1], max_len=10)[0] == prefix[1:]


def test_models_of_another_vocabulary_are_refused_and_the_shortest_limit_holds():
    params, cfg = tiny()
    other, other_cfg = tiny(seed=1, src_vocab=12, tgt_vocab=12)
    with pytest.raises(ValueError, match=r"model 2 .* tgt_vocab 12 \(model 1: 11\)"):
        Ensemble([(params, cfg), (other, other_cfg)])
    with pytest.raises(ValueError, match="at least one"):
        Ensemble([])
    short, short_cfg = tiny(seed=2, max_len=20)
    assert Ensemble([(params, cfg), (short, short_cfg)]).cfg.max_len == 20


# ---- the commands ------------------------------------------------------------------------------

def test_translate_decodes_an_ensemble_and_refuses_another_vocabulary(tmp_path, capsys):
    vocab = train_vocab(TEXT * 4, 40, hard_vocab_limit=False, num_threads=1)
    a = write_checkpoint(tmp_path / "a.npz", vocab)
    b = write_checkpoint(tmp_path / "b.npz", vocab, seed=7)
    lines = TEXT[:3]
    code, out = run(["--checkpoint", a, "--ensemble", b, "--beam", "2"], "\n".join(lines) + "\n")
    assert code == 0
    ens, ens_cfg, _ = translation.load_translators([a, b])
    assert isinstance(ens, Ensemble) and len(ens) == 2
    expected = translation.translate_lines(ens, ens_cfg, vocab, lines, beam=2)
    assert out.splitlines() == [hyps[0][0] for hyps in expected]
    alone = translation.translate_lines(*translation.load_translators([a]), lines, beam=2)
    assert expected != alone                # the second model changes the search
    other = train_vocab(TEXT[::-1] * 4, 36, hard_vocab_limit=False, num_threads=1)
    c = write_checkpoint(tmp_path / "c.npz", other)
    code, out = run(["--checkpoint", a, "--ensemble", c], "a man\n")
    assert code == 2 and out == ""
    err = capsys.readouterr().err
    assert "another vocabulary" in err and str(tmp_path / "c.npz") in err


def test_eval_only_scores_an_ensemble_and_records_its_members(tmp_path):
    vocab = train_vocab(TEXT * 4, 40, hard_vocab_limit=False, num_threads=1)
    a = write_checkpoint(tmp_path / "a.npz", vocab)
    b = write_checkpoint(tmp_path / "b.npz", vocab)
    short = [" ".join(line.split()[:3]) for line in TEXT]          # within the model's max_len
    (tmp_path / "t.en").write_text("\n".join(short[:4]) + "\n")
    (tmp_path / "t.de").write_text("\n".join(short[4:8]) + "\n")
    assert train_wmt.main(["--eval-only", "--checkpoint", a, "--ensemble", b, "--testpref",
                           str(tmp_path / "t"), "--source-lang", "en", "--target-lang", "de",
                           "--quiet"]) == 0
    record = json.loads((tmp_path / "a+b.test.bleu.json").read_text())
    assert [m["checkpoint"] for m in record["ensemble"]] == [a, b]
    assert (tmp_path / "a+b.test.hyp.de").read_text().count("\n") == 4
    with pytest.raises(SystemExit) as exit:
        train_wmt.main(["--trainpref", str(tmp_path / "t"), "--source-lang", "en",
                        "--target-lang", "de", "--ensemble", b, "--out", str(tmp_path / "r")])
    assert exit.value.code == 2
