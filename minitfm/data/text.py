"""Language-model data: one text file as a stream of token ids, cut into random blocks.

A language model reads a text as one long sequence and learns to predict each token from the ones
before it. This module turns a UTF-8 text file into that sequence and serves it in batches:

    tokenizer   characters (:class:`CharTokenizer`: the vocabulary is the file's characters,
                sorted) or the project's sentencepiece BPE (:class:`BPETokenizer`, over
                :class:`~minitfm.data.vocab.Vocab`, one line at a time, EOS standing for "\\n");
                both in :mod:`minitfm.data.tokenizers`
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
are reused only while all of those match, and re-encoded otherwise. Each file is written whole
(``files.replacing``); tokens without a manifest, or with an empty or cut-short one, are
re-encoded with a warning saying so.

Host-side code: it uses NumPy deliberately (tokens are gathered on the CPU from a memory-mapped
file; the training loop moves each batch to the device).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minitfm import backend, files

from .corpus import file_stamp
from .reading import DataError
from .encoded import TOKEN_DTYPE, DamagedCache, NpyAppender, load_array
from .vocab import read_metadata
from .tokenizers import Tokenizer, text_chunks

__all__ = ["encode_text_file", "TextData", "load_text", "BLOCKS_STREAM",
           "random_blocks", "validation_blocks"]

FORMAT = "minitfm-text-tokens/1"
BLOCKS_STREAM = 2            # the second part of a batch generator's seed: (seed, stream, step)
_log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- encoded tokens

def encode_text_file(path: str | Path, tokenizer: Tokenizer,
                     cache_dir: str | Path | None = None) -> np.ndarray:
    """(n,) int32 token ids of a whole text file.

    Without ``cache_dir`` the ids are computed and held in memory. With it, they are stored once as
    ``cache_dir/BASENAME.KIND-IDENTIFIER.tokens.npy`` with a ``.json`` manifest, and returned
    memory-mapped (read-only); the cache is rebuilt when the file's size or modification time or
    the tokenizer changes, and when its array does not load or holds another count of tokens
    than its manifest says (cut short, damaged, another text's), which is said.
    """
    path = Path(path)
    if not path.is_file():
        trouble = files.link_trouble(path)
        if trouble is not None:
            raise DataError(f"{path} is {trouble}: point it at a text file, or give the file "
                            f"itself")
        raise DataError(f"{path}: no such text file" if not path.exists()
                        else f"{path}: not a regular file; give the path of a text file")
    if cache_dir is None:
        tokens = [tokenizer.encode(chunk) for chunk in text_chunks(path)]
        tokens = np.concatenate(tokens) if tokens else np.zeros(0, TOKEN_DTYPE)
        _check_not_empty(path, len(tokens))
        return tokens
    cache_dir = Path(cache_dir)
    name = f"{path.name}.{tokenizer.kind}-{tokenizer.identifier}"
    tokens_path, manifest_path = cache_dir / f"{name}.tokens.npy", cache_dir / f"{name}.json"
    key = {"format": FORMAT, "tokenizer": f"{tokenizer.kind}:{tokenizer.identifier}",
           "source": file_stamp(path)}
    manifest, broken = read_metadata(manifest_path, [tokens_path])
    if (manifest is not None and all(manifest.get(k) == v for k, v in key.items())
            and tokens_path.is_file()):
        try:
            tokens = load_array(tokens_path, mmap=True)
            if tokens.ndim != 1 or len(tokens) != manifest.get("count"):
                raise DamagedCache(f"{tokens_path} holds {tokens.shape} tokens, its manifest "
                                   f"says {manifest.get('count')} (cut short, or another text's)")
            return tokens
        except DamagedCache as exc:             # an array cut short or damaged, or another's
            broken = exc.reason
    if broken:
        _log.warning("warning: the token cache %s is incomplete: %s; encoding %s again",
                     tokens_path, broken, path)
    cache_dir.mkdir(parents=True, exist_ok=True)
    manifest_path.unlink(missing_ok=True)     # the cache is incomplete from here on
    with files.replacing(tokens_path) as temporary:
        with NpyAppender(Path(temporary)) as out:
            for chunk in text_chunks(path):
                out.append(tokenizer.encode(chunk))
        _check_not_empty(path, out.count)
    document = dict(key, tokens=tokens_path.name, count=out.count)
    with files.replacing(manifest_path) as temporary:     # written last: the cache is complete
        Path(temporary).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return load_array(tokens_path, mmap=True)


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
