"""Whole files written atomically: a hidden temporary name beside the destination, renamed over it
only once complete and on disk.

A reader (a resumed run, ``latest()``, another command) sees the old file or the new one, never
half of one: the temporary's name starts with "." and ends with ".tmp", so nothing mistakes it for
a result, and an error or interrupt on the way removes it and leaves the destination as it was.

Every whole file the project writes goes through :func:`replacing` (a folder, the CTranslate2
export, through :func:`replacing_directory`): checkpoints and averaged models, the vocabulary
model and its metadata, the token caches and their manifests, ``run.json``, the export's outputs,
prepared corpora, test hypotheses and scores, plots. A write that fails for lack of room or rights
(a full disk, a file too large, a read-only file system) raises :class:`WriteError`, an
``OSError`` whose ``filename`` is the destination (not the temporary) and whose ``strerror`` adds
the folder and the space free there, so that every message built from them says which file, and
where to make room.

A temporary is named after the process that writes it (host and pid): one that a ``kill -9`` or
a crash left behind is removed by the next run of the same run directory or export
(:func:`remove_stale_temporaries`), never one whose writer still runs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import stat
import uuid
from collections.abc import Iterator

__all__ = ["WriteError", "write_error", "ReadError", "read_error", "raise_if_read_failed",
           "bad_path",
           "temporary_beside", "remove_stale_temporaries",
           "replacing", "replacing_together", "replacing_directory", "fsync_directory",
           "kind_of", "link_trouble"]

# the errors that say the destination has no room or cannot be written, whichever file raised them
_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


class WriteError(OSError):
    """A whole file could not be written: ``filename`` the destination, ``strerror`` the reason
    with the folder and the space free there."""


class ReadError(OSError):
    """A file could not be read for a reason of the system, not of its contents (an I/O error: a
    failing disk, a network file system whose server is gone): ``filename`` the file,
    ``strerror`` the reason, that the file was not judged, and what to check."""


def read_error(path: str | os.PathLike, exc: OSError) -> ReadError | None:
    """``exc``, raised while reading ``path``, as a :class:`ReadError` when the system failed the
    read (an ``OSError`` with an error number: EIO, ESTALE, ...); None when ``exc`` says nothing
    of the system (a library's complaint about the contents, with no error number) or says that
    the file is missing or may not be read, which the callers report as they are."""
    if isinstance(exc, ReadError):
        return exc
    if exc.errno is None or isinstance(exc, (FileNotFoundError, PermissionError,
                                             IsADirectoryError, NotADirectoryError)):
        return None
    reason = exc.strerror or str(exc)
    return ReadError(exc.errno, f"reading it failed: {reason}. The file itself was not judged "
                                f"and may be sound: check the disk or the mount it is on (the "
                                f"kernel's log, dmesg; a network file system's server), then "
                                f"run the command again", os.fspath(path))


def raise_if_read_failed(path: str | os.PathLike, exc: OSError) -> None:
    """Raise :func:`read_error`'s :class:`ReadError` for ``exc``, raised while reading ``path``,
    when the system failed the read (the file is not judged); return otherwise, for the caller
    to report ``exc`` as it does (a damaged file, a missing one)."""
    failed = read_error(path, exc)
    if failed is exc:
        raise exc
    if failed is not None:
        raise failed from exc


# the errors that say a path cannot be used as it was named, whatever the disk's state
_BAD_PATH = {errno.ENOTDIR, errno.EISDIR, errno.ENOENT, errno.EACCES, errno.EPERM, errno.ELOOP,
             errno.ENAMETOOLONG}


def bad_path(exc: OSError) -> bool:
    """Whether ``exc`` says that its path cannot be used as named (a file where a folder
    should be, a folder where a file should be, no rights, a link that leads nowhere): bad
    input, not a failure of the disk (no room, read-only, an I/O error)."""
    return exc.errno in _BAD_PATH


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def write_error(path: str | os.PathLike, exc: OSError) -> WriteError:
    """``exc``, raised while writing ``path``, as a :class:`WriteError` naming ``path``, its
    folder and the free space there (``exc`` itself if it is one already)."""
    if isinstance(exc, WriteError):
        return exc
    folder = os.path.dirname(os.path.abspath(path))
    try:
        free = f"{_size(shutil.disk_usage(folder).free)} free in {folder}"
    except OSError:
        free = f"in {folder}, whose free space cannot be read"
    reason = exc.strerror or str(exc)
    return WriteError(exc.errno, f"{reason} ({free})", os.fspath(path))


def temporary_beside(path: str | os.PathLike) -> str:
    """A new hidden name in ``path``'s folder, ``.NAME.<host>.<pid>.<random>.tmp``: it says which
    process writes it, so that once that process is gone (killed while writing) a later one can
    tell it is left over (:func:`remove_stale_temporaries`)."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.{socket.gethostname()}.{os.getpid()}."
                                   f"{uuid.uuid4().hex[:16]}.tmp")


