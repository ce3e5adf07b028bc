"""Reading parallel corpora: plain or gzipped text, and WMT's SGML test sets.

A parallel corpus is two files with one sentence per line, line i of one aligned with line i of
the other. Corpora are named fairseq-style by a prefix and two languages:
``read_parallel("data/train", "en", "de")`` reads ``data/train.en`` and ``data/train.de`` (each
may also be ``.en.gz`` / ``.de.gz``).
The WMT test sets come as SGML (``<seg id="1">text</seg>`` lines inside ``<doc docid=...>``);
:func:`read_parallel_files` reads those too, and pairs their segments by document and segment id.

Alignment is the one thing a reader must never get wrong, so:

- both sides are read in lockstep, and a difference in line counts is an error naming both files
  and both counts (never a silently shortened corpus);
- lines are split on ``\\n`` only, on bytes, before decoding: ``str.splitlines`` would also split
  on U+2028, U+0085 and friends, which occur in web-crawled text and would shift one side;
- invalid UTF-8 is an error naming the file and line, and saying what the file seems to be (text
  in an 8-bit encoding such as Windows-1252, with the conversion; or a damaged line of a UTF-8
  file), or, when the caller asks with ``skip_invalid=True``, the *pair* is dropped from both
  sides and counted.

Files are read by :mod:`minitfm.data.reading`: gzip detected from the first bytes, not the name;
every file a regular one (a corpus is read more than once), refused before any reading
otherwise; UTF-16 or UTF-32 text refused, naming the encoding; lines at most MAX_LINE_BYTES long.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import NamedTuple

from minitfm import files

from .reading import DataError, LineDecoder, open_bytes, raw_lines, stream_lines

__all__ = [
    "ParallelText", "ParallelReader", "Segment", "file_stamp", "parallel_files", "require_pairs",
    "read_parallel", "read_parallel_files", "read_lines", "read_sgm", "unescape_xml",
]


def read_lines(path: str | Path) -> list[str]:
    """All lines of a plain or gzipped UTF-8 text file, without line endings."""
    path = Path(path)
    with open_bytes(path) as stream:
        decode = LineDecoder(path, stream)
        return [decode(line, n) for n, line in enumerate(stream_lines(stream, path), start=1)]


def file_stamp(path: str | Path) -> dict:
    """What identifies a file's contents cheaply: resolved path, size, modification time.

    Caches derived from a corpus (vocabulary, encoded arrays) store the stamps of its files and
    are rebuilt when one changes.
    """
    path = Path(path)
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


# ----------------------------------------------------------------------------- plain parallel text

def parallel_files(prefix: str | Path, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    """The two files of corpus ``prefix``, each ``PREFIX.LANG`` or ``PREFIX.LANG.gz``."""
    return _find_side(prefix, src_lang), _find_side(prefix, tgt_lang)


def require_pairs(prefix: str | Path, src_lang: str, tgt_lang: str) -> None:
    """Raise :class:`DataError` unless corpus ``prefix`` holds at least one sentence pair.

    Reads only the first line of each side: a cheap check, before hours of work, that the files
    named on the command line are the intended ones and not empty.
    """
    paths = parallel_files(prefix, src_lang, tgt_lang)
    empty = []
    for path in paths:
        lines = raw_lines(path)
        if next(lines, None) is None:
            empty.append(str(path))
        lines.close()
    if empty:
        raise DataError(f"no sentence pairs in {paths[0]} / {paths[1]} ({' and '.join(empty)} "
                        f"{'is' if len(empty) == 1 else 'are'} empty): check the corpus prefix "
                        f"{prefix} and the language suffixes")


def _find_side(prefix: str | Path, lang: str) -> Path:
    candidates = [Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")]
    found = [path for path in candidates if os.path.lexists(path)]
    if not found:
        for path in candidates:             # in a folder that is (or passes through) a loop
            trouble = files.link_trouble(path)
            if trouble is not None:
                raise DataError(f"{path} is {trouble}: point the links at the corpus's folder, "
                                f"or give the folder itself")
        looked = ", ".join(str(path) for path in candidates)
        raise DataError(f"corpus {prefix!s}: no '{lang}' side found (looked for {looked})")
    if len(found) > 1:
        raise DataError(f"corpus {prefix!s}: both {found[0]} and {found[1]} exist; "
                        "remove one so it is clear which to read")
    return found[0]


class ParallelReader:
    """Stream the aligned pairs of two text files, checking alignment as it goes.

    Iterating yields ``(src, tgt)`` string pairs. After a complete iteration, ``lines`` holds the
    number of lines per side and ``skipped_invalid`` the pairs dropped for invalid UTF-8 (only
    with ``skip_invalid=True``). If the files have different line counts, the iteration raises
    :class:`DataError` at the end, after counting both files, so the message has both counts.
    """

    def __init__(self, src_path: str | Path, tgt_path: str | Path, *, skip_invalid: bool = False):
        self.src_path, self.tgt_path = Path(src_path), Path(tgt_path)
        self.skip_invalid = skip_invalid
        self.lines = 0
        self.skipped_invalid = 0

    def __iter__(self) -> Iterator[tuple[str, str]]:
        self.lines = self.skipped_invalid = 0
        src_count = tgt_count = 0
        with open_bytes(self.src_path) as src, open_bytes(self.tgt_path) as tgt:
            decoders = LineDecoder(self.src_path, src), LineDecoder(self.tgt_path, tgt)
            for src_raw, tgt_raw in zip_longest(stream_lines(src, self.src_path),
                                                stream_lines(tgt, self.tgt_path)):
                src_count += src_raw is not None
                tgt_count += tgt_raw is not None
                if src_raw is None or tgt_raw is None:
                    continue  # one side ended early: only count the rest of the other
                self.lines += 1
                pair = self._decode_pair(decoders, src_raw, tgt_raw)
                if pair is not None:
                    yield pair
        if src_count != tgt_count:
            raise DataError(
                f"misaligned corpus: {self.src_path} has {src_count} lines but {self.tgt_path} "
                f"has {tgt_count}; both sides need one sentence per line, in the same order")

    def _decode_pair(self, decoders: tuple[LineDecoder, LineDecoder], src_raw: bytes,
                     tgt_raw: bytes) -> tuple[str, str] | None:
        src_decoder, tgt_decoder = decoders
        try:
            return src_decoder(src_raw, self.lines), tgt_decoder(tgt_raw, self.lines)
        except DataError:
            if not self.skip_invalid:
                raise
            self.skipped_invalid += 1
            return None


@dataclass
class ParallelText:
    """An aligned parallel corpus in memory: ``src[i]`` translates to ``tgt[i]``."""

    src: list[str]
    tgt: list[str]
    src_path: Path
    tgt_path: Path
    skipped_invalid: int = 0  # pairs dropped for invalid UTF-8 (``skip_invalid=True`` only)

    def __len__(self) -> int:
        return len(self.src)

    def pairs(self) -> Iterator[tuple[str, str]]:
        return zip(self.src, self.tgt)


def read_parallel(prefix: str | Path, src_lang: str, tgt_lang: str, *,
                  skip_invalid: bool = False) -> ParallelText:
    """Read corpus ``PREFIX.SRC_LANG`` / ``PREFIX.TGT_LANG`` (each plain or ``.gz``)."""
    src_path, tgt_path = parallel_files(prefix, src_lang, tgt_lang)
    return read_parallel_files(src_path, tgt_path, skip_invalid=skip_invalid)


def read_parallel_files(src_path: str | Path, tgt_path: str | Path, *,
                        skip_invalid: bool = False) -> ParallelText:
    """Read two aligned files: plain or gzipped text, or both WMT SGML (``.sgm``, ``.sgm.gz``)."""
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    src_sgm, tgt_sgm = _is_sgm(src_path), _is_sgm(tgt_path)
    if src_sgm != tgt_sgm:
        raise DataError(f"{src_path} and {tgt_path}: one is SGML and the other is not; "
                        "give two SGML files or two plain-text files")
    if src_sgm:
        return _read_parallel_sgm(src_path, tgt_path, skip_invalid)
    reader = ParallelReader(src_path, tgt_path, skip_invalid=skip_invalid)
    src, tgt = [], []
    for src_line, tgt_line in reader:
        src.append(src_line)
        tgt.append(tgt_line)
    return ParallelText(src, tgt, src_path, tgt_path, reader.skipped_invalid)


# ----------------------------------------------------------------------------- WMT SGML

class Segment(NamedTuple):
    """One ``<seg>`` of a WMT SGML file; ``text`` is None for invalid UTF-8 when skipping."""

    docid: str
    segid: str
    text: str | None


_SEG_LINE = re.compile(rb"\s*<seg\b([^>]*)>(.*)</seg>\s*")
_ATTR_ID = re.compile(rb"""\bid\s*=\s*["']?([^"'\s>]+)""")
_ATTR_DOCID = re.compile(rb"""\bdocid\s*=\s*["']?([^"'\s>]+)""")
_ENTITY = re.compile(r"&(#[0-9]+|#[xX][0-9a-fA-F]+|amp|lt|gt|quot|apos);")
_NAMED_ENTITIES = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}


