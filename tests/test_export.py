"""Tests of minitfm.export: models trained here for a few seconds, exported, and run through
CTranslate2, give minitfm's own greedy and beam-4 outputs token for token (post-LN and pre-LN,
shared and separate embeddings; the language model with sinusoidal and learned positions);
safetensors round trips are bit-exact and readable without minitfm; what cannot be exported is
refused with a message, and a failed export leaves nothing behind.

Near-ties: where two hypotheses' scores are within ``TIE`` of each other, float32 rounding in
either engine may pick either. Such differences are printed with their margins and allowed on at
most 1 % of the sentences; any other difference fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import numpy as np
import pytest

from minitfm import backend, checkpoint, tasks
from minitfm.decoding import decode, generation
from minitfm.decoding.batched import pad_batch
from minitfm.decoding.beam import beam_search
from minitfm.models import lm
from minitfm.models import translator as model
from minitfm.data import text as textdata
from minitfm.data.tokenizers import CharTokenizer
from minitfm.data.vocab import train_vocab
from minitfm.export import source
from minitfm.export.__main__ import main
from minitfm.export.source import ExportError
from minitfm.training.state import TrainOptions
from tests.trainrun import train
from minitfm.usable import UnusableCheckpoint
from tests import forkserver

HAVE = {name: importlib.util.find_spec(name) is not None for name in ("ctranslate2", "safetensors")}
needs = {name: pytest.mark.skipif(not found, reason=f"{name} is not installed: the export tests "
                                  f"need the extra, pip install -e '.[export]'")
         for name, found in HAVE.items()}

TIE = 1e-4             # score margin under which float32 rounding may pick either hypothesis
ALLOWED_TIES = 0.01    # of the sentences
MAX_OUT = 20           # output tokens (EOS included) on both sides
SENTENCES = 200


# ---- models trained here ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def vocab():
    """A 16-piece sentencepiece vocabulary (4 specials, 12 pieces) on made-up words."""
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefg"), size=rng.integers(1, 5))) for _ in range(300)]
    lines = [" ".join(words[i:i + 6]) for i in range(0, 300, 6)]
    return train_vocab(lines, 16, num_threads=1)


def translator_config(vocab_size: int, pre_ln: bool, share: bool) -> model.Config:
    return model.Config(src_vocab=vocab_size, tgt_vocab=vocab_size, n_layers=2, d_model=32,
                        d_ff=64, n_heads=4, dropout=0.0, label_smoothing=0.0, pre_ln=pre_ln,
                        share_embeddings=share, max_len=32)


TRANSLATORS = {"post-LN, shared embeddings": (False, True),
               "pre-LN, separate embeddings": (True, False)}


@pytest.fixture(scope="module", params=list(TRANSLATORS))
def translator(request, vocab, tmp_path_factory):
    """A checkpoint of a model trained briefly on the copy task, its sentencepiece vocabulary
    stored in it as train_wmt.py stores it, and its CTranslate2 export."""
    pre_ln, share = TRANSLATORS[request.param]
    cfg = translator_config(vocab.size, pre_ln, share)
    run = tmp_path_factory.mktemp("translator")
    batches = tasks.train_batches("copy", vocab=vocab.size - tasks.FIRST_SYMBOL, length=5,
                                  batch_size=32, seed=0)
    train(cfg, batches, TrainOptions(max_steps=100, warmup=40, lr_factor=2.0,
                                     out_dir=str(run / "run"), progress=False, log_every=100),
          vocab_id=vocab.identifier, vocab_model=vocab.serialized_model())
    path = checkpoint.latest(run / "run")
    assert main([path, "--to", "ctranslate2", "--out", str(run / "ct2"), "--lenpen", "0"]) == 0
    return path, str(run / "ct2")


def load_params(path):
    loaded = source.read_checkpoint(path)
    return checkpoint.params_to_device(loaded.params), loaded.config


def test_sources(cfg, n=SENTENCES, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.integers(tasks.FIRST_SYMBOL, cfg.src_vocab, size=rng.integers(1, 10)).tolist()
            for _ in range(n)]


test_sources.__test__ = False          # a helper, not a test


# ---- comparing outputs ------------------------------------------------------------------------

def log_probs(params, cfg, src: list[int], prefix: list[int]):
    """log P(next | src, prefix) at every position of BOS + prefix, (len(prefix) + 1, V)."""
    xp = backend.xp
    memory, mask, _ = model.encoder_forward(params, cfg, xp.asarray([src + [cfg.eos_id]]))
    h, _ = model.decoder_forward(params, cfg, xp.asarray([[cfg.bos_id] + prefix]), memory, mask)
    z = backend.to_host(model.logits(params, cfg, h)[0]).astype(np.float64)
    return z - np.logaddexp.reduce(z, axis=-1, keepdims=True)


def sequence_score(params, cfg, src, tokens):
    """minitfm's alpha = 0 score: log P(tokens, EOS | src), without EOS at the length limit."""
    lp = log_probs(params, cfg, src, tokens)
    ended = len(tokens) < MAX_OUT
    target = tokens + ([cfg.eos_id] if ended else [])
    return float(sum(lp[t, y] for t, y in enumerate(target)))


