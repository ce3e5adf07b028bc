"""Language-model text data: tokenizers, the cached token file, the 90/10 split and the blocks."""

import gzip
import os

import numpy as np
import pytest

from minitfm import backend
from minitfm.data import DataError
from minitfm.data.text import (BLOCKS_STREAM, encode_text_file, load_text, random_blocks,
                               validation_blocks)
from minitfm.data.tokenizers import (BPETokenizer, CharTokenizer, load_tokenizer, read_text,
                                     tokenizer_from_array)
from minitfm.ids import EOS_ID

from .test_vocab import make_sentences

TEXT = "First Citizen:\nBefore we proceed, hear me speak.\n\nAll: Ünïcødé — ok 日本\n"


def make_text(n_lines: int = 200, seed: int = 0) -> str:
    return "\n".join(make_sentences(n_lines, seed)) + "\n"


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text(make_text(), encoding="utf-8")
    return path


# --- character tokenizer -----------------------------------------------------------------------

def test_char_vocabulary_is_the_sorted_characters_and_round_trips():
    tok = CharTokenizer.from_text(TEXT)
    assert tok.chars == "".join(sorted(set(TEXT)))
    assert tok.size == len(set(TEXT)) == len(tok)
    ids = tok.encode(TEXT)
    assert ids.dtype == np.int32 and ids.shape == (len(TEXT),)
    assert [tok.chars[i] for i in ids] == list(TEXT)
    assert tok.decode(ids) == TEXT
    assert tok.decode(ids.tolist()) == TEXT


def test_char_tokenizer_refuses_unknown_characters_and_ids():
    tok = CharTokenizer.from_text("abc\n")
    with pytest.raises(DataError, match=r"characters 'xz' are not in the vocabulary of 4"):
        tok.encode("abzxa")
    with pytest.raises(DataError, match=r"outside the character vocabulary \[0, 3\]"):
        tok.decode([0, 4])
    with pytest.raises(DataError, match="sorted order"):
        CharTokenizer("ba")
    with pytest.raises(DataError, match="empty"):
        CharTokenizer.from_text("")


def test_char_tokenizer_saves_loads_and_embeds_in_an_array(tmp_path):
    tok = CharTokenizer.from_text(TEXT)
    tok.save(tmp_path / "chars.json")
    assert load_tokenizer(tmp_path / "chars.json") == tok
    again = tokenizer_from_array(tok.kind, tok.as_array())
    assert again == tok and again.identifier == tok.identifier
    assert CharTokenizer.from_text("abd").identifier != CharTokenizer.from_text("abc").identifier


def test_char_tokenizer_from_file_matches_from_text(text_file):
    assert CharTokenizer.from_file(text_file) == CharTokenizer.from_text(read_text(text_file))


# --- BPE tokenizer -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    path = tmp_path_factory.mktemp("bpe") / "input.txt"
    path.write_text(make_text(), encoding="utf-8")
    return BPETokenizer.train(path, 100, hard_vocab_limit=False)


def test_bpe_tokenizer_keeps_lines_with_eos_as_newline(bpe):
    text = "the cat runs\n\ndie Katze läuft\n"
    ids = bpe.encode(text)
    assert ids.dtype == np.int32
    assert (ids == EOS_ID).sum() == text.count("\n") == 3
    assert bpe.decode(ids) == text
    assert bpe.vocab.decode([ids[:list(ids).index(EOS_ID)]]) == ["the cat runs"]


def test_bpe_tokenizer_saves_loads_and_embeds_in_an_array(bpe, tmp_path):
    bpe.save(tmp_path / "lm.model")
    assert load_tokenizer(tmp_path / "lm.model") == bpe
    assert tokenizer_from_array("bpe", bpe.as_array()) == bpe
    (tmp_path / "junk").write_bytes(b"\x00\x01 not a model")
    with pytest.raises(DataError, match="neither a character vocabulary"):
        load_tokenizer(tmp_path / "junk")
    with pytest.raises(DataError, match="unknown tokenizer kind"):
        tokenizer_from_array("words", bpe.as_array())


# --- reading and encoding files ----------------------------------------------------------------

def test_encode_text_file_matches_encoding_the_whole_text(text_file, bpe):
    text = read_text(text_file)
    char = CharTokenizer.from_text(text)
    np.testing.assert_array_equal(encode_text_file(text_file, char), char.encode(text))
    np.testing.assert_array_equal(encode_text_file(text_file, bpe), bpe.encode(text))


