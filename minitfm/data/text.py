"""Language-model data: one text file as a stream of token ids, cut into random blocks.

A language model reads a text as one long sequence and learns to predict each token from the ones
before it. This module turns a UTF-8 text file into that sequence and serves it in batches:

    tokenizer   characters (:class:`CharTokenizer`: the vocabulary is the file's characters,
                sorted) or the project's sentencepiece BPE (:class:`BPETokenizer`, over
                :class:`~minitfm.data.vocab.Vocab`, one line at a time, EOS standing for "\\n")
    tokens      the whole file encoded once (:func:`encode_text_file`); with a cache directory,
                stored as ``NAME.tokens.npy`` and opened memory-mapped, so a large file costs no
                memory and a second run no encoding
    splits      the first 90 % of the tokens for training, the last 10 % for validation
                (:func:`load_text`)
    batches     training: ``B`` random contiguous blocks per step (:func:`random_blocks`);
                validation: fixed, non-overlapping blocks (:func:`validation_blocks`)

A batch is two int32 arrays of shape (B, block_size): the inputs ``x = tokens[s : s + block_size]``
and the next-token targets ``y = tokens[s + 1 : s + block_size + 1]`` for each block start ``s``.

Training batch ``step`` draws its block starts from ``host_rng(seed, BLOCKS_STREAM, step)``, as
the toy tasks draw theirs (:mod:`minitfm.tasks`): a function of the seed and the step alone, so a
resumed run sees exactly the batches an uninterrupted one would.

The cache follows :mod:`minitfm.data.encoded`: a JSON manifest, written last, records the text
file's resolved path, size and modification time and the tokenizer's identifier; the cached tokens
are reused only while all of those match, and re-encoded otherwise.

Host-side code: it uses NumPy deliberately (tokens are gathered on the CPU from a memory-mapped
file; the training loop moves each batch to the device).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minitfm import backend

from .corpus import DataError, _open_bytes, file_stamp
from .encoded import TOKEN_DTYPE, _load_array, _NpyAppender, _read_manifest
from .vocab import EOS_ID, Vocab, train_vocab

__all__ = ["CharTokenizer", "BPETokenizer", "Tokenizer", "load_tokenizer", "tokenizer_from_array",
           "read_text", "encode_text_file", "TextData", "load_text", "BLOCKS_STREAM",
           "random_blocks", "validation_blocks"]

FORMAT = "minitfm-text-tokens/1"
CHAR_FORMAT = "minitfm-char-vocab/1"
BLOCKS_STREAM = 2            # the second part of a batch generator's seed: (seed, stream, step)
_CHUNK_BYTES = 1 << 22       # text is read and encoded about 4 MiB of whole lines at a time
_UTF8_BOM = b"\xef\xbb\xbf"


# ----------------------------------------------------------------------------- reading text

def _text_chunks(path: Path) -> Iterator[str]:
    """The text of ``path`` (plain or gzipped UTF-8) in pieces of whole lines, in order.

    Pieces end at a ``\\n`` (except the last), so encoding them one by one and concatenating is
    the same as encoding the whole text. A leading UTF-8 byte-order mark is not part of the text.
    """
    with _open_bytes(path) as stream:
        line = 1
        first = True
        while True:
            try:
                data = b"".join(stream.readlines(_CHUNK_BYTES))
            except (OSError, EOFError) as exc:
                raise DataError(f"{path}: read failed ({exc}); the file is corrupt or truncated, "
                                "re-create it") from exc
            if not data:
                return
            if first and data.startswith(_UTF8_BOM):
                data = data[len(_UTF8_BOM):]
            first = False
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                where = line + data.count(b"\n", 0, exc.start)
                raise DataError(f"{path}, line {where}: invalid UTF-8 ({exc.reason}); the text "
                                "must be UTF-8: convert it, e.g. `iconv -t UTF-8`") from None
            line += data.count(b"\n")
            yield text


def read_text(path: str | Path) -> str:
    """The whole text of a UTF-8 file (for small files; :func:`encode_text_file` streams)."""
    return "".join(_text_chunks(Path(path)))


# ----------------------------------------------------------------------------- tokenizers

class CharTokenizer:
    """Character-level tokens: id ``i`` is ``chars[i]``, the text's characters in sorted order.

    Every character of the text is its own token, so ``decode(encode(text)) == text`` exactly;
    a character outside the vocabulary is an error, not a silent unknown token.
    """

    kind = "char"

    def __init__(self, chars: str):
        if not chars:
            raise DataError("a character vocabulary needs at least one character")
        if list(chars) != sorted(set(chars)):
            raise DataError("a character vocabulary lists each character once, in sorted order; "
                            "build it with CharTokenizer.from_text or CharTokenizer.from_file")
        self.chars = chars
        # (V,) uint32 code points, ascending: sorted characters are sorted code points
        self._codepoints = np.frombuffer(chars.encode("utf-32-le"), dtype=np.uint32)

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        if not text:
            raise DataError("cannot build a character vocabulary from empty text")
        return cls("".join(sorted(set(text))))

    @classmethod
    def from_file(cls, path: str | Path) -> CharTokenizer:
        """The vocabulary of the characters in a UTF-8 file, read in pieces."""
        path = Path(path)
        seen: set[str] = set()
        for chunk in _text_chunks(path):
            seen.update(chunk)
        if not seen:
            raise DataError(f"{path} holds no text: a language model needs a non-empty file")
        return cls("".join(sorted(seen)))

    @property
    def size(self) -> int:
        return len(self.chars)

    def __len__(self) -> int:
        return self.size

    @property
    def identifier(self) -> str:
        """Short sha256 of the characters: equal identifiers mean the same token ids."""
        return hashlib.sha256(self.chars.encode("utf-8")).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"CharTokenizer(size={self.size}, identifier={self.identifier!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars

    def __hash__(self) -> int:
        return hash(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """(n,) int32 ids of the n characters of ``text``."""
        codepoints = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # (n,)
        ids = np.minimum(np.searchsorted(self._codepoints, codepoints), self.size - 1)
        unknown = self._codepoints[ids] != codepoints
        if unknown.any():
            missing = "".join(sorted({chr(c) for c in codepoints[unknown]}))
            raise DataError(f"characters {missing!r} are not in the vocabulary of "
                            f"{self.size} characters the model was trained with; remove them")
        return ids.astype(TOKEN_DTYPE)

    def decode(self, ids) -> str:
        """The text of a sequence of ids."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.size):
            raise DataError(f"token ids in [{ids.min()}, {ids.max()}] are outside the character "
                            f"vocabulary [0, {self.size - 1}]")
        return self._codepoints[ids].tobytes().decode("utf-32-le")

    def as_array(self) -> np.ndarray:
        """The characters as UTF-8 bytes in a uint8 array, to embed in a checkpoint."""
        return np.frombuffer(self.chars.encode("utf-8"), dtype=np.uint8).copy()

    def save(self, path: str | Path) -> None:
        document = {"format": CHAR_FORMAT, "chars": self.chars}
        Path(path).write_text(json.dumps(document) + "\n", encoding="utf-8")


