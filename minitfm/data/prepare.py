"""Download and assemble WMT14 English-German as the paper used it.

The paper (section 5.1) trained on "the standard WMT 2014 English-German dataset consisting of
about 4.5 million sentence pairs", evaluated on newstest2014 and used newstest2013 for
development. Those come from five archives of the WMT14 shared task (table ``ARCHIVES``):

    training   Europarl v7, Common Crawl, News Commentary v9   (the de-en files of each)
    valid      newstest2013 from dev.tgz                        (plain text)
    test       newstest2014 from test-full.tgz                  (SGML, all 3003 segments)

:func:`prepare_wmt14` writes ``train.{en,de}``, ``valid.{en,de}`` and ``test.{en,de}`` into a
directory, plus ``prepare.json`` recording what was read, skipped and cleaned. Steps already done
are skipped on a re-run:

- downloads go to ``downloads/NAME.part``; an interrupted download resumes from where it stopped
  (HTTP ``Range`` requests, or seeking for ``file://`` URLs) and is renamed to ``NAME`` only after
  its size and checksum are verified, so a file without ``.part`` is always complete; one that
  fails verification is deleted;
- only the needed members are extracted, to ``raw/``, each written under its own base name (never
  a path taken from the archive); an archive with an absolute or ``..`` member name is refused;
- the training pairs are cleaned (:mod:`minitfm.data.clean`, default options) and pairs with
  invalid UTF-8 skipped and counted; valid and test sets are written as released.

The download location can be redirected to a mirror, or to a local directory as a ``file://``
URL, with ``base_url=`` or the environment variable ``MINITFM_WMT14_URL``: the archives are then
fetched as ``BASE_URL/FILENAME``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO
from urllib.parse import urlparse

from tqdm import tqdm

from minitfm import files

from .clean import CleanOptions, CleanReport, filter_pairs
from .corpus import ParallelReader, read_parallel_files
from .reading import DataError

__all__ = ["Archive", "ARCHIVES", "BASE_URL_ENV", "prepare_wmt14", "download", "extract_members"]

BASE_URL_ENV = "MINITFM_WMT14_URL"
_BLOCK = 1 << 20
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Archive:
    """One file to download: where from, and what it must be (None: not checked)."""

    filename: str
    url: str
    size: int | None = None
    checksum: str | None = None  # "sha256:HEX" or "md5:HEX"


# Sizes and sha256 as published with TensorFlow Datasets' WMT14 builder; the test-full md5 is
# sacrebleu's. For dev.tgz no published value is known: its size is checked against the
# server's Content-Length only. Fill in a value here to pin it.
ARCHIVES: dict[str, Archive] = {
    "europarl": Archive(
        "training-parallel-europarl-v7.tgz",
        "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz", 657_632_379,
        "sha256:0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7"),
    "commoncrawl": Archive(
        "training-parallel-commoncrawl.tgz",
        "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz", 918_311_367,
        "sha256:c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5"),
    "news-commentary": Archive(
        "training-parallel-nc-v9.tgz",
        "https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz", 80_418_416,
        "sha256:cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485"),
    "dev": Archive("dev.tgz", "https://www.statmt.org/wmt14/dev.tgz"),
    "test": Archive("test-full.tgz", "https://www.statmt.org/wmt14/test-full.tgz",
                    checksum="md5:a8cd784e006feb32ac6f3d9ec7eb389a"),
}

# Base names of the files each split needs, per archive; {src} and {tgt} are the languages.
_TRAIN = [("europarl", "europarl-v7.de-en"), ("commoncrawl", "commoncrawl.de-en"),
          ("news-commentary", "news-commentary-v9.de-en")]
_VALID = ("dev", "newstest2013")
_TEST = ("test", "newstest2014-deen-src.{src}.sgm", "newstest2014-deen-ref.{tgt}.sgm")


def prepare_wmt14(out_dir: str | Path, *, src_lang: str = "en", tgt_lang: str = "de",
                  base_url: str | None = None, archives: Mapping[str, Archive] = ARCHIVES,
                  clean: CleanOptions | None = CleanOptions(), progress: bool = True) -> dict:
    """Download WMT14 English-German into ``out_dir`` and write its train/valid/test text files.

    Returns the contents of ``out_dir/prepare.json``: the files written and, for training, the
    pairs read per corpus, skipped for invalid UTF-8, and dropped per cleaning reason.
    """
    if {src_lang, tgt_lang} != {"en", "de"}:
        raise DataError(f"WMT14 preparation is for English-German: languages 'en' and 'de' in "
                        f"either order, got {src_lang!r} and {tgt_lang!r}")
    out_dir = Path(out_dir)
    langs = (src_lang, tgt_lang)
    done = out_dir / "prepare.json"
    options = {"languages": list(langs), "clean_options": clean.to_dict() if clean else None}
    if done.is_file():
        try:
            summary = json.loads(done.read_text(encoding="utf-8"))
            readable = isinstance(summary, dict) and isinstance(summary.get("files"), list)
        except (OSError, ValueError) as exc:      # cut short by a crash, damaged, not UTF-8
            readable, why = False, str(exc)
        else:
            why = "not the summary of a preparation"
        if not readable:
            print(f"{done} cannot be read ({why}): preparing {out_dir} again", file=sys.stderr,
                  flush=True)
        elif all(summary.get(k) == v for k, v in options.items()) and all(
                (out_dir / name).is_file() for name in summary["files"]):
            return summary
    base_url = base_url or os.environ.get(BASE_URL_ENV) or None
    raw = out_dir / "raw"
    wanted = _wanted_files(src_lang, tgt_lang)
    for key, names in wanted.items():
        if all((raw / name).is_file() for name in names):
            continue
        archive = archives[key]
        path = download(_archive_url(archive, base_url), out_dir / "downloads" / archive.filename,
                        size=archive.size, checksum=archive.checksum, progress=progress)
        extract_members(path, names, raw)

    report = CleanReport()
    train_parts = [(raw / wanted[key][0], raw / wanted[key][1]) for key, _ in _TRAIN]
    summary = dict(
        options,
        files=[f"{split}.{lang}" for split in ("train", "valid", "test") for lang in langs],
        train=_write_train(train_parts, out_dir, langs, clean, report),
        valid=_write_split(*(raw / name for name in wanted[_VALID[0]]), out_dir / "valid", langs),
        test=_write_split(*(raw / name for name in wanted[_TEST[0]]), out_dir / "test", langs),
    )
    summary["train"]["clean"] = report.to_dict() if clean is not None else None
    _atomic_write_text(done, json.dumps(summary, indent=1) + "\n")
    _log.info("WMT14 %s-%s prepared in %s: %s", src_lang, tgt_lang, out_dir, report.summary())
    return summary


def _wanted_files(src_lang: str, tgt_lang: str) -> dict[str, list[str]]:
    """Base names of the files to extract, per archive key, source language first."""
    wanted = {key: [f"{base}.{src_lang}", f"{base}.{tgt_lang}"] for key, base in _TRAIN}
    wanted[_VALID[0]] = [f"{_VALID[1]}.{src_lang}", f"{_VALID[1]}.{tgt_lang}"]
    wanted[_TEST[0]] = [name.format(src=src_lang, tgt=tgt_lang) for name in _TEST[1:]]
    return wanted


def _archive_url(archive: Archive, base_url: str | None) -> str:
    return f"{base_url.rstrip('/')}/{archive.filename}" if base_url else archive.url


# ----------------------------------------------------------------------------- writing splits

def _write_train(parts: list[tuple[Path, Path]], out_dir: Path, langs: tuple[str, str],
                 clean: CleanOptions | None, report: CleanReport) -> dict:
    """Concatenate the training corpora into ``train.SRC`` / ``train.TGT``, cleaning as it goes."""
    counts = {}
    with _AtomicPair(out_dir / "train", langs) as (src_out, tgt_out):
        for src_path, tgt_path in parts:
            reader = ParallelReader(src_path, tgt_path, skip_invalid=True)
            for src, tgt in filter_pairs(reader, clean, report):
                src_out.write(src.encode("utf-8") + b"\n")
                tgt_out.write(tgt.encode("utf-8") + b"\n")
            counts[src_path.name.rsplit(".", 1)[0]] = {
                "read": reader.lines, "skipped_invalid": reader.skipped_invalid}
    return {"corpora": counts}


def _write_split(src_path: Path, tgt_path: Path, prefix: Path, langs: tuple[str, str]) -> dict:
    """Write a valid/test set as released: every pair, no cleaning, invalid UTF-8 an error."""
    text = read_parallel_files(src_path, tgt_path)
    with _AtomicPair(prefix, langs) as (src_out, tgt_out):
        for src, tgt in text.pairs():
            src_out.write(src.encode("utf-8") + b"\n")
            tgt_out.write(tgt.encode("utf-8") + b"\n")
    return {"source_files": [src_path.name, tgt_path.name], "pairs": len(text)}


class _AtomicPair:
    """Open ``PREFIX.SRC`` and ``PREFIX.TGT`` for writing; they appear only if all went well."""

    def __init__(self, prefix: Path, langs: tuple[str, str]):
        self.final = [Path(f"{prefix}.{lang}") for lang in langs]
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> tuple[BinaryIO, BinaryIO]:
        with self.stack as stack:          # each written whole by files.replacing
            opened = [stack.enter_context(open(stack.enter_context(files.replacing(path)), "wb"))
                      for path in self.final]
            self.stack = stack.pop_all()
        return opened[0], opened[1]

    def __exit__(self, *exc_info) -> None:
        self.stack.__exit__(*exc_info)


def _atomic_write_text(path: Path, text: str) -> None:
    with files.replacing(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


# ----------------------------------------------------------------------------- downloading

def download(url: str, dest: str | Path, *, size: int | None = None, checksum: str | None = None,
             progress: bool = True) -> Path:
    """Fetch ``url`` to ``dest``, resuming ``dest.part`` if present, and verify it.

    ``size`` and ``checksum`` (``"sha256:HEX"`` / ``"md5:HEX"``) are checked when given; the size
    the server announces always is. ``dest`` exists only once verified. A transfer that stops
    early keeps its ``.part`` file for the next call to resume; a file that fails verification is
    deleted.
    """
    dest = Path(dest)
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    offset = part.stat().st_size if part.is_file() else 0
    if size is not None and offset > size:
        part.unlink()
        offset = 0
    if size is None or offset < size:
        total = _fetch(url, part, offset, progress)
        size = size if size is not None else total
    _verify(url, part, size, checksum)
    os.replace(part, dest)
    return dest


def _fetch(url: str, part: Path, offset: int, progress: bool) -> int | None:
    """Append ``url``'s bytes from ``offset`` on to ``part``; return the full size if known."""
    import urllib.error     # here, as in _open_url: only a download needs urllib's HTTP client
    try:
        stream, start, total = _open_url(url, offset)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise DataError(f"cannot download {url}: {reason}; check the network, or point "
                        f"{BASE_URL_ENV} / base_url at a mirror holding the archive") from exc
    # start == 0 when the server ignored the range request: the file is written from scratch
    with stream, open(part, "ab" if start else "wb") as out, \
            tqdm(total=total, initial=start, desc=part.name[:-len(".part")], unit="B",
                 unit_scale=True, unit_divisor=1024, disable=not progress) as bar:
        try:
            while block := stream.read(_BLOCK):
                out.write(block)
                bar.update(len(block))
        except (OSError, EOFError) as exc:
            raise DataError(f"download of {url} stopped after {out.tell()} bytes ({exc}); run "
                            f"again to resume from {part}") from exc
    return total


