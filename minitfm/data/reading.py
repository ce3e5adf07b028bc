"""Reading a text file once: opened, checked and decompressed as one stream, in bounded lines.

- :func:`check_input` refuses a path before anything is read from it unless it can be read as
  the command asks: a regular file, or for a command that reads it once from start to end
  (``translate --input``) also a pipe or a character device (``/dev/stdin``, ``<(zcat x.gz)``).
  A symbolic link that leads nowhere (a loop, a missing target) is said to be one, not "not
  found".
  A corpus that a command reads more than once (a vocabulary, then its encoding; a cache keyed
  by its size and time) must be a regular file: a pipe would hang or give its lines once.
- :func:`open_bytes` opens a file once; :func:`text_stream` looks at the first bytes of a
  stream and gunzips it when they say gzip, from the same stream (never by closing and opening
  again, which loses what a pipe gave). Then the first HEAD_BYTES of the text decide that it is
  not UTF-8 but UTF-16 or UTF-32 (:func:`wide_encoding`: a byte-order mark, or NUL bytes where
  those put them), which is refused naming the encoding and the conversion, never read as UTF-8
  with NULs. A UTF-8 byte-order mark is UTF-8: it is dropped from the first line.
- :func:`bounded_lines` reads lines at most MAX_LINE_BYTES long: a longer one (a file without
  line ends, ``/dev/zero``) is an error naming the file and the line, never a read that fills
  the memory. A file with no line feed at all whose one line holds carriage returns (the line
  ends of old Mac files) is refused too, saying so: read as it is, its sentences would be one
  line, and a corpus one sentence long on one side. :func:`stream_lines` and :func:`raw_lines`
  put them together.
- :func:`not_utf8` says what a line that is not UTF-8 shows of its file (text in an 8-bit
  encoding such as Windows-1252, or a damaged line of a UTF-8 file) and what to do, for the
  readers that decode lines.

Errors caused by the data raise :class:`DataError`, a ``ValueError`` whose message says what to
fix; a read that the system fails (an I/O error) raises ``files.ReadError``, which says that the
file was not judged. Host-side code.
"""

from __future__ import annotations

import codecs
import gzip
import io
import os
import shlex
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from minitfm import files

__all__ = ["DataError", "MAX_LINE_BYTES", "HEAD_BYTES", "GZIP_MAGIC", "UTF8_BOM", "READ_ERRORS",
           "check_input", "read_failed", "text_stream", "open_bytes", "wide_encoding",
           "bounded_lines", "stream_lines", "raw_lines", "not_utf8", "LineDecoder"]

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
HEAD_BYTES = 4096            # the first bytes of a text, which say whether it is UTF-8

# The byte-order marks of the encodings of Unicode that are not UTF-8, UTF-32's first (the
# little-endian one begins with UTF-16's): (mark, the encoding as iconv names it, byte order).
BYTE_ORDER_MARKS = ((b"\xff\xfe\x00\x00", "UTF-32", "little-endian"),
                    (b"\x00\x00\xfe\xff", "UTF-32", "big-endian"),
                    (b"\xff\xfe", "UTF-16", "little-endian"),
                    (b"\xfe\xff", "UTF-16", "big-endian"))
WIDE_ENCODINGS = ("UTF-32LE", "UTF-32BE", "UTF-16LE", "UTF-16BE")    # without a mark
# what a read of a text stream raises when the system fails it (OSError: EIO, ...) or its gzip is
# truncated or damaged (EOFError, zlib.error, gzip's BadGzipFile): read_failed tells them apart
READ_ERRORS = (OSError, EOFError, zlib.error)


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
    """``head`` (bytes already taken from ``stream`` to look at), then the rest of ``stream``;
    nothing more when ``ended`` (reading ``head`` met the end: a terminal gives its end once)."""

    def __init__(self, head: bytes, stream: BinaryIO, ended: bool) -> None:
        super().__init__()
        self._head, self._stream, self._ended = head, stream, ended

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n], self._head = self._head[:n], self._head[n:]
            return n
        if self._ended:
            return 0
        read = getattr(self._stream, "readinto1", self._stream.readinto)   # what has come
        return read(buffer)

    def close(self) -> None:
        self._stream.close()
        super().close()


class _Text(io.BufferedReader):
    """A text stream: ``head`` (its first bytes, already looked at: all of them when fewer than
    HEAD_BYTES), then the rest of ``stream``; ``gzipped``: whether ``stream`` is the gunzipped
    content of the file."""

    def __init__(self, head: bytes, stream: BinaryIO, gzipped: bool) -> None:
        super().__init__(_Replayed(head, stream, ended=len(head) < HEAD_BYTES))
        self.gzipped = gzipped


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