def remove_stale_temporaries(folder: str | os.PathLike, name: str | None = None) -> int:
    """Remove the temporaries in ``folder`` (those of the destination ``name`` alone, when given)
    whose writer, a process of this machine, is gone: a write that ``kill -9``, a crash or a
    power cut ended. Those of live processes, of other machines, or of an older naming stay.
    Returns how many were removed."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return 0
    host, removed = socket.gethostname(), 0
    for entry in entries:
        parts = entry[1:].rsplit(".", 3)        # NAME.<host>, <pid>, <random>, "tmp"
        if (not entry.startswith(".") or len(parts) != 4 or parts[3] != "tmp"
                or not parts[1].isdigit() or not parts[0].endswith("." + host)
                or (name is not None and parts[0] != f"{name}.{host}")
                or _running(int(parts[1]))):
            continue
        stale = os.path.join(folder, entry)
        try:
            if os.path.isdir(stale) and not os.path.islink(stale):
                shutil.rmtree(stale)
            else:
                os.remove(stale)
            removed += 1
        except OSError:
            pass
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass                    # another user's: it runs
    return True


def fsync_directory(directory: str) -> None:
    """Make a rename in ``directory`` durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def kind_of(path: str | os.PathLike) -> str | None:
    """What ``path`` is, in words, when it exists and is not a regular file: "a directory", "a
    named pipe" (also a shell's ``<(...)``), "a character device" (``/dev/stdin`` on a terminal,
    ``/dev/zero``), "a block device" or "a socket"; None for a regular file or nothing at all."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return next((words for test, words in _KINDS if test(mode)), None)


def link_trouble(path: str | os.PathLike) -> str | None:
    """What is wrong with ``path`` when it is (or passes through) a symbolic link that leads
    nowhere, in words: "a loop of symbolic links (a -> b -> a)", or "a symbolic link to X, which
    does not exist"; None when ``path`` can be followed (or is simply missing)."""
    try:
        os.stat(path)
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not os.path.islink(path):
            return "a path that passes through a loop of symbolic links"
        if exc.errno == errno.ELOOP:
            return f"a loop of symbolic links ({_chain(path)})"
        if exc.errno != errno.ENOENT or not os.path.islink(path):
            return None
    target = os.readlink(path)
    return (f"a symbolic link to {target}, which does not exist" if not os.path.islink(
        os.path.join(os.path.dirname(os.fspath(path)), target))
        else f"a chain of symbolic links that ends nowhere ({_chain(path)})")


def _chain(path: str | os.PathLike, most: int = 8) -> str:
    """``path`` and the links it leads through, "a -> b -> a" (a long chain cut with "...")."""
    seen, names, here = set(), [os.fspath(path)], os.fspath(path)
    while os.path.islink(here) and len(names) <= most:
        key = os.path.abspath(here)
        if key in seen:
            break
        seen.add(key)
        here = os.path.join(os.path.dirname(here), os.readlink(here))
        names.append(os.path.normpath(here))
    else:
        if os.path.islink(here):
            names.append("...")
    return " -> ".join(names)


