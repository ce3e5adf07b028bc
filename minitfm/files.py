"""Whole files written atomically: a hidden temporary name beside the destination, renamed over it
only once complete and on disk.

A reader (a resumed run, ``latest()``, another command) sees the old file or the new one, never
half of one: the temporary's name starts with "." and ends with ".tmp", so nothing mistakes it for
a result, and an error or interrupt on the way removes it and leaves the destination as it was.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

__all__ = ["temporary_beside", "replacing", "fsync_directory"]


def temporary_beside(path: str | os.PathLike) -> str:
    """A new hidden name in ``path``'s folder: ``.NAME.<random>.tmp``."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")


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


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[str]:
    """Yield a temporary file name beside ``path`` (its folder is made) for the caller to write;
    when the block ends, the file is fsync'ed and renamed to ``path``, and the rename made
    durable; on any error or interrupt it is removed and ``path`` is untouched."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = temporary_beside(path)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    fsync_directory(directory)