def test_text_is_read_in_pieces_that_encode_like_the_whole(tmp_path, monkeypatch):
    from minitfm.data import tokenizers as text_module
    monkeypatch.setattr(text_module, "CHUNK_BYTES", 50)   # many pieces of whole lines
    content = make_text(40, seed=3)
    path = tmp_path / "t.txt"
    path.write_text(content, encoding="utf-8")
    pieces = list(text_module.text_chunks(path))
    assert len(pieces) > 5 and "".join(pieces) == content
    assert all(piece.endswith("\n") for piece in pieces)
    char = CharTokenizer.from_text(content)
    np.testing.assert_array_equal(encode_text_file(path, char), char.encode(content))


def test_gzip_and_byte_order_mark(tmp_path):
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(TEXT.encode()))
    (tmp_path / "b.txt").write_bytes(b"\xef\xbb\xbf" + TEXT.encode())
    assert read_text(tmp_path / "a.txt.gz") == TEXT
    assert read_text(tmp_path / "b.txt") == TEXT


def test_bad_files_get_clear_errors(tmp_path):
    tok = CharTokenizer.from_text("abc\n")
    with pytest.raises(DataError, match="no such text file"):
        encode_text_file(tmp_path / "missing.txt", tok)
    with pytest.raises(DataError, match="not a regular file"):
        encode_text_file(tmp_path, tok)
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(DataError, match="holds no text"):
        encode_text_file(tmp_path / "empty.txt", tok)
    with pytest.raises(DataError, match="holds no text"):
        encode_text_file(tmp_path / "empty.txt", tok, tmp_path / "cache")
    with pytest.raises(DataError, match="holds no text"):
        CharTokenizer.from_file(tmp_path / "empty.txt")
    assert not list((tmp_path / "cache").glob("*.npy*"))      # nothing half-written left behind
    (tmp_path / "latin1.txt").write_bytes(b"abc\nabc\nab\xe9c\n")
    with pytest.raises(DataError, match=r"latin1.txt, line 3: invalid UTF-8.*iconv"):
        CharTokenizer.from_file(tmp_path / "latin1.txt")
    with pytest.raises(DataError, match="line 3: invalid UTF-8"):
        encode_text_file(tmp_path / "latin1.txt", tok)


# --- the cache ---------------------------------------------------------------------------------

def test_cache_is_memory_mapped_and_reused(text_file, tmp_path, monkeypatch):
    tok = CharTokenizer.from_file(text_file)
    cache = tmp_path / "cache"
    first = encode_text_file(text_file, tok, cache)
    assert isinstance(first, np.memmap) and not first.flags.writeable
    np.testing.assert_array_equal(first, tok.encode(read_text(text_file)))
    files = sorted(p.name for p in cache.iterdir())
    assert files == [f"input.txt.char-{tok.identifier}.json",
                     f"input.txt.char-{tok.identifier}.tokens.npy"]

    def no_encoding(text):
        raise AssertionError("the cached tokens should have been reused")
    monkeypatch.setattr(tok, "encode", no_encoding)
    np.testing.assert_array_equal(encode_text_file(text_file, tok, cache), first)


