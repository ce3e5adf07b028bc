"""The shared subword vocabulary: a joint sentencepiece BPE model over both languages.

The paper (section 5.1) encodes WMT14 English-German "using byte-pair encoding, which has a shared
source-target vocabulary of about 37000 tokens". One vocabulary for both sides is also what lets
the model share one embedding matrix between encoder, decoder and the output projection.

The special ids are fixed, whatever the model was trained on, so the rest of the code can rely on
them: ``PAD_ID = 0`` (padding, ignored by the loss), ``UNK_ID = 1``, ``BOS_ID = 2`` (starts the
decoder input), ``EOS_ID = 3`` (ends every source and target sentence). They are defined once, in
``minitfm.ids``, and imported here.

Reproducibility: the same sentences, vocabulary size and seed give a byte-identical model, hence
the same :attr:`Vocab.identifier`. Large corpora are sampled down to ``input_sentence_size``
sentences before training; the sampling is done here, from ``seed``, because sentencepiece's own
sampling does not repeat across processes. ``num_threads`` is recorded inside the model, so it is a
fixed number rather than the machine's core count.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path

import numpy as np
import sentencepiece as spm

from minitfm import files
from minitfm.ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

from .corpus import ParallelReader, file_stamp, parallel_files
from .model_kind import model_kind
from .reading import DataError

__all__ = ["Vocab", "train_vocab", "train_joint_vocab",
           "cached_joint_vocab", "read_metadata", "sample_sentences"]

_SPECIAL_PIECES = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}
# sentencepiece's max_sentence_length, left at its default (set, it would change every model's
# bytes, hence its identifier): longer sentences are skipped in training
SENTENCEPIECE_MAX_BYTES = 4192


class Vocab:
    """A trained sentencepiece model with the fixed special ids, as ids in and text out."""

    def __init__(self, model: bytes):
        """Wrap a serialized sentencepiece model; prefer :meth:`from_bytes` or :meth:`load`."""
        self._model = bytes(model)
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=self._model)
        except (RuntimeError, TypeError) as exc:
            raise DataError(f"not a valid sentencepiece model ({exc})") from exc
        ids = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise DataError(
                f"sentencepiece model has special ids pad/unk/bos/eos = {ids}, but minitfm needs "
                f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; train the vocabulary with train_vocab")

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview | np.ndarray) -> Vocab:
        """The vocabulary from :meth:`serialized_model`'s bytes, or a uint8 array of them."""
        if isinstance(data, np.ndarray):
            if data.dtype != np.uint8 or data.ndim != 1:
                raise DataError(f"a vocabulary array must be 1-D uint8, got {data.dtype} "
                                f"{data.shape}")
            data = data.tobytes()
        return cls(bytes(data))

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        """Read a ``.model`` file written by :meth:`save` (or by sentencepiece)."""
        try:
            return cls(Path(path).read_bytes())
        except OSError as exc:
            files.raise_if_read_failed(path, exc)   # the disk failed the read: not judged
            raise DataError(f"{path}: cannot read the vocabulary model "
                            f"({exc.strerror or exc})") from exc

    def save(self, path: str | Path) -> None:
        """Write the ``.model`` file whole or not at all (``files.replacing``)."""
        with files.replacing(path) as tmp:
            Path(tmp).write_bytes(self._model)

    def serialized_model(self) -> bytes:
        return self._model

    def as_array(self) -> np.ndarray:
        """The serialized model as a uint8 array, to embed in a checkpoint."""
        return np.frombuffer(self._model, dtype=np.uint8).copy()

    @property
    def identifier(self) -> str:
        """Short sha256 of the model: equal identifiers mean the same token ids."""
        return hashlib.sha256(self._model).hexdigest()[:16]

    @property
    def size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def kind(self) -> str:
        """The kind of model, in words: "BPE" (what :func:`train_vocab` trains), "unigram",
        "word" or "character" (a model another program trained), read from the model's
        training record (:func:`minitfm.data.model_kind.model_kind`)."""
        return model_kind(self._model)

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"Vocab(size={self.size}, identifier={self.identifier!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and other._model == self._model

    def __hash__(self) -> int:
        return hash(self._model)

    def encode(self, texts: Sequence[str], *, dropout: float = 0.0) -> list[list[int]]:
        """Token ids of each text, without BOS/EOS (batching adds those).

        ``dropout > 0`` samples a segmentation instead (BPE-dropout, Provilkov et al., 2020):
        each merge is skipped with probability ``dropout``, so a word comes out in smaller
        pieces now and then; the ids still decode to the same text. The samples come from
        sentencepiece's own generator: they differ from call to call and cannot be repeated
        (its seed does not fix them across processes).
        """
        if isinstance(texts, str):
            raise TypeError("Vocab.encode takes a list of strings; wrap a single text in a list")
        if not 0.0 <= dropout < 1.0:
            raise DataError(f"BPE-dropout rate must be in [0, 1), got {dropout}")
        if not dropout:
            return self._sp.encode(list(texts), out_type=int)
        return self._sp.encode(list(texts), out_type=int, enable_sampling=True, alpha=dropout)

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Texts of id sequences: PAD and BOS skipped, each sequence ending at its first EOS."""
        return self._sp.decode([_strip_special(seq) for seq in ids])

    def pieces(self, text: str) -> list[str]:
        """The subword pieces of one text, to look at how it is segmented."""
        return self._sp.encode(text, out_type=str)


def _strip_special(seq: Sequence[int]) -> list[int]:
    out = []
    for token in seq:
        token = int(token)
        if token == EOS_ID:
            break
        if token not in (PAD_ID, BOS_ID):
            out.append(token)
    return out


def sample_sentences(sentences: Iterable[str], size: int, seed: int) -> list[str]:
    """A uniform random sample of ``size`` sentences from a stream, in one pass.

    Reservoir sampling with geometric skips (Li's "Algorithm L"), so only about
    ``size * log(n / size)`` random numbers are drawn for a stream of n sentences.
    """
    stream = iter(sentences)
    reservoir = list(islice(stream, size))
    if len(reservoir) < size:
        return reservoir
    rng = np.random.default_rng(seed)
    weight = math.exp(math.log(1.0 - rng.random()) / size)
    while weight < 1.0:
        skip = math.floor(math.log(1.0 - rng.random()) / math.log1p(-weight))
        chosen = next(islice(stream, skip, None), None)
        if chosen is None:
            break
        reservoir[rng.integers(size)] = chosen
        weight *= math.exp(math.log(1.0 - rng.random()) / size)
    return reservoir


def train_vocab(sentences: Iterable[str], vocab_size: int, *,
                input_sentence_size: int = 2_000_000, shuffle_input_sentence: bool = True,
                seed: int = 0, character_coverage: float = 1.0, hard_vocab_limit: bool = True,
                num_threads: int = 16, source: str = "the training corpus") -> Vocab:
    """Train a BPE vocabulary on ``sentences`` (for a joint vocabulary, both sides of the corpus).

    ``input_sentence_size`` caps the sentences used (0: all of them); with
    ``shuffle_input_sentence`` they are a uniform sample drawn from ``seed``, otherwise the first
    ones. ``hard_vocab_limit=False`` lets a tiny corpus end with fewer pieces than asked.
    ``source`` names the sentences in the messages of errors.

    A training that fails because of the data (no sentence sentencepiece keeps: every line longer
    than SENTENCEPIECE_MAX_BYTES, or only characters its normalization drops; a vocabulary
    larger than the text makes, or smaller than its characters) is a :class:`DataError` that
    says which and what to change, never sentencepiece's own check that failed.
    """
    if vocab_size <= len(_SPECIAL_PIECES):
        raise DataError(f"vocab_size must be larger than the {len(_SPECIAL_PIECES)} special "
                        f"tokens, got {vocab_size}")
    if input_sentence_size and shuffle_input_sentence:
        sentences = sample_sentences(sentences, input_sentence_size, seed)
    elif input_sentence_size:
        sentences = list(islice(sentences, input_sentence_size))
    stream = iter(sentences)
    first = next((sentence for sentence in stream if sentence.strip()), None)  # skips blanks
    if first is None:
        raise DataError(f"no text to train a vocabulary on: {source} is empty (or holds only "
                        f"blank lines)")
    tally = _Tally()
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=tally.counted(itertools.chain([first], stream)),
            model_writer=model, model_type="bpe",
            vocab_size=vocab_size, hard_vocab_limit=hard_vocab_limit,
            character_coverage=character_coverage, input_sentence_size=0,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            pad_piece=_SPECIAL_PIECES["pad"], unk_piece=_SPECIAL_PIECES["unk"],
            bos_piece=_SPECIAL_PIECES["bos"], eos_piece=_SPECIAL_PIECES["eos"],
            num_threads=num_threads, minloglevel=2)
    except RuntimeError as exc:
        raise _training_failed(exc, tally, vocab_size, source) from exc
    return Vocab(model.getvalue())


class _Tally:
    """What sentencepiece was given: the lines with text, how many of them it skips for their
    length (over SENTENCEPIECE_MAX_BYTES of UTF-8) and the longest of those, in bytes."""

    def __init__(self) -> None:
        self.lines = self.too_long = self.longest = 0

    def counted(self, sentences: Iterable[str]) -> Iterator[str]:
        for sentence in sentences:
            if sentence.strip():
                self.lines += 1
                if len(sentence) * 4 > SENTENCEPIECE_MAX_BYTES:     # at most 4 bytes a character
                    size = len(sentence.encode("utf-8", "surrogatepass"))
                    if size > SENTENCEPIECE_MAX_BYTES:
                        self.too_long += 1
                        self.longest = max(self.longest, size)
            yield sentence


def _training_failed(exc: RuntimeError, tally: _Tally, vocab_size: int,
                     source: str) -> DataError:
    """sentencepiece's failure ``exc`` as what is wrong with the data and what to change."""
    text = str(exc)
    # no sentence kept at all, or none with a character left once normalized (blanks kept)
    nothing = "sentences_.empty()" in text or "all_chars_count" in text
    if nothing and tally.lines and tally.too_long == tally.lines:
        return DataError(
            f"no sentence to train a vocabulary on: all {tally.lines:,} lines with text of "
            f"{source} are longer than {SENTENCEPIECE_MAX_BYTES:,} bytes (the longest "
            f"{tally.longest:,}), and sentencepiece skips longer ones: give text with one "
            f"sentence per line (sentences that end in carriage returns alone: convert them to "
            f"line feeds, e.g. with tr '\\r' '\\n')")
    if "sentences_.empty()" in text:
        return DataError(
            f"no sentence to train a vocabulary on: sentencepiece kept none of the "
            f"{tally.lines:,} lines with text of {source} ({tally.too_long:,} of them longer than "
            f"{SENTENCEPIECE_MAX_BYTES:,} bytes, which it skips): give UTF-8 text with one "
            f"sentence per line")
    if "all_chars_count" in text:               # normalization left no character
        found = (f"of the {tally.lines:,} lines with text of {source}, {tally.too_long:,} are "
                 f"longer than {SENTENCEPIECE_MAX_BYTES:,} bytes, which sentencepiece skips, and "
                 f"the others hold only characters its normalization removes"
                 if tally.too_long else
                 f"the {tally.lines:,} lines with text of {source} hold only characters that "
                 f"sentencepiece's normalization removes")
        return DataError(
            f"no characters to train a vocabulary on: {found} (control characters, zero-width "
            f"spaces and the like): check that it is the text meant, in UTF-8")
    most = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)",
                     text)
    if most:
        return DataError(
            f"{source} is too small for a {vocab_size}-piece vocabulary: it makes at most "
            f"{most.group(2)} pieces; lower the vocabulary size (--vocab-size) to "
            f"{most.group(2)} or less, or train on more text")
    fewest = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", text)
    if fewest:
        return DataError(
            f"{source} holds more distinct characters than a {vocab_size}-piece vocabulary "
            f"has room for: every character is a piece, so it needs at least {fewest.group(2)} "
            f"pieces with the special ones; raise the vocabulary size (--vocab-size) to "
            f"{fewest.group(2)} or more")
    return DataError(
        f"sentencepiece training failed: {text.strip()}; check that {source} is UTF-8 text with "
        f"one sentence per line, and for a small corpus lower the vocabulary size (--vocab-size; "
        f"from Python, hard_vocab_limit=False lets it end with fewer pieces than asked)")


