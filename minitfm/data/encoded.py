"""Token-id corpora cached on disk as memory-mapped NumPy arrays.

Encoding WMT14's 4.5M sentence pairs takes minutes and, held as Python lists of ints, several
gigabytes. So a corpus is encoded once, streaming, and stored per side as two plain ``.npy`` files:

    NAME.LANG.tokens.npy    int32 (n_tokens,)   every sentence's ids, concatenated, no BOS/EOS
    NAME.LANG.offsets.npy   int64 (n_pairs + 1,) sentence i is tokens[offsets[i]:offsets[i + 1]]

plus ``NAME.json``, a manifest written last (its presence means the cache is complete; it is
removed before the arrays are written, and each file is written whole by ``files.replacing``)
recording
the vocabulary identifier, each source file's resolved path, size and modification time, the
cleaning options and the counts of what was kept and dropped. :func:`encode_corpus` reuses the
cache only if all of those still match, and re-encodes otherwise; a cache whose manifest is
missing, empty or cut short (a full disk, a crash), or one of whose arrays does not load (cut
short, damaged), is re-encoded, saying so (a warning on the log, which Python prints on standard
error). Arrays are opened with ``np.load(..., mmap_mode="r")``: the operating system pages in
what batches touch.

``NAME`` is ``BASENAME.SRC-TGT`` for corpus prefix ``.../BASENAME``, e.g. ``train.en-de``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import BinaryIO

import numpy as np
from tqdm import tqdm

from .clean import CleanOptions, CleanReport, filter_pairs
from .corpus import ParallelReader, file_stamp, parallel_files
from .reading import DataError
from minitfm import files as whole_files

from .vocab import Vocab, read_metadata

__all__ = ["EncodedCorpus", "encode_corpus", "cache_name", "load_array", "NpyAppender", "TOKEN_DTYPE"]

FORMAT = "minitfm-encoded-corpus/1"
TOKEN_DTYPE = np.int32
OFFSET_DTYPE = np.int64
_CHUNK = 10_000  # sentence pairs encoded per call into sentencepiece
_log = logging.getLogger(__name__)


class EncodedCorpus:
    """Aligned token-id sentences, both sides as flat token arrays plus offsets.

    ``corpus[i]`` is the pair ``(src_ids, tgt_ids)`` of int32 arrays (no BOS/EOS);
    ``src_lengths`` / ``tgt_lengths`` hold every sentence's token count, for batching.
    """

    def __init__(self, src_tokens: np.ndarray, src_offsets: np.ndarray,
                 tgt_tokens: np.ndarray, tgt_offsets: np.ndarray, manifest: dict | None = None):
        _check_side("source", src_tokens, src_offsets)
        _check_side("target", tgt_tokens, tgt_offsets)
        if len(src_offsets) != len(tgt_offsets):
            raise DataError(f"encoded corpus: {len(src_offsets) - 1} source but "
                            f"{len(tgt_offsets) - 1} target sentences")
        self.src_tokens, self.src_offsets = src_tokens, src_offsets
        self.tgt_tokens, self.tgt_offsets = tgt_tokens, tgt_offsets
        self.manifest = manifest or {}
        self.src_lengths = np.diff(src_offsets)  # (n,) int64
        self.tgt_lengths = np.diff(tgt_offsets)  # (n,) int64

    @classmethod
    def from_ids(cls, src_ids: Sequence[Sequence[int]],
                 tgt_ids: Sequence[Sequence[int]]) -> EncodedCorpus:
        """An in-memory corpus from lists of id lists (toy tasks, tests, small dev sets)."""
        return cls(*_flatten(src_ids), *_flatten(tgt_ids))

    @classmethod
    def load(cls, cache_dir: str | Path, name: str, *, mmap: bool = True) -> EncodedCorpus:
        """Open the cached corpus ``NAME`` in ``cache_dir`` (see :func:`encode_corpus`)."""
        cache_dir = Path(cache_dir)
        manifest, _ = read_metadata(cache_dir / f"{name}.json")
        if manifest is None:
            raise DataError(f"{cache_dir / (name + '.json')}: no complete encoded corpus there; "
                            "build it with encode_corpus")
        files = manifest["files"]
        arrays = [load_array(cache_dir / files[key], mmap)
                  for key in ("src_tokens", "src_offsets", "tgt_tokens", "tgt_offsets")]
        return cls(*arrays, manifest=manifest)

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        src = self.src_tokens[self.src_offsets[i]:self.src_offsets[i + 1]]
        tgt = self.tgt_tokens[self.tgt_offsets[i]:self.tgt_offsets[i + 1]]
        return np.asarray(src), np.asarray(tgt)

    @property
    def vocab_identifier(self) -> str | None:
        """The identifier of the vocabulary that encoded this corpus (None if built in memory)."""
        return self.manifest.get("vocab")

    def __repr__(self) -> str:
        return (f"EncodedCorpus({len(self)} pairs, {len(self.src_tokens)} + "
                f"{len(self.tgt_tokens)} tokens)")


class DamagedCache(DataError):
    """A cached array that cannot be used: ``reason`` says why (the message adds the fix)."""

    def __init__(self, reason: str):
        super().__init__(f"{reason}; delete the cache to rebuild it")
        self.reason = reason


def _check_side(side: str, tokens: np.ndarray, offsets: np.ndarray) -> None:
    if tokens.ndim != 1 or offsets.ndim != 1 or len(offsets) < 1:
        raise DataError(f"encoded corpus: {side} tokens and offsets must be 1-D, offsets non-empty")
    if offsets[0] != 0 or offsets[-1] != len(tokens):
        raise DamagedCache(f"encoded corpus: {side} offsets must run from 0 to the token count "
                           f"{len(tokens)}, got {offsets[0]}..{offsets[-1]} (the cache is "
                           f"corrupt)")


def _flatten(ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(seq) for seq in ids), dtype=OFFSET_DTYPE, count=len(ids))
    offsets = np.zeros(len(ids) + 1, dtype=OFFSET_DTYPE)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.fromiter((t for seq in ids for t in seq), dtype=TOKEN_DTYPE, count=int(offsets[-1]))
    return tokens, offsets


def load_array(path: Path, mmap: bool) -> np.ndarray:
    """A cached ``.npy`` array (memory-mapped with ``mmap``); a damaged file is a DataError, a
    read the disk fails a ``minitfm.files.ReadError``."""
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError) as exc:
        if isinstance(exc, OSError):            # the disk failed the read: the file not judged
            whole_files.raise_if_read_failed(path, exc)
        raise DamagedCache(f"{path}: cannot load cached array ({exc})") from exc


# ----------------------------------------------------------------------------- building the cache

def cache_name(prefix: str | Path, src_lang: str, tgt_lang: str) -> str:
    """The cache name of corpus ``prefix``: ``BASENAME.SRC-TGT``."""
    return f"{Path(prefix).name}.{src_lang}-{tgt_lang}"


def encode_corpus(prefix: str | Path, src_lang: str, tgt_lang: str, vocab: Vocab,
                  cache_dir: str | Path, *, clean: CleanOptions | None = None,
                  skip_invalid: bool = False, progress: bool = False) -> EncodedCorpus:
    """The corpus ``PREFIX.SRC`` / ``PREFIX.TGT`` encoded with ``vocab``, from cache when valid.

    With ``clean`` the pairs are filtered as in :mod:`minitfm.data.clean` before encoding (use it
    for training data only). The result's ``manifest`` has the counts: ``read``, ``pairs``,
    ``skipped_invalid`` and ``clean`` (the report per reason).
    """
    cache_dir = Path(cache_dir)
    src_path, tgt_path = parallel_files(prefix, src_lang, tgt_lang)
    name = cache_name(prefix, src_lang, tgt_lang)
    key = _cache_key(src_path, tgt_path, src_lang, tgt_lang, vocab, clean, skip_invalid)
    names = _file_names(name, src_lang, tgt_lang)
    manifest, broken = read_metadata(cache_dir / f"{name}.json",
                                     [cache_dir / file for file in names.values()])
    if (manifest is not None and all(manifest.get(k) == v for k, v in key.items())
            and all((cache_dir / file).is_file() for file in manifest["files"].values())):
        try:
            return EncodedCorpus.load(cache_dir, name)
        except DamagedCache as exc:         # an array cut short or damaged, or another's
            broken = exc.reason
    if broken:
        _log.warning("warning: the token cache %s in %s is incomplete: %s; encoding it again", name,
                     cache_dir, broken)
    elif manifest is not None:
        _log.info("re-encoding %s: its source files, vocabulary or options changed", name)
    cache_dir.mkdir(parents=True, exist_ok=True)
    _build(cache_dir, name, key, ParallelReader(src_path, tgt_path, skip_invalid=skip_invalid),
           vocab, clean, progress)
    return EncodedCorpus.load(cache_dir, name)


def _cache_key(src_path: Path, tgt_path: Path, src_lang: str, tgt_lang: str, vocab: Vocab,
               clean: CleanOptions | None, skip_invalid: bool) -> dict:
    """What the cache depends on; a stored manifest must match every entry to be reused."""
    return {
        "format": FORMAT,
        "vocab": vocab.identifier,
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
        "sources": [file_stamp(src_path), file_stamp(tgt_path)],
        "clean_options": clean.to_dict() if clean is not None else None,
        "skip_invalid": skip_invalid,
    }


@dataclass
class _Side:
    """One side being written: tokens appended to an ``.npy`` file, lengths kept in memory."""

    tokens: NpyAppender
    lengths: list[np.ndarray]

    def add(self, ids: list[list[int]]) -> None:
        self.lengths.append(np.fromiter(map(len, ids), dtype=OFFSET_DTYPE, count=len(ids)))
        self.tokens.append(np.fromiter((t for seq in ids for t in seq), dtype=TOKEN_DTYPE))

    def offsets(self) -> np.ndarray:
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, OFFSET_DTYPE)
        offsets = np.zeros(len(lengths) + 1, dtype=OFFSET_DTYPE)
        np.cumsum(lengths, out=offsets[1:])
        return offsets


def _file_names(name: str, src_lang: str, tgt_lang: str) -> dict[str, str]:
    return {"src_tokens": f"{name}.{src_lang}.tokens.npy",
            "src_offsets": f"{name}.{src_lang}.offsets.npy",
            "tgt_tokens": f"{name}.{tgt_lang}.tokens.npy",
            "tgt_offsets": f"{name}.{tgt_lang}.offsets.npy"}


def _build(cache_dir: Path, name: str, key: dict, reader: ParallelReader, vocab: Vocab,
           clean: CleanOptions | None, progress: bool) -> None:
    names = _file_names(name, key["src_lang"], key["tgt_lang"])
    manifest_path = cache_dir / f"{name}.json"
    manifest_path.unlink(missing_ok=True)  # the cache is incomplete from here on
    report = CleanReport()
    with whole_files.replacing(cache_dir / names["src_tokens"]) as src_tmp, \
            whole_files.replacing(cache_dir / names["tgt_tokens"]) as tgt_tmp:
        with NpyAppender(Path(src_tmp)) as src_out, NpyAppender(Path(tgt_tmp)) as tgt_out:
            src, tgt = _Side(src_out, []), _Side(tgt_out, [])
            for chunk in _chunks(filter_pairs(reader, clean, report), progress, name):
                src.add(vocab.encode([s for s, _ in chunk]))
                tgt.add(vocab.encode([t for _, t in chunk]))
    for side, offsets in (("src", src.offsets()), ("tgt", tgt.offsets())):
        with whole_files.replacing(cache_dir / names[f"{side}_offsets"]) as tmp:
            _save_npy(Path(tmp), offsets)
    manifest = dict(key, files=names, read=reader.lines, pairs=report.kept,
                    skipped_invalid=reader.skipped_invalid,
                    clean=report.to_dict() if clean is not None else None)
    with whole_files.replacing(manifest_path) as tmp:     # written last: the cache is complete
        Path(tmp).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def _chunks(pairs: Iterator[tuple[str, str]], progress: bool, name: str) -> Iterator[list]:
    with tqdm(desc=f"encoding {name}", unit=" pairs", unit_scale=True, disable=not progress) as bar:
        while chunk := list(islice(pairs, _CHUNK)):
            yield chunk
            bar.update(len(chunk))


def _save_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "xb") as f:  # a file object: np.save would append ".npy" to a name
        np.save(f, array, allow_pickle=False)


class NpyAppender:
    """Write a 1-D int32 ``.npy`` file whose length is only known at the end.

    The header is written with a placeholder length and rewritten on close; a 1-D header is padded
    to the same size whatever the length, so the data never moves.
    """

    def __init__(self, path: Path):
        self.path, self.count = path, 0
        self.file: BinaryIO = open(path, "xb")
        self._write_header(0)
        self.data_start = self.file.tell()

    def _write_header(self, count: int) -> None:
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(TOKEN_DTYPE)),
                  "fortran_order": False, "shape": (count,)}
        np.lib.format.write_array_header_1_0(self.file, header)

    def append(self, array: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(array, dtype=TOKEN_DTYPE).tobytes())
        self.count += len(array)

    def __enter__(self) -> NpyAppender:
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            if exc_info[0] is None:
                self.file.seek(0)
                self._write_header(self.count)
                if self.file.tell() != self.data_start:
                    raise DataError(f"{self.path}: .npy header size changed; cannot finish")
        finally:
            self.file.close()