class BPETokenizer:
    """The project's sentencepiece BPE (:class:`Vocab`) over running text.

    sentencepiece encodes a line at a time (it reads a newline as a space), so a text is encoded
    line by line with ``EOS_ID`` between lines, standing for ``"\\n"``; :meth:`decode` turns each
    EOS back into a newline. A round trip keeps the lines and words but not every whitespace
    detail: sentencepiece's normalisation collapses runs of spaces and strips them at line ends.
    """

    kind = "bpe"

    def __init__(self, vocab: Vocab):
        self.vocab = vocab

    @classmethod
    def train(cls, path: str | Path, vocab_size: int, **options) -> BPETokenizer:
        """Train a BPE vocabulary on the lines of a text file; ``options`` are ``train_vocab``'s.

        Like the character vocabulary, it is fitted on the whole file, validation part included.
        """
        lines = (line for chunk in _text_chunks(Path(path)) for line in chunk.split("\n") if line)
        return cls(train_vocab(lines, vocab_size, **options))

    @property
    def size(self) -> int:
        return self.vocab.size

    def __len__(self) -> int:
        return self.size

    @property
    def identifier(self) -> str:
        return self.vocab.identifier

    def __repr__(self) -> str:
        return f"BPETokenizer(size={self.size}, identifier={self.identifier!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BPETokenizer) and other.vocab == self.vocab

    def __hash__(self) -> int:
        return hash(self.vocab)

    def encode(self, text: str) -> np.ndarray:
        """(n,) int32 ids: each line's pieces, with one EOS for each ``\\n``."""
        ids: list[int] = []
        for k, line_ids in enumerate(self.vocab.encode(text.split("\n"))):
            if k:
                ids.append(EOS_ID)
            ids.extend(line_ids)
        return np.asarray(ids, dtype=TOKEN_DTYPE)

    def decode(self, ids) -> str:
        """The text of a sequence of ids, each EOS a newline."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if ids and (min(ids) < 0 or max(ids) >= self.size):
            raise DataError(f"token ids in [{min(ids)}, {max(ids)}] are outside the vocabulary "
                            f"[0, {self.size - 1}]")
        lines: list[list[int]] = [[]]
        for token in ids:
            if token == EOS_ID:
                lines.append([])
            else:
                lines[-1].append(token)
        return "\n".join(self.vocab.decode(lines))

    def as_array(self) -> np.ndarray:
        """The serialized sentencepiece model as a uint8 array, to embed in a checkpoint."""
        return self.vocab.as_array()

    def save(self, path: str | Path) -> None:
        """Write the sentencepiece ``.model`` file."""
        self.vocab.save(path)


Tokenizer = CharTokenizer | BPETokenizer


def tokenizer_from_array(kind: str, array: np.ndarray) -> Tokenizer:
    """The tokenizer from its ``kind`` and :meth:`as_array` (a checkpoint stores both)."""
    array = np.asarray(array)
    if array.dtype != np.uint8 or array.ndim != 1:
        raise DataError(f"a tokenizer array must be 1-D uint8, got {array.dtype} {array.shape}")
    if kind == CharTokenizer.kind:
        try:
            return CharTokenizer(array.tobytes().decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise DataError(f"the stored character vocabulary is not UTF-8 ({exc.reason}); "
                            "the checkpoint is corrupt") from None
    if kind == BPETokenizer.kind:
        return BPETokenizer(Vocab.from_bytes(array))
    raise DataError(f"unknown tokenizer kind {kind!r}: expected 'char' or 'bpe'")


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read a tokenizer written by ``save``: a character vocabulary (JSON) or a ``.model`` file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read the tokenizer ({exc.strerror or exc})") from exc
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        document = None
    if isinstance(document, dict) and document.get("format") == CHAR_FORMAT:
        chars = document.get("chars")
        if not isinstance(chars, str):
            raise DataError(f"{path}: a character vocabulary file needs a 'chars' string")
        return CharTokenizer(chars)
    try:
        return BPETokenizer(Vocab(data))
    except DataError as exc:
        raise DataError(f"{path}: neither a character vocabulary ({CHAR_FORMAT}) nor a "
                        f"sentencepiece model: {exc}") from None


# ----------------------------------------------------------------------------- encoded tokens

def encode_text_file(path: str | Path, tokenizer: Tokenizer,
                     cache_dir: str | Path | None = None) -> np.ndarray:
    """(n,) int32 token ids of a whole text file.

    Without ``cache_dir`` the ids are computed and held in memory. With it, they are stored once as
    ``cache_dir/BASENAME.KIND-IDENTIFIER.tokens.npy`` with a ``.json`` manifest, and returned
    memory-mapped (read-only); the cache is rebuilt when the file's size or modification time or
    the tokenizer changes.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such text file" if not path.exists()
                        else f"{path}: not a regular file; give the path of a text file")
    if cache_dir is None:
        tokens = [tokenizer.encode(chunk) for chunk in _text_chunks(path)]
        tokens = np.concatenate(tokens) if tokens else np.zeros(0, TOKEN_DTYPE)
        _check_not_empty(path, len(tokens))
        return tokens
    cache_dir = Path(cache_dir)
    name = f"{path.name}.{tokenizer.kind}-{tokenizer.identifier}"
    tokens_path, manifest_path = cache_dir / f"{name}.tokens.npy", cache_dir / f"{name}.json"
    key = {"format": FORMAT, "tokenizer": f"{tokenizer.kind}:{tokenizer.identifier}",
           "source": file_stamp(path)}
    manifest = _read_manifest(manifest_path)
    if (manifest is not None and all(manifest.get(k) == v for k, v in key.items())
            and tokens_path.is_file()):
        return _load_array(tokens_path, mmap=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    manifest_path.unlink(missing_ok=True)     # the cache is incomplete from here on
    temporary = tokens_path.with_name(tokens_path.name + ".tmp")
    try:
        with _NpyAppender(temporary) as out:
            for chunk in _text_chunks(path):
                out.append(tokenizer.encode(chunk))
        _check_not_empty(path, out.count)
        os.replace(temporary, tokens_path)
    finally:
        temporary.unlink(missing_ok=True)
    document = dict(key, tokens=tokens_path.name, count=out.count)
    temporary_manifest = manifest_path.with_name(manifest_path.name + ".tmp")
    temporary_manifest.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary_manifest, manifest_path)
    return _load_array(tokens_path, mmap=True)


