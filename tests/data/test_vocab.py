"""The sentencepiece vocabulary: fixed special ids, round trips, reproducible training."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minitfm.data import DataError, Vocab, train_joint_vocab, train_vocab
from minitfm.ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from minitfm.data.vocab import sample_sentences

WORDS_EN = "the a cat dog house runs sleeps over under big small green red street".split()
WORDS_DE = ("die eine Katze Hund Haus läuft schläft über unter groß klein grün rot "
            "Straße").split()


def make_sentences(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = WORDS_EN if i % 2 else WORDS_DE
        out.append(" ".join(rng.choice(words, size=rng.integers(3, 12))))
    return out


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return make_sentences(400)


@pytest.fixture(scope="module")
def vocab(sentences) -> Vocab:
    return train_vocab(sentences, 120, hard_vocab_limit=False)


def test_special_ids_are_fixed(vocab):
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert 50 < vocab.size <= 120 and len(vocab) == vocab.size


def test_encode_decode_round_trip(vocab, sentences):
    ids = vocab.encode(sentences[:20])
    assert all(isinstance(t, int) and t > EOS_ID for seq in ids for t in seq)
    assert vocab.decode(ids) == sentences[:20]


def test_decode_strips_specials_and_stops_at_eos(vocab):
    [ids] = vocab.encode(["the big cat"])
    padded = np.array([BOS_ID, *ids, EOS_ID, *ids, PAD_ID, PAD_ID])
    assert vocab.decode([padded, [PAD_ID, *ids]]) == ["the big cat", "the big cat"]
    assert vocab.decode([[EOS_ID, *ids], []]) == ["", ""]


def test_encode_rejects_a_bare_string(vocab):
    with pytest.raises(TypeError, match="list of strings"):
        vocab.encode("the cat")


def test_bpe_dropout_samples_finer_segmentations_of_the_same_text(vocab, sentences):
    texts = sentences[:60]
    usual = vocab.encode(texts)
    sampled = vocab.encode(texts, dropout=0.3)
    assert vocab.decode(sampled) == texts                 # other pieces, the same text
    assert sum(map(len, sampled)) > sum(map(len, usual))  # skipped merges leave more pieces
    assert vocab.encode(texts, dropout=0.3) != sampled    # a new sample every call
    assert vocab.encode(texts, dropout=0.0) == usual
    repeated = vocab.encode([texts[0]] * 20, dropout=0.3)
    assert len({tuple(ids) for ids in repeated}) > 1      # each text is sampled on its own


def test_bpe_dropout_rate_is_checked(vocab):
    for rate in (-0.1, 1.0):
        with pytest.raises(DataError, match=r"BPE-dropout rate must be in \[0, 1\)"):
            vocab.encode(["the cat"], dropout=rate)


def test_serialization_round_trips_and_identifies(vocab, tmp_path):
    copy = Vocab.from_bytes(vocab.serialized_model())
    from_array = Vocab.from_bytes(vocab.as_array())
    vocab.save(tmp_path / "v.model")
    loaded = Vocab.load(tmp_path / "v.model")
    assert copy == from_array == loaded == vocab
    assert vocab.as_array().dtype == np.uint8
    assert len({v.identifier for v in (copy, from_array, loaded, vocab)}) == 1
    assert len(vocab.identifier) == 16 and int(vocab.identifier, 16) >= 0


def test_training_is_deterministic_and_sensitive_to_input(sentences, vocab):
    again = train_vocab(sentences, 120, hard_vocab_limit=False)
    other = train_vocab(sentences[:300], 120, hard_vocab_limit=False)
    assert again.identifier == vocab.identifier
    assert other.identifier != vocab.identifier


SAMPLED_TRAINING = """
from minitfm.data import train_vocab
from tests.data.test_vocab import make_sentences
print(train_vocab(make_sentences(400), 100, input_sentence_size=150, seed=3,
                  hard_vocab_limit=False).identifier)
"""


def test_sampled_training_is_deterministic_across_processes():
    # sentencepiece's own sampling differs from one process to the next; ours must not
    root = Path(__file__).resolve().parents[2]
    runs = [subprocess.run([sys.executable, "-c", SAMPLED_TRAINING], cwd=root, check=True,
                           capture_output=True, text=True) for _ in range(2)]
    identifiers = [run.stdout.strip() for run in runs]
    assert identifiers[0] == identifiers[1] and len(identifiers[0]) == 16
    assert all(run.stderr == "" for run in runs)  # training is quiet


def test_sample_sentences_is_a_deterministic_uniform_sample():
    stream = [str(i) for i in range(2000)]
    sample = sample_sentences(iter(stream), 200, seed=7)
    assert sample == sample_sentences(iter(stream), 200, seed=7)
    assert sample != sample_sentences(iter(stream), 200, seed=8)
    assert len(set(sample)) == 200 and set(sample) <= set(stream)
    assert sample_sentences(iter(stream[:50]), 200, seed=7) == stream[:50]
    # every item has probability 1/10 of being chosen: check the mean index over many draws
    hits = np.zeros(2000)
    for seed in range(50):
        hits[[int(s) for s in sample_sentences(iter(stream), 200, seed)]] += 1
    assert abs(hits[:1000].sum() - hits[1000:].sum()) < 0.1 * hits.sum()


def test_not_a_model():
    with pytest.raises(DataError, match="not a valid sentencepiece model"):
        Vocab.from_bytes(b"definitely not a model")
    with pytest.raises(DataError, match="uint8"):
        Vocab.from_bytes(np.zeros(4, dtype=np.int32))


def test_tiny_vocab_size_is_refused(sentences):
    with pytest.raises(DataError, match="larger than"):
        train_vocab(sentences, 4)


def test_joint_vocab_from_a_corpus_covers_both_sides(sentences, tmp_path):
    (tmp_path / "train.en").write_text("\n".join(sentences[1::2]) + "\n", encoding="utf-8")
    (tmp_path / "train.de").write_text("\n".join(sentences[0::2]) + "\n", encoding="utf-8")
    joint = train_joint_vocab(tmp_path / "train", "en", "de", 120, hard_vocab_limit=False)
    interleaved = [s for pair in zip(sentences[1::2], sentences[0::2]) for s in pair]
    assert joint == train_vocab(interleaved, 120, hard_vocab_limit=False)
    ids = joint.encode(["Straße läuft", "green street"])
    assert UNK_ID not in [t for seq in ids for t in seq]