def first_step_margin(lp, ours, theirs, eos):
    """|log P(our token) - log P(their token)| where the two outputs first part."""
    j = next(j for j in range(max(len(ours), len(theirs)) + 1)
             if (ours + [eos])[j:j + 1] != (theirs + [eos])[j:j + 1])
    a, b = (ours + [eos])[j], (theirs + [eos])[j]
    return abs(lp[j, a] - lp[j, b])


def check_equal(ours, theirs, margin_of, what):
    """Fail on any difference but a near-tie; allow near-ties on at most 1 % of the sentences."""
    ties = []
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            margin = margin_of(i, a, b)
            print(f"{what}, sentence {i}: minitfm {a} / CTranslate2 {b}, margin {margin:.2e}")
            assert margin < TIE, f"{what}, sentence {i}: outputs differ by {margin:.3g} in score"
            ties.append(i)
    assert len(ties) <= ALLOWED_TIES * len(ours), f"{what}: {len(ties)} near-ties"


def ctranslate2_outputs(translator_dir, sentences, beam, compute_type="default"):
    import ctranslate2
    from minitfm.export import ctranslate2 as export_ct2
    with open(os.path.join(translator_dir, "shared_vocabulary.json"), encoding="utf-8") as f:
        tokens = json.load(f)
    ids = {token: i for i, token in enumerate(tokens)}
    engine = ctranslate2.Translator(translator_dir, device="cpu", intra_threads=1,
                                    compute_type=compute_type)
    results = engine.translate_batch(
        [[tokens[i] for i in s] for s in sentences], return_scores=True,
        **export_ct2.translate_kwargs(beam, 0.0, MAX_OUT, 32))
    return [[ids[t] for t in r.hypotheses[0]] for r in results], [r.scores[0] for r in results]


# ---- CTranslate2: translators -----------------------------------------------------------------

@needs["ctranslate2"]
def test_greedy_is_minitfm_token_for_token(translator):
    path, exported = translator
    params, cfg = load_params(path)
    sentences = test_sources(cfg)
    ours = decode.greedy(params, cfg, pad_batch(sentences, cfg), max_len=MAX_OUT)
    theirs, _ = ctranslate2_outputs(exported, sentences, beam=1)
    assert len({len(o) for o in ours}) > 1, "the test model should not be this trivial"
    check_equal(ours, theirs, lambda i, a, b: first_step_margin(
        log_probs(params, cfg, sentences[i], a), a, b, cfg.eos_id), "greedy")


@needs["ctranslate2"]
def test_beam_4_is_minitfm_token_for_token_and_scores_agree(translator):
    path, exported = translator
    params, cfg = load_params(path)
    sentences = test_sources(cfg)
    found = beam_search(params, cfg, pad_batch(sentences, cfg), beam=4, alpha=0.0,
                               max_len=MAX_OUT)
    ours, our_scores = [h[0][0] for h in found], [h[0][1] for h in found]
    theirs, their_scores = ctranslate2_outputs(exported, sentences, beam=4)
    check_equal(ours, theirs, lambda i, a, b: abs(
        sequence_score(params, cfg, sentences[i], a)
        - sequence_score(params, cfg, sentences[i], b)), "beam 4")
    same = [i for i in range(len(ours)) if ours[i] == theirs[i]]
    # the same log-probabilities: the two forward passes agree to float32 rounding
    np.testing.assert_allclose([their_scores[i] for i in same], [our_scores[i] for i in same],
                               atol=1e-3)