def text_stream(stream: BinaryIO, name: str | Path) -> BinaryIO:
    """``stream`` as a text stream: gunzipped when its first bytes say gzip, read once, from the
    same stream (a pipe can be read only once), and refused (:class:`DataError`) when its first
    HEAD_BYTES of text are UTF-16 or UTF-32 (:func:`wide_encoding`); ``name`` names it in
    messages. The result's ``gzipped`` says whether it was gzip; closing it closes ``stream``."""
    try:
        head = _head(stream, name)
        gzipped = head.startswith(GZIP_MAGIC)
        if gzipped:
            stream = _Gunzipped(_Text(head, stream, False))
            head = _head(stream, name)
        wide = wide_encoding(head)
        if wide is not None:
            raise _wide_text(name, gzipped, *wide)
    except BaseException:
        stream.close()
        raise
    return _Text(head, stream, gzipped)


def _head(stream: BinaryIO, name: str | Path) -> bytes:
    """The first HEAD_BYTES of ``stream``, fewer only when it ends there."""
    try:
        return stream.read(HEAD_BYTES)
    except READ_ERRORS as exc:
        raise read_failed(name, exc) from exc


def open_bytes(path: str | Path, streamed: bool = False) -> BinaryIO:
    """``path`` opened once for binary reading as a text stream (:func:`text_stream`:
    gunzipped when it is gzip, refused when it is UTF-16 or UTF-32); :func:`check_input` first:
    ``streamed`` allows a pipe or a device."""
    check_input(path, streamed)
    try:
        stream = open(path, "rb")
    except FileNotFoundError:
        raise _not_found(path) from None
    except OSError as exc:
        if files.link_trouble(path) is not None:     # made a loop since it was checked
            raise _not_found(path) from exc
        files.raise_if_read_failed(path, exc)        # the system's fault, not the file's
        raise DataError(f"{path}: cannot open ({exc.strerror or exc})") from exc
    return text_stream(stream, path)


def read_failed(name: str | Path, exc: BaseException) -> Exception:
    """The error for a read of ``name`` that raised ``exc``: an I/O error of the system as
    ``files.ReadError`` (the file was not judged), else gzip's complaint: the file is damaged."""
    if isinstance(exc, OSError):
        failed = files.read_error(name, exc)
        if failed is not None:
            return failed
    return DataError(f"{name}: read failed ({exc}); the file is corrupt or truncated, "
                     "re-create or re-download it")


def wide_encoding(head: bytes) -> tuple[str, str] | None:
    """``(encoding, evidence)`` when ``head``, the first bytes of a text, shows it to be UTF-16
    or UTF-32, not UTF-8: the encoding as ``iconv -f`` names it, and what shows it, in words;
    None otherwise.

    A byte-order mark shows it (``UTF-16``: iconv reads the mark). Without one, NUL bytes do,
    which UTF-8 text never holds, when the head read in one of those encodings is text: no NUL
    character, no unpaired surrogate, nearly all printable characters and white space, and at
    least one NUL byte in a hundred (a line feed, a space or a digit has one or three).
    """
    for mark, encoding, order in BYTE_ORDER_MARKS:
        if head.startswith(mark):
            return encoding, (f"it begins with {mark.hex(' ').upper()}, the byte-order mark of "
                              f"{order} {encoding}")
    nuls = head.count(0)
    if nuls == 0 or nuls * 100 < len(head):
        return None
    for encoding in WIDE_ENCODINGS:
        try:    # an incremental decoder: a character cut at the end of the head waits
            text = codecs.getincrementaldecoder(encoding)().decode(head, final=False)
        except UnicodeDecodeError:
            continue
        shown = sum(c.isprintable() or c.isspace() for c in text)
        if text and "\0" not in text and shown >= 0.95 * len(text):
            where = "after" if encoding.endswith("LE") else "before"
            count = "three NUL bytes" if encoding.startswith("UTF-32") else "a NUL byte"
            return encoding, f"it has {count} {where} each ASCII character, as {encoding} has"
    return None


def _wide_text(name: str | Path, gzipped: bool, encoding: str, evidence: str) -> DataError:
    """The error for ``name``, a text in ``encoding`` (UTF-16 or UTF-32) that ``evidence``
    shows: what it is and how to convert it to UTF-8."""
    fix = _conversion(name, gzipped, f"iconv -f {encoding} -t UTF-8")
    return DataError(f"{name} is {encoding} text, not UTF-8 ({evidence}); this command reads "
                     f"UTF-8: convert it {fix}")


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
    fix = _conversion(name, _gzipped(stream), "tr '\\r' '\\n'")
    return DataError(f"{said}; convert them to line feeds {fix}")


def _gzipped(stream: BinaryIO) -> bool:
    """Whether ``stream`` is the gunzipped content of its file."""
    return getattr(stream, "gzipped", False) or isinstance(stream, gzip.GzipFile)