def train_joint_vocab(prefix: str | Path, src_lang: str, tgt_lang: str, vocab_size: int, *,
                      skip_invalid: bool = False, **options) -> Vocab:
    """Train one vocabulary on both sides of corpus ``PREFIX.SRC`` / ``PREFIX.TGT``, streaming.

    ``options`` are :func:`train_vocab`'s; the paper's shared vocabulary has about 37000 tokens.
    """
    paths = parallel_files(prefix, src_lang, tgt_lang)
    reader = ParallelReader(*paths, skip_invalid=skip_invalid)
    options.setdefault("source", f"corpus {prefix} ({paths[0]} and {paths[1]})")
    return train_vocab((text for pair in reader for text in pair), vocab_size, **options)


def cached_joint_vocab(prefix: str | Path, src_lang: str, tgt_lang: str, vocab_size: int,
                       directory: str | Path, *, seed: int = 0,
                       announce: Callable[[str], None] = lambda text: None) -> Vocab:
    """The joint vocabulary of corpus ``prefix``, trained once and kept in ``directory``.

    ``directory/spm.SRC-TGT.SIZE.model`` is reused while ``SIZE.json`` beside it records the same
    training files (path, size, modification time), size and seed; otherwise the vocabulary is
    trained again (``announce`` is told) with ``hard_vocab_limit=False``, so a small corpus ends
    with fewer pieces than asked rather than failing.

    The JSON metadata is what makes the cache count: it is removed before the model is written
    and written last, each file whole (``files.replacing``). A model without it, or with one that
    is empty or cut short (a full disk, a crash), is trained again, and ``announce`` says why.
    """
    directory = Path(directory)
    name = f"spm.{src_lang}-{tgt_lang}.{vocab_size}"
    model_path, key_path = directory / f"{name}.model", directory / f"{name}.json"
    key = {"sources": [file_stamp(p) for p in parallel_files(prefix, src_lang, tgt_lang)],
           "vocab_size": vocab_size, "seed": seed}
    stored, broken = read_metadata(key_path, [model_path])
    if stored == key and model_path.is_file():
        try:
            return Vocab.load(model_path)
        except DataError as exc:
            broken = f"{model_path} cannot be used ({exc})"
    if broken:
        announce(f"the vocabulary cache is incomplete: {broken}; training it again")
    announce(f"training a {vocab_size}-piece joint BPE vocabulary on {prefix}")
    vocab = train_joint_vocab(prefix, src_lang, tgt_lang, vocab_size, seed=seed,
                              hard_vocab_limit=False)
    directory.mkdir(parents=True, exist_ok=True)
    key_path.unlink(missing_ok=True)             # the cache is incomplete from here on
    vocab.save(model_path)
    with files.replacing(key_path) as tmp:       # written last: the cache is complete
        Path(tmp).write_text(json.dumps(key, indent=1) + "\n", encoding="utf-8")
    return vocab