def _open_url(url: str, offset: int) -> tuple[BinaryIO, int, int | None]:
    """Open ``url`` at byte ``offset``: (stream, offset actually used, total size or None)."""
    import urllib.error
    import urllib.request
    if urlparse(url).scheme == "file":
        stream = open(urllib.request.url2pathname(urlparse(url).path), "rb")
        total = os.fstat(stream.fileno()).st_size
        stream.seek(min(offset, total))
        return stream, min(offset, total), total
    request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    try:
        response = urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # range starts at the end: the file is complete
            return _EmptyStream(), offset, offset
        raise
    if response.status == 206:
        match = re.match(r"bytes (\d+)-\d+/(\d+|\*)", response.headers.get("Content-Range", ""))
        if match and int(match.group(1)) == offset:
            return response, offset, int(match.group(2)) if match.group(2) != "*" else None
        response.close()
        return _open_url(url, 0)
    length = response.headers.get("Content-Length")
    return response, 0, int(length) if length is not None else None


class _EmptyStream:
    def read(self, _: int) -> bytes:
        return b""

    def __enter__(self) -> _EmptyStream:
        return self

    def __exit__(self, *_) -> None:
        pass


def _verify(url: str, part: Path, size: int | None, checksum: str | None) -> None:
    actual = part.stat().st_size
    if size is not None and actual < size:
        raise DataError(f"download of {url} is incomplete: {actual} of {size} bytes; run again "
                        f"to resume from {part}")
    if size is not None and actual > size:
        part.unlink()
        raise DataError(f"download of {url} has {actual} bytes but {size} were expected; the "
                        "file was deleted: run again, and if this repeats the server or mirror "
                        "serves a different file (update the size in ARCHIVES if it is right)")
    if checksum is None:
        return
    algorithm, _, expected = checksum.partition(":")
    digest = _file_digest(part, algorithm)
    if digest != expected.lower():
        part.unlink()
        raise DataError(f"checksum mismatch for {url}: {algorithm} is {digest}, expected "
                        f"{expected}; the corrupt file was deleted: run again, and if this "
                        "repeats the server or mirror serves a different file")