def _conversion(name: str | Path, gzipped: bool, tool: str) -> str:
    """How to pass the text of ``name`` through the filter ``tool`` (``tr '\\r' '\\n'``,
    ``iconv ...``) into a file to give instead: a shell command, in words."""
    text = os.fspath(name)
    if text == "standard input":
        return f"on the way in (e.g. pipe it through {tool})"
    plain = text[:-3] if gzipped and text.endswith(".gz") else text
    suffix = os.path.splitext(os.path.basename(plain))[1] or ".txt"
    read = f"zcat {shlex.quote(text)} | {tool}" if gzipped else f"{tool} < {shlex.quote(text)}"
    return f"(e.g. {read} > fixed{suffix}) and give that file"


def stream_lines(stream: BinaryIO, name: str | Path) -> Iterator[bytes]:
    """The lines of the open text ``stream`` (:func:`text_stream`) as bytes, without their line
    endings (``\\n`` or ``\\r\\n``) and without a UTF-8 byte-order mark; errors name it
    ``name``. A truncated or corrupt gzip stream, a line longer than MAX_LINE_BYTES, or carriage
    returns alone as line ends (:func:`bounded_lines`) raise :class:`DataError`; a read that the
    system fails, ``files.ReadError``."""
    try:
        for number, line in enumerate(bounded_lines(stream, name), start=1):
            if number == 1 and line.startswith(UTF8_BOM):
                line = line[len(UTF8_BOM):]
            yield line.rstrip(b"\n").rstrip(b"\r")
    except READ_ERRORS as exc:      # truncated or corrupt gzip, I/O error
        raise read_failed(name, exc) from exc


def raw_lines(path: str | Path, streamed: bool = False) -> Iterator[bytes]:
    """The lines of a plain or gzipped file (:func:`stream_lines`), read once; ``streamed``: a
    pipe or a device is read too (:func:`check_input`)."""
    with open_bytes(path, streamed) as stream:
        yield from stream_lines(stream, path)


def not_utf8(name: str | Path, line: bytes, utf8_elsewhere: bool, gzipped: bool) -> str:
    """What ``line``, a line of ``name`` that is not UTF-8, shows of the file, and what to do,
    as words to follow a semicolon. With other lines that are UTF-8 beyond ASCII
    (``utf8_elsewhere``) the file is UTF-8 and the line damaged; else, when the line reads as
    Windows-1252 (Latin-1's letters and more), the file seems to be in that 8-bit encoding, and
    the words show how the line reads there and how to convert it; else the encoding is not
    known, and the words say how to find it. ``gzipped``: whether ``name`` is gzip."""
    if utf8_elsewhere:
        return ("other lines of it are UTF-8, with characters beyond ASCII: it is UTF-8 text, "
                "and a line that is not is damaged (a character cut short, or text pasted from "
                "another encoding); mend or remove it")
    start = 0
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = exc.start               # the first byte that is not UTF-8
    try:
        line.decode("cp1252")
    except UnicodeDecodeError as exc:
        fix = _conversion(name, gzipped, "iconv -f ENCODING -t UTF-8")
        return (f"it is not Windows-1252 or Latin-1 either (byte 0x{line[exc.start]:02X} is "
                f"none of their letters): find its encoding (e.g. with file -i) and convert "
                f"it {fix}")
    begin = max(line.rfind(b" ", 0, start) + 1, start - 20)
    end = line.find(b" ", start)
    word = line[begin:end if 0 <= end < start + 20 else start + 20].decode("cp1252")
    fix = _conversion(name, gzipped, "iconv -f WINDOWS-1252 -t UTF-8")
    return (f"it seems to be in an 8-bit encoding such as Windows-1252 or Latin-1, in which "
            f"that line reads {word!r}: convert it to UTF-8 {fix}")


class LineDecoder:
    """Decodes lines of the file ``path``, opened as the text stream ``stream``
    (:func:`open_bytes`), as UTF-8: one that is not is a :class:`DataError` naming the file and
    the line, and saying what the file seems to be, judged by that line and by the lines decoded
    before it (:func:`not_utf8`; ``utf8``: whether one of those was UTF-8 beyond ASCII)."""

    def __init__(self, path: Path, stream) -> None:
        self.path, self.gzipped = path, stream.gzipped
        self.utf8 = False           # whether a line decoded so far was UTF-8 beyond ASCII

    def __call__(self, line: bytes, number: int) -> str:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{self.path}, line {number}: invalid UTF-8 ({exc.reason} at byte "
                            f"{exc.start}); {not_utf8(self.path, line, self.utf8, self.gzipped)}"
                            ) from None
        if not self.utf8 and not line.isascii():
            self.utf8 = True
        return text