def _check_not_empty(path: Path, count: int) -> None:
    if count == 0:
        raise DataError(f"{path} holds no text: a language model needs a non-empty file")


@dataclass(frozen=True)
class TextData:
    """A text's tokens split in two: ``train`` the first part, ``valid`` the rest."""

    tokenizer: Tokenizer
    train: np.ndarray    # (n_train,) int32, possibly memory-mapped
    valid: np.ndarray    # (n_valid,) int32


def load_text(path: str | Path, tokenizer: Tokenizer, *, block_size: int,
              cache_dir: str | Path | None = None, train_fraction: float = 0.9) -> TextData:
    """The tokens of a text file, the first ``train_fraction`` (``int(n * 0.9)``) for training.

    Both parts must hold at least ``block_size + 1`` tokens, one block and its next-token targets.
    """
    block_size = _positive_int(block_size, "block_size")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be between 0 and 1, got {train_fraction}")
    tokens = encode_text_file(path, tokenizer, cache_dir)
    n_train = int(len(tokens) * train_fraction)
    data = TextData(tokenizer, tokens[:n_train], tokens[n_train:])
    for part, split in (("training", data.train), ("validation", data.valid)):
        if len(split) < block_size + 1:
            raise DataError(
                f"{path}: the {part} part holds {len(split)} of the text's {len(tokens)} tokens, "
                f"fewer than block_size + 1 = {block_size + 1}; use a longer text or a smaller "
                f"block size")
    return data