@needs["ctranslate2"]
def test_the_sentencepiece_model_goes_with_the_export(translator, vocab):
    import sentencepiece
    _, exported = translator
    sp = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(exported, "sentencepiece.model"))
    with open(os.path.join(exported, "shared_vocabulary.json"), encoding="utf-8") as f:
        tokens = json.load(f)
    line = "abc gfe dab"
    assert [tokens.index(p) for p in sp.encode(line, out_type=str)] == vocab.encode([line])[0]
    with open(os.path.join(exported, "decoding.json"), encoding="utf-8") as f:
        settings = json.load(f)
    assert settings["method"] == "translate_batch"
    assert settings["kwargs"]["beam_size"] == 4 and settings["kwargs"]["length_penalty"] == 0.0


# ---- CTranslate2: language models ---------------------------------------------------------------

LANGUAGE_MODELS = {"pre-LN, sinusoidal positions": (True, False),
                   "post-LN, learned positions": (False, True)}
STORY = "\n".join(f"{name} {verb} {thing}." for name in ("anna", "bob", "the cat")
                  for verb in ("sees", "likes", "has") for thing in ("a hat", "the sun", "an egg"))


@pytest.fixture(scope="module", params=list(LANGUAGE_MODELS))
def language_model(request, tmp_path_factory):
    pre_ln, learned = LANGUAGE_MODELS[request.param]
    tokenizer = CharTokenizer.from_text(STORY)
    tokens = tokenizer.encode(STORY * 4)
    cfg = lm.LMConfig(vocab=tokenizer.size, n_layers=2, d_model=32, d_ff=64, n_heads=4,
                      pre_ln=pre_ln, learned_positions=learned, max_len=32)
    run = tmp_path_factory.mktemp("lm")

    def batches(epoch):
        step = 1
        while True:
            yield textdata.random_blocks(tokens, 16, 32, 0, step)
            step += 1

    train(cfg, batches, TrainOptions(max_steps=100, warmup=20, lr_factor=2.0,
                                     out_dir=str(run / "run"), progress=False, log_every=100),
          vocab_id=f"char:{tokenizer.identifier}", vocab_model=tokenizer.as_array().tobytes())
    path = checkpoint.latest(run / "run")
    assert main([path, "--to", "ctranslate2", "--out", str(run / "ct2")]) == 0
    return path, str(run / "ct2"), tokenizer, tokens


@needs["ctranslate2"]
def test_language_model_greedy_generation_is_minitfm_token_for_token(language_model):
    import ctranslate2
    from minitfm.export import ctranslate2 as export_ct2
    path, exported, tokenizer, tokens = language_model
    params, cfg = load_params(path)
    starts = np.random.default_rng(2).integers(0, len(tokens) - 8, size=60)
    prompts = np.stack([tokens[s:s + 8] for s in starts]).astype(np.int64)        # (60, 8)
    new = cfg.max_len - prompts.shape[1]                       # fills the context, no sliding
    ours = np.stack([backend.to_host(t) for t in generation.generate(params, cfg, prompts, new,
                                                             greedy=True)], axis=1).tolist()
    engine = ctranslate2.Generator(exported, device="cpu", intra_threads=1)
    results = engine.generate_batch([list(tokenizer.decode(p)) for p in prompts],
                                    **export_ct2.generate_kwargs(new))
    theirs = [tokenizer.encode("".join(r.sequences[0])).tolist() for r in results]

    def margin(i, a, b):
        h, _ = lm.forward(params, cfg, backend.xp.asarray([prompts[i].tolist() + a[:-1]]))
        z = backend.to_host(lm.logits(params, cfg, h)[0]).astype(np.float64)[prompts.shape[1] - 1:]
        j = next(j for j in range(len(a)) if a[j] != b[j])
        return abs(z[j, a[j]] - z[j, b[j]])

    assert len({tuple(o) for o in ours}) > 5, "the test model should not be this trivial"
    check_equal(ours, theirs, margin, "language model, greedy")


# ---- safetensors ----------------------------------------------------------------------------