def test_cache_is_rebuilt_when_the_file_changes(text_file, tmp_path):
    tok = CharTokenizer.from_file(text_file)
    cache = tmp_path / "cache"
    before = np.array(encode_text_file(text_file, tok, cache))
    # same size, other content, a different modification time
    content = read_text(text_file)
    changed = content[1:] + content[0]
    text_file.write_text(changed, encoding="utf-8")
    stat = text_file.stat()
    os.utime(text_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    after = encode_text_file(text_file, tok, cache)
    np.testing.assert_array_equal(after, tok.encode(changed))
    assert not np.array_equal(after, before)


def test_cache_is_rebuilt_for_another_tokenizer_and_after_a_lost_manifest(text_file, tmp_path,
                                                                          bpe):
    char = CharTokenizer.from_file(text_file)
    cache = tmp_path / "cache"
    encode_text_file(text_file, char, cache)
    np.testing.assert_array_equal(encode_text_file(text_file, bpe, cache),
                                  bpe.encode(read_text(text_file)))
    for manifest in cache.glob("*.json"):
        manifest.unlink()
    np.testing.assert_array_equal(encode_text_file(text_file, char, cache),
                                  char.encode(read_text(text_file)))


# --- splits and batches ------------------------------------------------------------------------

def test_load_text_splits_ninety_ten(text_file):
    tok = CharTokenizer.from_file(text_file)
    data = load_text(text_file, tok, block_size=8)
    tokens = tok.encode(read_text(text_file))
    n_train = int(len(tokens) * 0.9)
    np.testing.assert_array_equal(data.train, tokens[:n_train])
    np.testing.assert_array_equal(data.valid, tokens[n_train:])
    assert data.tokenizer is tok


def test_load_text_refuses_a_text_shorter_than_a_block(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("x" * 100, encoding="utf-8")
    tok = CharTokenizer.from_file(path)
    load_text(path, tok, block_size=9)                   # 10 validation tokens: exactly enough
    with pytest.raises(DataError, match=r"validation part holds 10 .* block_size \+ 1 = 11"):
        load_text(path, tok, block_size=10)
    with pytest.raises(DataError, match=r"training part holds 90 .* block_size \+ 1 = 91"):
        load_text(path, tok, block_size=90, train_fraction=0.9)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        load_text(path, tok, block_size=0)
    with pytest.raises(ValueError, match="train_fraction"):
        load_text(path, tok, block_size=4, train_fraction=1.0)


def test_random_blocks_are_next_token_pairs_and_reproducible():
    tokens = np.arange(1000, dtype=np.int32) * 7     # ids that reveal their position
    x, y = random_blocks(tokens, 16, 12, seed=5, step=3)
    assert x.shape == y.shape == (16, 12) and x.dtype == y.dtype == np.int32
    assert x.flags.c_contiguous and y.flags.c_contiguous
    starts = x[:, 0] // 7
    np.testing.assert_array_equal(x, tokens[starts[:, None] + np.arange(12)])
    np.testing.assert_array_equal(y, tokens[starts[:, None] + np.arange(1, 13)])
    again = random_blocks(tokens, 16, 12, seed=5, step=3)
    np.testing.assert_array_equal(again[0], x)
    expected = backend.host_rng(5, BLOCKS_STREAM, 3).integers(0, 1000 - 12, size=16)
    np.testing.assert_array_equal(starts, expected)
    assert not np.array_equal(random_blocks(tokens, 16, 12, seed=5, step=4)[0], x)
    assert not np.array_equal(random_blocks(tokens, 16, 12, seed=6, step=3)[0], x)


def test_random_blocks_reach_both_ends_and_no_further():
    tokens = np.arange(11, dtype=np.int32)            # block_size 8: starts 0, 1 or 2
    seen = set()
    for step in range(200):
        x, y = random_blocks(tokens, 4, 8, seed=0, step=step)
        seen.update(x[:, 0].tolist())
        assert y.max() <= 10
    assert seen == {0, 1, 2}
    x, y = random_blocks(tokens[:9], 3, 8, seed=0, step=1)   # exactly one block fits
    np.testing.assert_array_equal(x, np.tile(np.arange(8), (3, 1)))
    with pytest.raises(DataError, match=r"8 tokens are fewer than block_size \+ 1 = 9"):
        random_blocks(tokens[:8], 3, 8, seed=0, step=1)


def test_random_blocks_from_a_memory_mapped_cache(text_file, tmp_path):
    tok = CharTokenizer.from_file(text_file)
    data = load_text(text_file, tok, block_size=32, cache_dir=tmp_path / "cache")
    x, y = random_blocks(data.train, 4, 32, seed=0, step=1)
    assert type(x) is np.ndarray and type(y) is np.ndarray
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])


def test_validation_blocks_cover_the_split_once_in_order():
    tokens = np.arange(103, dtype=np.int32)
    batches = list(validation_blocks(tokens, 4, 10))
    assert [b[0].shape for b in batches] == [(4, 10), (4, 10), (2, 10)]   # (103 - 1) // 10 blocks
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    np.testing.assert_array_equal(x.ravel(), np.arange(100))
    np.testing.assert_array_equal(y.ravel(), np.arange(1, 101))
    assert list(validation_blocks(tokens[:11], 4, 10))[0][1].tolist() == [list(range(1, 11))]


def test_validation_blocks_can_be_capped_evenly():
    tokens = np.arange(1001, dtype=np.int32)
    x = np.concatenate([b[0] for b in validation_blocks(tokens, 8, 10, max_blocks=5)])
    np.testing.assert_array_equal(x[:, 0], [0, 250, 500, 740, 990])
    x = np.concatenate([b[0] for b in validation_blocks(tokens, 8, 10, max_blocks=500)])
    assert len(x) == 100
