"""Reading a text file once: opened, checked and decompressed as one stream, in bounded lines.

- :func:`check_input` refuses a path before anything is read from it unless it can be read as
  the command asks: a regular file, or for a command that reads it once from start to end
  (``translate --input``) also a pipe or a character device (``/dev/stdin``, ``<(zcat x.gz)``).
  A symbolic link that leads nowhere (a loop, a missing target) is said to be one, not "not
  found".
  A corpus that a command reads more than once (a vocabulary, then its encoding; a cache keyed
  by its size and time) must be a regular file: a pipe would hang or give its lines once.
- :func:`open_bytes` opens a file once; :func:`decompressed` looks at the first bytes of a
  stream and gunzips it when they say gzip, from the same stream (never by closing and opening
  again, which loses what a pipe gave).
- :func:`bounded_lines` reads lines at most MAX_LINE_BYTES long: a longer one (a file without
  line ends, ``/dev/zero``) is an error naming the file and the line, never a read that fills
  the memory. A file with no line feed at all whose one line holds carriage returns (the line
  ends of old Mac files) is refused too, saying so: read as it is, its sentences would be one
  line, and a corpus one sentence long on one side. :func:`stream_lines` and :func:`raw_lines`
  put them together.

Errors caused by the data raise :class:`DataError`, a ``ValueError`` whose message says what to
fix. Host-side code.
"""

from __future__ import annotations

import gzip
import io
import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from minitfm import files

__all__ = ["DataError", "MAX_LINE_BYTES", "GZIP_MAGIC", "UTF8_BOM", "check_input", "decompressed",
           "open_bytes", "bounded_lines", "stream_lines", "raw_lines"]

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"


class DataError(ValueError):
    """Input data is missing, unreadable, misaligned or malformed; the message says what to do."""


MAX_LINE_BYTES = 1 << 20     # a longer line is refused: no text this project reads has one


def check_input(path: str | Path, streamed: bool = False) -> None:
    """Refuse ``path`` before reading it unless it can be read as asked: a regular file, or with
    ``streamed`` (a command that reads it once, from start to end) also a pipe or a character
    device (``/dev/stdin``, ``<(zcat x.gz)``). :class:`DataError` otherwise, naming it."""
    kind = files.kind_of(path)
    if kind is None and not os.path.exists(path):
        raise _not_found(path)
    if kind is None or (streamed and kind in ("a named pipe", "a character device")):
        return
    if kind == "a directory":
        raise DataError(f"{path} is a directory: give the path of a text file")
    if kind in ("a named pipe", "a character device"):
        raise DataError(f"{path} is {kind}, not a regular file: this command reads it more than "
                        f"once; write it to a file and give that")
    raise DataError(f"{path} is {kind}: give the path of a text file")


def _not_found(path: str | Path) -> DataError:
    """The error for a ``path`` that cannot be followed to a file: a symbolic link that leads
    nowhere said as what it is (a loop, a missing target), else "file not found"."""
    trouble = files.link_trouble(path)
    if trouble is None:
        return DataError(f"{path}: file not found")
    return DataError(f"{path} is {trouble}: point it at a text file, or give the file itself")