def saved_model(directory, kind=model.KIND, **config):
    """An untrained model saved as a checkpoint, with a vocabulary (bytes) and extra values."""
    if kind == model.KIND:
        cfg = model.Config.preset("tiny", **config)
        params, vocab = model.init_params(cfg, seed=1), b"\x00sentencepiece bytes\xff"
    else:
        cfg = lm.LMConfig.preset("tiny", **config)
        params, vocab = lm.init_params(cfg, seed=1), "abcdefghijk".encode()
    path = os.path.join(directory, f"{kind}.npz")
    checkpoint.save(path, params, step=7, config=cfg.to_dict(), vocab_id="v:123",
                    vocab_model=vocab, extra={"seed": 5}, kind=kind)
    return path


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@needs["safetensors"]
@pytest.mark.parametrize("kind, config", [(model.KIND, {"share_embeddings": False}),
                                          (lm.KIND, {"learned_positions": True}),
                                          (model.KIND, {"pre_ln": True})])
def test_safetensors_round_trip_is_bit_exact(tmp_path, kind, config):
    path = saved_model(tmp_path, kind, **config)
    original = checkpoint.load(path)
    assert main([path, "--to", "safetensors", "--out", str(tmp_path / "m.safetensors")]) == 0
    assert main([str(tmp_path / "m.safetensors"), "--from", "safetensors",
                 "--out", str(tmp_path / "back.npz")]) == 0
    back = checkpoint.load(tmp_path / "back.npz")
    assert list(back.params) == list(original.params)
    assert all(same_bits(back.params[n], original.params[n]) for n in original.params)
    assert (back.kind, back.config, back.step, back.vocab_id, back.vocab_model, back.extra) == \
        (original.kind, original.config, original.step, original.vocab_id,
         original.vocab_model, original.extra)
    assert back.optimizer_state is None                  # weights only: no resuming from it
    # and the imported model exports to the same tensors and metadata again
    assert main([str(tmp_path / "back.npz"), "--to", "safetensors",
                 "--out", str(tmp_path / "again.safetensors")]) == 0
    from safetensors import safe_open
    with safe_open(str(tmp_path / "m.safetensors"), "numpy") as first, \
            safe_open(str(tmp_path / "again.safetensors"), "numpy") as second:
        assert first.metadata() == second.metadata() and set(first.keys()) == set(second.keys())
        assert all(same_bits(first.get_tensor(n), second.get_tensor(n)) for n in first.keys())


@needs["safetensors"]
def test_safetensors_file_is_read_without_minitfm(tmp_path):
    path = saved_model(tmp_path, share_embeddings=False)
    out = tmp_path / "m.safetensors"
    assert main([path, "--to", "safetensors", "--out", str(out)]) == 0
    program = (
        "import json, sys\n"
        "sys.modules['minitfm'] = None          # any import of minitfm now fails\n"
        "from safetensors import safe_open\n"
        f"with safe_open({str(out)!r}, framework='numpy') as f:\n"
        "    meta = f.metadata()\n"
        "    print(json.dumps({'names': sorted(f.keys()), 'meta': meta,\n"
        "                      'w': f.get_tensor('dec.1.cross_attn.w_kv').tolist()}))\n")
    done = forkserver.run([sys.executable, "-c", program], capture_output=True, text=True,
                          check=True)
    seen = json.loads(done.stdout)
    original = checkpoint.load(path)
    assert seen["names"] == sorted(original.params)
    assert seen["meta"]["format"] == "minitfm" and seen["meta"]["kind"] == "transformer"
    assert json.loads(seen["meta"]["config"]) == original.config
    assert np.array_equal(np.asarray(seen["w"], dtype=np.float32),
                          original.params["dec.1.cross_attn.w_kv"])


@needs["safetensors"]
def test_a_foreign_safetensors_file_is_refused(tmp_path, capsys):
    from safetensors.numpy import save_file
    save_file({"weight": np.zeros((2, 2), np.float32)}, str(tmp_path / "other.safetensors"))
    assert main([str(tmp_path / "other.safetensors"), "--from", "safetensors",
                 "--out", str(tmp_path / "m.npz")]) == 2
    assert "holds no minitfm model" in capsys.readouterr().err
    assert not (tmp_path / "m.npz").exists()


# ---- refusals and whole outputs ---------------------------------------------------------------