def unescape_xml(text: str) -> str:
    """Replace XML's five named entities and numeric character references, in one pass.

    One pass matters: ``&amp;lt;`` is the text ``&lt;``, not ``<``. Anything else that looks like
    an entity (HTML's ``&nbsp;``, a bare ``&``) is left as it is, since WMT's SGML is not strict.
    """
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if not name.startswith("#"):
            return _NAMED_ENTITIES[name]
        code = int(name[2:], 16) if name[1] in "xX" else int(name[1:])
        return chr(code) if 0 < code <= 0x10FFFF else match.group(0)

    return _ENTITY.sub(replace, text)


def _is_sgm(path: Path) -> bool:
    suffixes = path.suffixes[-2:]
    return bool(suffixes) and (suffixes[-1] == ".sgm" or suffixes == [".sgm", ".gz"])


def _read_segments(path: Path, skip_invalid: bool) -> list[Segment]:
    segments, docid = [], ""
    with open_bytes(path) as stream:
        decode = LineDecoder(path, stream)
        for number, line in enumerate(stream_lines(stream, path), start=1):
            if line.lstrip().startswith(b"<doc"):
                match = _ATTR_DOCID.search(line)
                docid = match.group(1).decode("utf-8", "replace") if match else ""
            elif line.lstrip().startswith(b"<seg"):
                segments.append(_parse_seg(line, decode, number, docid, skip_invalid))
    if not segments:
        raise DataError(f"{path}: no <seg> lines found; is this a WMT SGML file?")
    return segments


