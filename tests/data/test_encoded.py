"""Encoded corpora cached as memory-mapped arrays, and when the cache is rebuilt."""

import gzip
import json
import os

import numpy as np
import pytest

from minitfm.data import CleanOptions, DataError, EncodedCorpus, encode_corpus, train_vocab

from .test_vocab import make_sentences


@pytest.fixture(scope="module")
def vocab():
    return train_vocab(make_sentences(300), 100, hard_vocab_limit=False)


@pytest.fixture(scope="module")
def other_vocab():
    return train_vocab(make_sentences(300, seed=1), 90, hard_vocab_limit=False)


@pytest.fixture
def corpus_prefix(tmp_path):
    sentences = make_sentences(60, seed=2)
    src, tgt = sentences[0::2], sentences[1::2]
    src[3] = ""  # something for cleaning to drop
    (tmp_path / "train.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "train.de.gz").write_bytes(gzip.compress(("\n".join(tgt) + "\n").encode()))
    return tmp_path / "train", src, tgt


def test_cache_files_manifest_and_contents(corpus_prefix, vocab, tmp_path):
    prefix, src, tgt = corpus_prefix
    cache = tmp_path / "cache"
    corpus = encode_corpus(prefix, "en", "de", vocab, cache)
    assert sorted(p.name for p in cache.iterdir()) == [
        "train.en-de.de.offsets.npy", "train.en-de.de.tokens.npy",
        "train.en-de.en.offsets.npy", "train.en-de.en.tokens.npy", "train.en-de.json"]
    assert isinstance(corpus.src_tokens, np.memmap) and corpus.src_tokens.dtype == np.int32
    assert corpus.src_offsets.dtype == np.int64 and len(corpus) == len(src) == 30
    for i in range(len(corpus)):
        s, t = corpus[i]
        assert s.tolist() == vocab.encode([src[i]])[0] and t.tolist() == vocab.encode([tgt[i]])[0]
    assert corpus.src_lengths.tolist() == [len(ids) for ids in vocab.encode(src)]
    manifest = json.loads((cache / "train.en-de.json").read_text())
    assert manifest["vocab"] == vocab.identifier == corpus.vocab_identifier
    assert manifest["pairs"] == manifest["read"] == 30


def test_cache_is_reused_while_valid(corpus_prefix, vocab, tmp_path):
    prefix, _, _ = corpus_prefix
    cache = tmp_path / "cache"
    encode_corpus(prefix, "en", "de", vocab, cache)
    stamp = (cache / "train.en-de.en.tokens.npy").stat().st_mtime_ns
    again = encode_corpus(prefix, "en", "de", vocab, cache)
    assert (cache / "train.en-de.en.tokens.npy").stat().st_mtime_ns == stamp
    assert len(again) == 30


def rebuilt(cache, build) -> bool:
    manifest = cache / "train.en-de.json"
    os.utime(manifest, ns=(1, 1))  # an old manifest: a rebuild writes a new one
    build()
    return manifest.stat().st_mtime_ns != 1


def test_cache_is_rebuilt_when_vocab_changes(corpus_prefix, vocab, other_vocab, tmp_path):
    prefix, src, _ = corpus_prefix
    cache = tmp_path / "cache"
    encode_corpus(prefix, "en", "de", vocab, cache)
    assert rebuilt(cache, lambda: encode_corpus(prefix, "en", "de", other_vocab, cache))
    corpus = EncodedCorpus.load(cache, "train.en-de")
    assert corpus.vocab_identifier == other_vocab.identifier
    assert corpus[0][0].tolist() == other_vocab.encode([src[0]])[0]


def test_cache_is_rebuilt_when_a_source_file_changes(corpus_prefix, vocab, tmp_path):
    prefix, src, tgt = corpus_prefix
    cache = tmp_path / "cache"
    encode_corpus(prefix, "en", "de", vocab, cache)
    path = tmp_path / "train.en"
    path.write_text("\n".join(["the new cat"] + src[1:]) + "\n", encoding="utf-8")
    assert rebuilt(cache, lambda: encode_corpus(prefix, "en", "de", vocab, cache))
    first_src = EncodedCorpus.load(cache, "train.en-de")[0][0]
    assert first_src.tolist() == vocab.encode(["the new cat"])[0]
    os.utime(path, ns=(10**18, 10**18))  # same content, new time: rebuilt too
    assert rebuilt(cache, lambda: encode_corpus(prefix, "en", "de", vocab, cache))
    assert not rebuilt(cache, lambda: encode_corpus(prefix, "en", "de", vocab, cache))
    (cache / "train.en-de.de.tokens.npy").unlink()
    assert rebuilt(cache, lambda: encode_corpus(prefix, "en", "de", vocab, cache))


def test_cleaning_is_recorded_and_part_of_the_key(corpus_prefix, vocab, tmp_path):
    prefix, _, _ = corpus_prefix
    cache = tmp_path / "cache"
    plain = encode_corpus(prefix, "en", "de", vocab, cache)
    cleaned = encode_corpus(prefix, "en", "de", vocab, cache, clean=CleanOptions())
    assert len(plain) == 30 and len(cleaned) == 29
    assert cleaned.manifest["clean"] == {"kept": 29, "dropped": {
        "empty": 1, "too_short": 0, "too_long": 0, "ratio": 0, "long_word": 0}}
    assert cleaned.manifest["read"] == 30


def test_misaligned_corpus_leaves_no_cache(tmp_path, vocab):
    (tmp_path / "bad.en").write_text("a\nb\nc\n")
    (tmp_path / "bad.de").write_text("a\nb\n")
    with pytest.raises(DataError, match="3 lines"):
        encode_corpus(tmp_path / "bad", "en", "de", vocab, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []
    with pytest.raises(DataError, match="encode_corpus"):
        EncodedCorpus.load(tmp_path / "cache", "bad.en-de")


def test_in_memory_corpus_from_ids():
    corpus = EncodedCorpus.from_ids([[5, 6], [], [7]], [[8], [9, 10, 11], [12]])
    assert len(corpus) == 3 and corpus.vocab_identifier is None
    assert corpus.src_lengths.tolist() == [2, 0, 1] and corpus.tgt_lengths.tolist() == [1, 3, 1]
    assert [a.tolist() for a in corpus[1]] == [[], [9, 10, 11]]
    with pytest.raises(DataError, match="2 source but 1 target"):
        EncodedCorpus.from_ids([[5], [6]], [[7]])


def test_corrupt_offsets_are_detected():
    with pytest.raises(DataError, match="corrupt"):
        EncodedCorpus(np.arange(3, dtype=np.int32), np.array([0, 2]),
                      np.arange(1, dtype=np.int32), np.array([0, 1]))