def checkpoint_object(path, **changes):
    ckpt = checkpoint.load(path)
    for name, value in changes.items():
        setattr(ckpt, name, value)
    return ckpt


@pytest.mark.parametrize("change, message", [
    (lambda p: p.pop("dec.0.ff.w1"), r"parameter 'dec.0.ff.w1' is missing"),
    (lambda p: p.update(extra_weight=np.zeros(3, np.float32)),
     r"parameter 'extra_weight' is not a parameter of this model"),
    (lambda p: p.update(emb=p["emb"][:5]), r"'emb' has shape \(5, 8\), its config needs \(11, 8\)"),
    (lambda p: p.update(emb=p["emb"].astype(np.float16)), "'emb' is float16"),
    (lambda p: p["enc.0.ln1.gamma"].__setitem__(3, np.nan), "'enc.0.ln1.gamma' holds NaN"),
])
def test_check_loadable_names_what_is_wrong(tmp_path, change, message):
    ckpt = checkpoint.load(saved_model(tmp_path))
    change(ckpt.params)
    with pytest.raises(UnusableCheckpoint, match=message):
        source.check_loadable(ckpt)


def test_check_loadable_refuses_an_unknown_kind_or_config(tmp_path):
    path = saved_model(tmp_path)
    with pytest.raises(UnusableCheckpoint, match="unknown kind 'vision'"):
        source.check_loadable(checkpoint_object(path, kind="vision"))
    with pytest.raises(UnusableCheckpoint, match="not a valid config of .*d_model"):
        source.check_loadable(checkpoint_object(path, config={"d_model": 7, "n_heads": 2}))


@needs["ctranslate2"]
def test_a_model_without_vocabulary_is_refused(tmp_path, capsys):
    cfg = model.Config.preset("tiny")
    path = str(tmp_path / "toy.npz")
    checkpoint.save(path, model.init_params(cfg), step=1, config=cfg.to_dict(), vocab_id="toy-7")
    assert main([path, "--to", "ctranslate2", "--out", str(tmp_path / "ct2")]) == 2
    err = capsys.readouterr().err
    assert "synthetic tasks" in err and "--to safetensors" in err
    assert os.listdir(tmp_path) == ["toy.npz"]           # nothing written, not even a temporary


@needs["ctranslate2"]
def test_an_unknown_quantization_is_refused(translator, tmp_path, capsys):
    path, _ = translator
    assert main([path, "--to", "ctranslate2", "--quantization", "int3",
                 "--out", str(tmp_path / "ct2")]) == 2
    assert "unknown quantization 'int3'" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