def _file_digest(path: Path, algorithm: str) -> str:
    if algorithm not in ("sha256", "md5"):
        raise DataError(f"unknown checksum algorithm {algorithm!r}: use 'sha256:HEX' or 'md5:HEX'")
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- extracting

def extract_members(archive: str | Path, names: list[str], out_dir: str | Path) -> list[Path]:
    """Extract the members of tar ``archive`` whose base names are ``names`` into ``out_dir``.

    Each is written as ``out_dir/BASENAME`` (the path inside the archive is not used), through a
    temporary file. The archive is refused if any member name is absolute or contains ``..``, or
    if a wanted member is not a regular file.
    """
    archive, out_dir = Path(archive), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    _log.info("extracting %s from %s", ", ".join(names), archive.name)
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                _check_member(archive, member)
                base = PurePosixPath(member.name).name
                if base in names:
                    found[base] = _extract_one(archive, tar, member, out_dir, found)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DataError(f"{archive}: cannot read the archive ({exc}); delete it to download it "
                        "again") from exc
    missing = [name for name in names if name not in found]
    if missing:
        raise DataError(f"{archive}: no member named {', '.join(missing)}; is it the right "
                        "archive?")
    return [found[name] for name in names]


def _check_member(archive: Path, member: tarfile.TarInfo) -> None:
    path = PurePosixPath(member.name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or re.match(r"^[A-Za-z]:", member.name):
        raise DataError(f"{archive}: refusing unsafe member {member.name!r} (absolute path or "
                        "'..'); the archive is not the released one, delete it")


def _extract_one(archive: Path, tar: tarfile.TarFile, member: tarfile.TarInfo, out_dir: Path,
                 found: dict[str, Path]) -> Path:
    base = PurePosixPath(member.name).name
    if base in found:
        raise DataError(f"{archive}: two members are named {base!r}; cannot tell which to use")
    if not member.isfile():
        raise DataError(f"{archive}: member {member.name!r} is not a regular file (a link?); "
                        "refusing to extract it")
    target = out_dir / base
    with files.replacing(target) as tmp, tar.extractfile(member) as source, \
            open(tmp, "wb") as out:
        shutil.copyfileobj(source, out, _BLOCK)
    return target