def _special(path: str | os.PathLike) -> bool:
    """Whether ``path`` exists and is something other than a regular file or a folder."""
    return kind_of(path) not in (None, "a directory")


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[str]:
    """Yield a temporary file name beside ``path`` (its folder is made) for the caller to write;
    when the block ends, the file is fsync'ed and renamed to ``path``, and the rename made
    durable; on any error or interrupt it is removed and ``path`` is untouched. A failed write
    raises :class:`WriteError` (see the module's docstring).

    A destination that exists and is not a regular file (``/dev/null``, ``/dev/stdout``, a named
    pipe) is yielded as it is, to be written in place: a rename would replace the device or pipe
    itself with a regular file."""
    if _special(path):
        try:
            yield os.fspath(path)
        except OSError as exc:
            raise write_error(path, exc) from exc
        return
    directory = os.path.dirname(os.path.abspath(path))
    tmp = temporary_beside(path)
    try:
        try:
            os.makedirs(directory, exist_ok=True)
            yield tmp
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            if _of_this_write(exc, tmp, path):
                raise write_error(path, exc) from exc
            raise
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    fsync_directory(directory)


@contextlib.contextmanager
def replacing_together(paths: list[str | os.PathLike]) -> Iterator[list[str]]:
    """:func:`replacing` for files that change together (an exercise and the progress that
    names it): yield a temporary beside each of ``paths`` for the caller to write; when the
    block ends all of them are fsync'ed, and only then renamed, in the order given. An error
    or interrupt before the renames removes every temporary and changes none of ``paths``; a
    failed write raises :class:`WriteError` naming the file it was for."""
    temps = [temporary_beside(path) for path in paths]
    try:
        for path, tmp in zip(paths, temps):
            try:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            except OSError as exc:
                raise write_error(path, exc) from exc
        try:
            yield temps
        except OSError as exc:
            named = os.fspath(exc.filename) if isinstance(exc.filename, os.PathLike) \
                else exc.filename
            if named in temps:
                raise write_error(paths[temps.index(named)], exc) from exc
            raise
        for path, tmp in zip(paths, temps):
            try:
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
            except OSError as exc:
                raise write_error(path, exc) from exc
        for path, tmp in zip(paths, temps):
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise write_error(path, exc) from exc
    except BaseException:
        for tmp in temps:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        raise
    for directory in {os.path.dirname(os.path.abspath(path)) for path in paths}:
        fsync_directory(directory)


@contextlib.contextmanager
def replacing_directory(path: str | os.PathLike) -> Iterator[str]:
    """:func:`replacing` for a folder: yield a new empty folder beside ``path`` for the caller to
    fill; when the block ends its files are fsync'ed and it takes the place of ``path`` (an
    existing ``path`` is moved aside, then removed); on any error or interrupt it is removed and
    ``path`` is untouched (moved back, when the error or the signal came between the two
    renames). A failed write raises :class:`WriteError` naming ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp, old = temporary_beside(path), None
    try:
        try:
            os.makedirs(directory, exist_ok=True)
            os.mkdir(tmp)
            yield tmp
            for root, _, names in os.walk(tmp):
                for name in names:
                    with open(os.path.join(root, name), "rb+") as f:
                        os.fsync(f.fileno())
            if os.path.lexists(path):
                old = temporary_beside(path)
                os.rename(path, old)
            os.rename(tmp, path)
        except OSError as exc:
            if _of_this_write(exc, tmp, path):
                raise write_error(path, exc) from exc
            raise
    except BaseException:
        # an error or a signal between the two renames: the old folder goes back to its name
        if old is not None and os.path.lexists(old) and not os.path.lexists(path):
            with contextlib.suppress(OSError):
                os.rename(old, path)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_directory(directory)
    if old:
        shutil.rmtree(old, ignore_errors=True) if os.path.isdir(old) else os.remove(old)


def _of_this_write(exc: OSError, tmp: str, path: str | os.PathLike) -> bool:
    """Whether ``exc`` is an error of writing ``tmp`` for ``path`` (not, say, of a file the
    caller reads meanwhile): no room or rights, or an error naming no file, or one of theirs."""
    name = exc.filename
    name = os.fspath(name) if isinstance(name, os.PathLike) else name
    return (exc.errno in _NO_ROOM or name is None or name.startswith(tmp)
            or name in (os.fspath(path), os.path.dirname(os.path.abspath(path))))