def _parse_seg(line: bytes, decode: LineDecoder, number: int, docid: str,
               skip_invalid: bool) -> Segment:
    match = _SEG_LINE.fullmatch(line)
    id_match = _ATTR_ID.search(match.group(1)) if match else None
    if id_match is None:
        raise DataError(f"{decode.path}, line {number}: malformed segment (expected "
                        '<seg id="N">text</seg> on one line)')
    segid = id_match.group(1).decode("utf-8", "replace")
    try:
        text = decode(match.group(2), number)
    except DataError:
        if not skip_invalid:
            raise
        return Segment(docid, segid, None)
    return Segment(docid, segid, " ".join(unescape_xml(text).split()))


def read_sgm(path: str | Path) -> list[str]:
    """The segment texts of a WMT SGML file, in file order, entities unescaped, spaces collapsed.

    Whitespace is stripped and runs of it collapsed to one space, as sacrebleu does with these
    files, so references read here match the ones sacrebleu scores against.
    """
    return [segment.text for segment in _read_segments(Path(path), skip_invalid=False)]


def _read_parallel_sgm(src_path: Path, tgt_path: Path, skip_invalid: bool) -> ParallelText:
    src_segments = _read_segments(src_path, skip_invalid)
    tgt_segments = _read_segments(tgt_path, skip_invalid)
    if len(src_segments) != len(tgt_segments):
        raise DataError(f"misaligned test set: {src_path} has {len(src_segments)} segments but "
                        f"{tgt_path} has {len(tgt_segments)}")
    src, tgt, skipped = [], [], 0
    for index, (s, t) in enumerate(zip(src_segments, tgt_segments)):
        if (s.docid, s.segid) != (t.docid, t.segid):
            raise DataError(
                f"misaligned test set: segment {index + 1} is doc {s.docid!r} seg {s.segid} in "
                f"{src_path} but doc {t.docid!r} seg {t.segid} in {tgt_path}")
        if s.text is None or t.text is None:
            skipped += 1
            continue
        src.append(s.text)
        tgt.append(t.text)
    return ParallelText(src, tgt, src_path, tgt_path, skipped)