def read_metadata(path: Path, data_files: Sequence[Path] = ()) -> tuple[dict | None, str | None]:
    """The JSON object a cache keeps at ``path`` (written last: the cache is complete), or None
    with the reason the cache is broken, in words: the metadata is empty, cut short or unreadable,
    or missing beside the cache's ``data_files``. ``(None, None)``: there is no cache at all. A
    read the disk fails (an I/O error) is no judgement of the cache: ``files.ReadError``. A
    file of the cache that is not a regular file (a named pipe, a device, a folder) is a
    :class:`DataError` naming it, before anything reads or writes it: a pipe would be waited on,
    and a device written in place."""
    for part in (path, *data_files):
        kind = files.kind_of(part)
        if kind is not None:
            raise DataError(f"{part} is {kind}, where a cache keeps a regular file: move it out "
                            f"of {part.parent} (the cache is then made again)")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        left = [p for p in data_files if p.exists()]
        return None, (f"{left[0]} has no metadata {path.name} beside it (its writing was cut "
                      f"short)" if left else None)
    except OSError as exc:
        files.raise_if_read_failed(path, exc)   # the disk failed the read: the cache not judged
        return None, f"its metadata {path} cannot be read ({exc})"
    except UnicodeDecodeError as exc:
        return None, f"its metadata {path} cannot be read ({exc})"
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        return None, (f"its metadata {path} is empty" if not text.strip()
                      else f"its metadata {path} is cut short or damaged")
    return document, None
