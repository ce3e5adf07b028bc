"""Text files read in pieces of whole lines, and the two tokenizers of the language model.

    reading     a UTF-8 text file, plain or gzipped, about 4 MiB of whole lines at a time
                (:func:`read_text` reads it whole); a byte-order mark is dropped, bytes that are
                not UTF-8 are an error naming the line
    characters  :class:`CharTokenizer`: the vocabulary is the file's characters, sorted, stored as
                a small JSON document (``CHAR_FORMAT``)
    BPE         :class:`BPETokenizer`: the project's sentencepiece BPE
                (:class:`~minitfm.data.vocab.Vocab`), one line at a time, EOS standing for "\\n"

:func:`load_tokenizer` reads either from its file, :func:`tokenizer_from_array` from the array a
checkpoint stores. :mod:`minitfm.data.text` turns a file into token ids with them.

Host-side code: it uses NumPy deliberately (token ids are host arrays).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from minitfm import files
from minitfm.ids import EOS_ID

from .reading import (READ_ERRORS, UTF8_BOM, DataError, LineDecoder, bounded_lines, open_bytes,
                      read_failed)
from .encoded import TOKEN_DTYPE
from .vocab import Vocab, train_vocab

__all__ = ["CharTokenizer", "BPETokenizer", "Tokenizer", "load_tokenizer", "tokenizer_from_array",
           "read_text", "text_chunks", "CHAR_FORMAT", "CHUNK_BYTES"]

CHAR_FORMAT = "minitfm-char-vocab/1"
CHUNK_BYTES = 1 << 22       # text is read and encoded about 4 MiB of whole lines at a time


# ----------------------------------------------------------------------------- reading text

def text_chunks(path: Path) -> Iterator[str]:
    """The text of ``path`` (plain or gzipped UTF-8, a regular file) in pieces of whole lines,
    in order; a line longer than MAX_LINE_BYTES is a :class:`DataError` naming it.

    Pieces end at a ``\\n`` (except the last), so encoding them one by one and concatenating is
    the same as encoding the whole text. A leading UTF-8 byte-order mark is not part of the text.
    """
    with open_bytes(path) as stream:
        lines = bounded_lines(stream, path)
        decode = LineDecoder(path, stream)      # what a line that is not UTF-8 says of the text
        line, first = 1, True
        while True:
            try:
                data = b"".join(_up_to(lines, CHUNK_BYTES))
            except READ_ERRORS as exc:
                raise read_failed(path, exc) from exc   # the disk's failure, or a damaged gzip
            if not data:
                return
            if first and data.startswith(UTF8_BOM):
                data = data[len(UTF8_BOM):]
            first = False
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:       # the line it is in says why, and where
                begin = data.rfind(b"\n", 0, exc.start) + 1
                end = data.find(b"\n", exc.start)
                decode.utf8 = decode.utf8 or not data[:begin].isascii()
                decode(data[begin:end if end >= 0 else len(data)],     # raises: it is not UTF-8
                       line + data.count(b"\n", 0, begin))
            decode.utf8 = decode.utf8 or not data.isascii()
            line += data.count(b"\n")
            yield text


def _up_to(lines: Iterator[bytes], size: int) -> list[bytes]:
    """The next lines of ``lines``, as many as make ``size`` bytes or just more (or the rest)."""
    taken, total = [], 0
    for line in lines:
        taken.append(line)
        total += len(line)
        if total >= size:
            break
    return taken


def read_text(path: str | Path) -> str:
    """The whole text of a UTF-8 file (for small files; :func:`encode_text_file` streams)."""
    return "".join(text_chunks(Path(path)))


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
        for chunk in text_chunks(path):
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
        with files.replacing(path) as tmp:
            Path(tmp).write_text(json.dumps(document) + "\n", encoding="utf-8")


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
        lines = (line for chunk in text_chunks(Path(path)) for line in chunk.split("\n") if line)
        options.setdefault("source", str(path))       # named in the errors
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


def tokenizer_from_array(kind: str, array: np.ndarray | bytes) -> Tokenizer:
    """The tokenizer from its ``kind`` and :meth:`as_array` (a checkpoint stores both), or those
    bytes."""
    array = np.frombuffer(array, np.uint8) if isinstance(array, bytes) else np.asarray(array)
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