# ----------------------------------------------------------------------------- batches

def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def _blocks(tokens: np.ndarray, starts: np.ndarray, block_size: int) -> tuple[np.ndarray, ...]:
    window = np.asarray(tokens[starts[:, None] + np.arange(block_size + 1)])  # (B, block_size + 1)
    return np.ascontiguousarray(window[:, :-1]), np.ascontiguousarray(window[:, 1:])


def _check_length(tokens: np.ndarray, block_size: int) -> None:
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be a 1-D array of ids, got shape {tokens.shape}")
    if len(tokens) < block_size + 1:
        raise DataError(f"{len(tokens)} tokens are fewer than block_size + 1 = "
                        f"{block_size + 1}: use a longer text or a smaller block size")


def random_blocks(tokens: np.ndarray, batch_size: int, block_size: int, seed: int,
                  step: int) -> tuple[np.ndarray, np.ndarray]:
    """Training batch ``step``: ``x, y`` int32 (batch_size, block_size), y = x shifted by one.

    The block starts are uniform over ``[0, n - block_size - 1]`` (every complete block of
    ``block_size + 1`` tokens), drawn from ``host_rng(seed, BLOCKS_STREAM, step)``.
    """
    batch_size = _positive_int(batch_size, "batch_size")
    block_size = _positive_int(block_size, "block_size")
    _check_length(tokens, block_size)
    rng = backend.host_rng(seed, BLOCKS_STREAM, step)
    starts = rng.integers(0, len(tokens) - block_size, size=batch_size)  # (B,)
    return _blocks(tokens, starts, block_size)


def validation_blocks(tokens: np.ndarray, batch_size: int, block_size: int,
                      max_blocks: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Batches ``x, y`` (<= batch_size, block_size) of fixed, non-overlapping blocks.

    Block ``i`` starts at ``i * block_size``; all ``(n - 1) // block_size`` of them, so each
    token but the last few is a target exactly once, or, with ``max_blocks``, that many evenly
    spaced ones. The same for every seed and run, so validation losses compare across runs. The
    last batch may be smaller.
    """
    batch_size = _positive_int(batch_size, "batch_size")
    block_size = _positive_int(block_size, "block_size")
    _check_length(tokens, block_size)
    n_blocks = (len(tokens) - 1) // block_size
    chosen = np.arange(n_blocks)
    if max_blocks is not None:
        max_blocks = _positive_int(max_blocks, "max_blocks")
        if max_blocks < n_blocks:
            chosen = np.unique(np.linspace(0, n_blocks - 1, max_blocks).round().astype(np.int64))
    starts = chosen * block_size
    for first in range(0, len(starts), batch_size):
        yield _blocks(tokens, starts[first:first + batch_size], block_size)
