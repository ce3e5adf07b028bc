"""Run a command as on a failing file system: ``python tests/failing_disk.py [faults] -- COMMAND``.

COMMAND is a script and its arguments (``train_wmt.py --resume ...``) or ``-m module ...``; it
runs in this process (``runpy``) after the file functions of ``builtins``, ``io`` and ``os`` are
wrapped to fail as a disk or mount would, with the errors the system gives:

``--eio PATH``        reading PATH (or any file under it) fails: EIO, "Input/output error" (a
                      failing disk, an NFS server gone);
``--read-only DIR``   every write under DIR fails: EROFS, "Read-only file system" (opening for
                      writing or creating, making or removing a folder, renaming, removing);
``--full DIR``        every write under DIR fails: ENOSPC, "No space left on device";
``--denied DIR``      every write under DIR fails: EACCES, "Permission denied" (a folder of
                      another user, or ``chmod 555``, which a root user is not held to).

Each option may be given more than once. Reads outside the paths named, and writes outside the
folders named, go on as ever: a test sees what the command does with exactly this fault.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import os
import runpy
import sys

_FAULTS: list[tuple[str, int, str]] = []     # (path, errno, "read" | "write")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _under(name, root: str) -> bool:
    if not isinstance(name, (str, bytes, os.PathLike)):
        return False        # a file descriptor: opened before, already judged
    here = os.path.abspath(os.fsdecode(name))
    return here == root or here.startswith(root.rstrip(os.sep) + os.sep)


def _check(name, action: str) -> None:
    for root, number, kind in _FAULTS:
        if kind == action and _under(name, root):
            raise OSError(number, os.strerror(number), os.fsdecode(name))


def _writes(mode: str) -> bool:
    return any(c in mode for c in "wax+")


_open = builtins.open


def _wrapped_open(file, mode="r", *args, **kwargs):
    _check(file, "write" if _writes(mode) else "read")
    return _open(file, mode, *args, **kwargs)


_os_open = os.open


def _wrapped_os_open(path, flags, *args, **kwargs):
    _check(path, "write" if flags & _WRITE_FLAGS else "read")
    return _os_open(path, flags, *args, **kwargs)


def _failing_write(function, *positions):
    def wrapped(*args, **kwargs):
        for i in positions:
            if i < len(args):
                _check(args[i], "write")
        return function(*args, **kwargs)
    wrapped.__name__ = function.__name__
    return wrapped


def install(faults: list[tuple[str, int, str]]) -> None:
    """Wrap the file functions to fail as ``faults`` say: ``(path, errno, "read" | "write")``."""
    _FAULTS.extend((os.path.abspath(p), n, kind) for p, n, kind in faults)
    builtins.open = io.open = _wrapped_open
    os.open = _wrapped_os_open
    for name, positions in (("mkdir", (0,)), ("rmdir", (0,)), ("remove", (0,)),
                            ("unlink", (0,)), ("rename", (0, 1)), ("replace", (0, 1)),
                            ("link", (0, 1)), ("symlink", (1,)), ("truncate", (0,))):
        setattr(os, name, _failing_write(getattr(os, name), *positions))


@contextlib.contextmanager
def failing(faults: list[tuple[str, int, str]]):
    """:func:`install` for a block, in this process: the file functions are put back after."""
    names = ("mkdir", "rmdir", "remove", "unlink", "rename", "replace", "link", "symlink",
             "truncate", "open")
    kept = builtins.open, io.open, {name: getattr(os, name) for name in names}
    try:
        install(faults)
        yield
    finally:
        builtins.open, io.open = kept[0], kept[1]
        for name, function in kept[2].items():
            setattr(os, name, function)
        _FAULTS.clear()


def main(argv: list[str]) -> None:
    faults, i = [], 0
    options = {"--eio": (errno.EIO, "read"), "--read-only": (errno.EROFS, "write"),
               "--full": (errno.ENOSPC, "write"), "--denied": (errno.EACCES, "write")}
    while argv[i] != "--":
        number, kind = options[argv[i]]
        faults.append((argv[i + 1], number, kind))
        if argv[i] == "--eio":          # an unreadable file cannot be rewritten either
            faults.append((argv[i + 1], number, "write"))
        i += 2
    command = argv[i + 1:]
    install(faults)
    if command[0] == "-m":
        sys.argv = [command[1], *command[2:]]
        runpy.run_module(command[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = command
        sys.path.insert(0, os.path.dirname(os.path.abspath(command[0])))
        runpy.run_path(command[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