@needs["ctranslate2"]
def test_existing_output_needs_force_and_a_failure_leaves_it_as_it_was(translator, tmp_path,
                                                                        monkeypatch, capsys):
    from minitfm.export import ctranslate2 as export_ct2
    path, _ = translator
    out = tmp_path / "ct2"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    assert main([path, "--to", "ctranslate2", "--out", str(out)]) == 2
    assert "exists already" in capsys.readouterr().err

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_ct2, "write_spec", broken)
    assert main([path, "--to", "ctranslate2", "--out", str(out), "--force"]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["ct2"] and os.listdir(out) == ["mine.txt"]
    monkeypatch.undo()
    assert main([path, "--to", "ctranslate2", "--out", str(out), "--force"]) == 0
    assert os.listdir(tmp_path) == ["ct2"]
    assert {"model.bin", "config.json", "shared_vocabulary.json", "sentencepiece.model",
            "decoding.json"} == set(os.listdir(out))


@needs["ctranslate2"]
def test_a_length_penalty_warns_and_records_ctranslate2s_equivalent(translator, tmp_path, capsys):
    path, _ = translator
    assert main([path, "--to", "ctranslate2", "--lenpen", "0.6", "--beam", "5",
                 "--out", str(tmp_path / "ct2")]) == 0
    captured = capsys.readouterr()
    assert "agree only at alpha = 0" in captured.err and "length_penalty=0.48" in captured.err
    assert "beam_size=5, length_penalty=0.48" in captured.out
    settings = json.loads((tmp_path / "ct2" / "decoding.json").read_text())
    assert settings["kwargs"]["length_penalty"] == 0.48
    assert settings["minitfm"]["alpha"] == 0.6


# ---- int8 --------------------------------------------------------------------------------------

INT8_SCORE_BOUND = 0.1      # nats per token: int8 weights, float32 arithmetic, against float32


@pytest.fixture(scope="module")
def confident_translator(vocab, tmp_path_factory):
    """A model that has learned the copy task (on sequences of 5): every greedy step wins by
    several nats (at least 3.2 over six seeds), so that an output is the model's, not a
    rounding's."""
    cfg = translator_config(vocab.size, pre_ln=False, share=True)
    run = tmp_path_factory.mktemp("confident")
    symbols = vocab.size - tasks.FIRST_SYMBOL
    train(cfg, tasks.train_batches("copy", vocab=symbols, length=5, batch_size=64, seed=0),
          TrainOptions(max_steps=500, warmup=100, lr_factor=0.5, out_dir=str(run / "run"),
                       progress=False, log_every=500),
          vocab_id=vocab.identifier, vocab_model=vocab.serialized_model())
    inputs, _ = tasks.held_out("copy", 100, vocab=symbols, length=5, seed=0)
    return checkpoint.latest(run / "run"), inputs.tolist()


@needs["ctranslate2"]
def test_an_int8_export_stores_int8_weights_that_translate_as_minitfm(confident_translator,
                                                                      tmp_path):
    """What the export guarantees on every machine, and only that. CTranslate2's int8 products
    round differently by instruction set: AVX2 multiplies u8 x s8 pairs into int16 that can
    saturate (a token's log-probability off by 3 nats was seen), AVX-512 VNNI does not. So the
    int8 arithmetic is only run, not compared. The stored weights are compared: loaded with
    float32 arithmetic, the int8 export scores every token of minitfm's output within
    INT8_SCORE_BOUND of float32 minitfm (weight rounding alone: at most 0.019 over six seeds),
    and wherever minitfm's every greedy step wins by more than twice the bound, it translates as
    minitfm does."""
    import ctranslate2
    path, sentences = confident_translator
    params, cfg = load_params(path)
    for quantization in ("int8", "float32"):
        assert main([path, "--to", "ctranslate2", "--quantization", quantization, "--lenpen", "0",
                     "--out", str(tmp_path / quantization)]) == 0
    size = {q: (tmp_path / q / "model.bin").stat().st_size for q in ("int8", "float32")}
    assert size["int8"] < 0.4 * size["float32"], size                 # int8 weights, stored
    out = str(tmp_path / "int8")
    tokens = json.loads((tmp_path / "int8" / "shared_vocabulary.json").read_text(encoding="utf-8"))
    ours = decode.greedy(params, cfg, pad_batch(sentences, cfg), max_len=MAX_OUT)

    # int8 arithmetic, as a user runs it: an output for every sentence, within the length limit
    assert ctranslate2.Translator(out, device="cpu").compute_type.startswith("int8")
    outputs, scores = ctranslate2_outputs(out, sentences, beam=1)
    assert all(len(o) <= MAX_OUT for o in outputs) and np.isfinite(scores).all()

    # the stored weights, with float32 arithmetic
    theirs, _ = ctranslate2_outputs(out, sentences, beam=1, compute_type="float32")
    scored = ctranslate2.Translator(out, device="cpu", intra_threads=1,
                                    compute_type="float32").score_batch(
        [[tokens[i] for i in s] for s in sentences], [[tokens[i] for i in o] for o in ours])
    decided = 0
    for src, mine, score, their_output in zip(sentences, ours, scored, theirs):
        lp = log_probs(params, cfg, src, mine)                         # (len(mine) + 1, V)
        target = mine + [cfg.eos_id]
        np.testing.assert_allclose(score.log_probs, lp[np.arange(len(target)), target],
                                   atol=INT8_SCORE_BOUND)
        top2 = np.sort(lp, axis=-1)[:, -2:]
        if (top2[:, 1] - top2[:, 0]).min() > 2 * INT8_SCORE_BOUND:
            decided += 1
            assert their_output == mine
    assert decided >= 0.9 * len(sentences), "the test model should have learned the task"


def test_help_runs():
    done = forkserver.run([sys.executable, "-m", "minitfm.export", "--help"], capture_output=True,
                          text=True, check=True)
    assert "--to {ctranslate2,safetensors}" in done.stdout and "--quantization" in done.stdout