class _Replayed(io.RawIOBase):
    """``head`` (bytes already taken from ``stream`` to look at), then the rest of ``stream``."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        super().__init__()
        self._head, self._stream = head, stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n], self._head = self._head[:n], self._head[n:]
            return n
        read = getattr(self._stream, "readinto1", self._stream.readinto)   # what has come
        return read(buffer)

    def close(self) -> None:
        self._stream.close()
        super().close()


class _Gunzipped(gzip.GzipFile):
    """A gzip stream read from ``source``, which it closes when it is closed."""

    def __init__(self, source: BinaryIO) -> None:
        super().__init__(fileobj=source, mode="rb")
        self._source = source

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._source.close()


def decompressed(stream: BinaryIO) -> BinaryIO:
    """``stream`` as it is, or gunzipped when its first bytes say gzip: read once, from the
    same stream (a pipe can be read only once). Closing the result closes ``stream``."""
    head = stream.read(len(GZIP_MAGIC))
    replayed = io.BufferedReader(_Replayed(head, stream))
    return _Gunzipped(replayed) if head == GZIP_MAGIC else replayed


def open_bytes(path: str | Path, streamed: bool = False) -> BinaryIO:
    """``path`` opened once for binary reading, gunzipped when it is gzip (:func:`check_input`
    first: ``streamed`` allows a pipe or a device)."""
    check_input(path, streamed)
    try:
        return decompressed(open(path, "rb"))
    except FileNotFoundError:
        raise _not_found(path) from None
    except OSError as exc:
        if files.link_trouble(path) is not None:     # made a loop since it was checked
            raise _not_found(path) from exc
        raise DataError(f"{path}: cannot open ({exc.strerror or exc})") from exc


def bounded_lines(stream: BinaryIO, name: str | Path) -> Iterator[bytes]:
    """The lines of ``stream`` with their ``\\n``, each at most MAX_LINE_BYTES long: a longer one
    (a file without line ends, ``/dev/zero``) is a :class:`DataError` naming ``name`` and the
    line, before it fills the memory.

    Carriage returns alone as line ends (old Mac files) are refused as a :class:`DataError` that
    says so, with the command that converts them: a first line that is the whole file (no
    ``\\n`` at all) with a CR inside it (more than one CR at its end), or a line too long that
    holds CRs. One line ending in ``\\r`` alone stays a line."""
    number = 0
    while line := stream.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(line) > MAX_LINE_BYTES:
            if b"\r" in line:
                raise _carriage_returns(stream, name, line, number)
            raise DataError(f"{name}, line {number}: longer than {MAX_LINE_BYTES >> 20} MiB "
                            f"without a line end; is it a text file? Give text with one "
                            f"sentence (or paragraph) per line")
        if number == 1 and not line.endswith(b"\n") and b"\r" in line[:-1]:
            raise _carriage_returns(stream, name, line, number)
        yield line


def _carriage_returns(stream: BinaryIO, name: str | Path, line: bytes,
                      number: int) -> DataError:
    """The error for ``line`` (line ``number`` of ``name``) whose line ends are carriage returns
    alone: it says how many and how to turn them into line feeds."""
    old_mac = "(CR, the line end of old Mac files)"
    if len(line) > MAX_LINE_BYTES:
        returns = line.count(b"\r")
        where = (f"{name}: no line ends: its first {MAX_LINE_BYTES >> 20} MiB holds no line feed"
                 if number == 1 else f"{name}, line {number}: longer than "
                                     f"{MAX_LINE_BYTES >> 20} MiB without a line feed")
        said = f"{where}, but {returns:,} carriage returns {old_mac}, which separate the sentences"
    else:
        returns = line.count(b"\r") - line.endswith(b"\r")    # a last one ends the last line
        characters = len(line.decode("utf-8", "replace"))
        whole = "input" if os.fspath(name) == "standard input" else "file"
        plural = returns != 1
        said = (f"{name}: no line ends: the whole {whole} is one line of {characters:,} "
                f"characters, in which {returns:,} carriage return{'s' if plural else ''} "
                f"{old_mac} separate{'' if plural else 's'} the sentences")
    return DataError(f"{said}; convert them to line feeds {_conversion(stream, name)}")


def _conversion(stream: BinaryIO, name: str | Path) -> str:
    """How to turn the carriage returns of ``name`` into line feeds: a shell command, in words."""
    text = os.fspath(name)
    if text == "standard input":
        return "on the way in (e.g. pipe it through tr '\\r' '\\n')"
    gzipped = isinstance(stream, gzip.GzipFile)
    plain = text[:-3] if gzipped and text.endswith(".gz") else text
    suffix = os.path.splitext(os.path.basename(plain))[1] or ".txt"
    read = (f"zcat {shlex.quote(text)} | tr '\\r' '\\n'" if gzipped
            else f"tr '\\r' '\\n' < {shlex.quote(text)}")
    return f"(e.g. {read} > fixed{suffix}) and give that file"


def stream_lines(stream: BinaryIO, name: str | Path) -> Iterator[bytes]:
    """The lines of the open (and decompressed) ``stream`` as bytes, without their line endings
    (``\\n`` or ``\\r\\n``) and without a UTF-8 byte-order mark; errors name it ``name``. A
    truncated or corrupt gzip stream, a line longer than MAX_LINE_BYTES, or carriage returns
    alone as line ends (:func:`bounded_lines`) raise :class:`DataError`."""
    try:
        for number, line in enumerate(bounded_lines(stream, name), start=1):
            if number == 1 and line.startswith(UTF8_BOM):
                line = line[len(UTF8_BOM):]
            yield line.rstrip(b"\n").rstrip(b"\r")
    except (OSError, EOFError) as exc:  # truncated or corrupt gzip, I/O error
        raise DataError(f"{name}: read failed ({exc}); the file is corrupt or truncated, "
                        "re-create or re-download it") from exc


def raw_lines(path: str | Path, streamed: bool = False) -> Iterator[bytes]:
    """The lines of a plain or gzipped file (:func:`stream_lines`), read once; ``streamed``: a
    pipe or a device is read too (:func:`check_input`)."""
    with open_bytes(path, streamed) as stream:
        yield from stream_lines(stream, path)
