"""Compile a kernel's host C++ with the machine's C++ compiler, once, and load it.

Host-only code. The compiler is the one :mod:`minitfm.cudahost.cxx` chooses. ``-ffp-contract=off``
keeps ``a * b + c`` two roundings, as the kernels' ``--fmad=false`` does on a device;
``-fstack-clash-protection`` touches each page of a large frame as it is made, so that a thread's
local arrays too large for its stack fault in the guard region below it rather than reach past
it. A compilation that fails naming a line of the kernel's source is a
:class:`~minitfm.cudahost.cxx.BuildError` with the compiler's errors; one that fails naming none
is the compiler's fault, a :class:`~minitfm.cudahost.cxx.CompilerError`.

The model's own code, ``cuda_host.cpp`` (the scheduler, the race records, the faults in
words), is compiled once into a library of its own, ``runtime-<hash>.so``, and each kernel's
library is linked to it (found beside it, in the same folder): a kernel's compilation is its own
code and the header's declarations alone, about half the time it took with the model's code in
every kernel. A process loads the runtime first, so that one that does not load is compiled
again before any kernel needs it.

A compiled library is kept under ``$MINITFM_CACHE`` (default ``~/.cache/minitfm``), in
``cudahost/``, named by a hash of everything that went into it: the next run loads it at once.
An entry is compiled in a folder of its own beside the others (the compiler's temporaries too)
and renamed into place once whole (:func:`minitfm.files.replacing`), under a lock of its own:
two processes that need it at once compile it once, and a process killed meanwhile leaves only
temporaries that the next compilation removes. Each library is followed by a seal, the hash
it is named by and the hash of its bytes: an entry that is not whole (truncated, damaged,
another entry's library) or does not load is compiled again, with one ``warning:`` line. A
cache that cannot be written (a full disk, a read-only one) is a :class:`CacheError`, naming
the folder and how to move the cache. A cache whose folder cannot be one (a file in its place,
or in the place of a folder above it) moves to the system's temporary folder, said once in one
``warning:`` line, as a read-only home's cache moves there.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from filelock import FileLock

from minitfm import files
from minitfm.cudahost import rewrite
from minitfm.cudahost.cxx import BuildError, CompilerError, choose_another, chosen_compiler, named

__all__ = ["CacheError", "cache_dir", "FLAGS", "HEADER", "RUNTIME", "Library", "runtime",
           "build"]

HEADER = Path(__file__).with_name("cuda_host.h")
RUNTIME = Path(__file__).with_name("cuda_host.cpp")     # compiled once, every kernel linked to it
FLAGS = ("-std=c++14", "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math",
         "-fno-strict-aliasing", "-fno-threadsafe-statics", "-fstack-clash-protection", "-w")
MARK = "minitfm cache entry "   # a library's seal: this, its entry's hash, the hash of its bytes
LAYOUT = "3"                    # the entries' layout, in their hash: older entries are left unused
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class CacheError(OSError):
    """The cache could not be written (no room, no rights): ``filename`` the cache's folder,
    ``strerror`` the reason, the space free there and how to move the cache."""


def cache_dir() -> Path:
    """The folder of the compiled libraries, made if missing: ``$MINITFM_CACHE/cudahost``, or
    where it cannot be written (a read-only home) or cannot be a folder (a file in its place:
    said once) one in the system's temporary folder; :class:`CacheError` where there is no room
    to make it."""
    root = os.environ.get("MINITFM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "minitfm")
    path = Path(root) / "cudahost"
    fallback = Path(tempfile.gettempdir()) / f"minitfm-cudahost-{os.getuid()}"
    try:
        if not path.is_dir():
            path.mkdir(parents=True, exist_ok=True)
        if os.access(path, os.W_OK | os.X_OK):
            return path
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTDIR, errno.ELOOP):
            _say_once(f"warning: the compiled kernels cannot be kept in {path}: "
                      f"{_not_a_folder(path)}; they are kept in {fallback} for now (move it "
                      f"away, or set MINITFM_CACHE to a folder)")
        elif exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise _unwritable(path, exc) from exc
    path = fallback
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    return path


_said: set[str] = set()      # the warnings this process has printed (a forked child's too)


def _say_once(warning: str) -> None:
    if warning not in _said:
        _said.add(warning)
        print(warning, file=sys.stderr, flush=True)


def _not_a_folder(path: Path) -> str:
    """What stands where a folder on the way to ``path`` should be, in words."""
    for part in reversed([path, *path.parents]):
        if os.path.lexists(part) and not part.is_dir():
            trouble = files.link_trouble(part)
            return f"{part} is {trouble or 'a file, not a folder'}"
    return f"{path} cannot be reached as a folder"


def _unwritable(folder: Path, exc: OSError) -> CacheError:
    """``exc``, raised while writing in the cache ``folder``, as a :class:`CacheError`."""
    reason = files.write_error(exc.filename or folder / "entry", exc).strerror
    fix = ("make room there, or move the cache elsewhere" if exc.errno in NO_ROOM
           else "move the cache to a folder that can be written")
    return CacheError(exc.errno, f"the compiled kernels cannot be kept there: {reason}; {fix} "
                                 f"with MINITFM_CACHE=DIR", str(folder))


# held by every launch: one at a time in the process (the launch under way is the runtime
# library's state, and a launch sets the process's handlers of the signals a kernel's faults
# raise for its duration)
LAUNCHES = threading.Lock()


class Library:
    """A compiled translation unit: ``entry(name)`` is the launch function of kernel ``name``;
    ``shadow_bytes`` the size of one element's race record; ``lock``, held by a launch
    (:data:`LAUNCHES`: one launch at a time in the process). ``host`` None: the runtime library
    (:func:`runtime`), which launches no kernel of its own."""

    def __init__(self, path: Path, host: rewrite.HostSource | None, unit: str, key: str):
        """Load the library at ``path``, the entry ``key``; :class:`_Unloadable` (with the
        reason in words) where it is missing, damaged or another entry's."""
        self.path, self.host, self.unit = path, host, unit
        try:
            self._dll = ctypes.CDLL(str(path)) if _sealed(path.read_bytes(), key) else None
        except OSError as exc:
            raise _Unloadable(exc.strerror or str(exc)) from exc
        if self._dll is None:
            raise _Unloadable("it is not this kernel's library whole: truncated, damaged, or "
                              "another kernel's")
        kernels = host.kernels if host is not None else []
        missing = [name for name in kernels if not hasattr(self._dll, f"minitfm_launch_{name}")]
        if missing or not hasattr(self._dll, "minitfm_shadow_bytes"):
            raise _Unloadable(f"it lacks the launch of {', '.join(missing) or 'any kernel'}")
        self.shadow_bytes = self._dll.minitfm_shadow_bytes()
        self.lock = LAUNCHES

    def entry(self, name: str):
        function = getattr(self._dll, f"minitfm_launch_{name}")
        function.restype = ctypes.c_int
        function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        return function


class _Unloadable(Exception):
    """A cache entry that does not load; the message says why."""


def _seal(content: bytes, key: str) -> bytes:
    """What follows a compiled library in its cache entry: the entry's hash and the library's
    own (the loader ignores what follows the parts it maps)."""
    return f"\n{MARK}{key} {hashlib.sha256(content).hexdigest()}\n".encode()


def _sealed(content: bytes, key: str) -> bool:
    """Whether ``content`` is a whole cache entry ``key``: a library and its seal."""
    size = len(_seal(b"", key))
    return content[-size:] == _seal(content[:-size], key)


_loaded: dict[str, Library] = {}       # by kernel source
_runtimes: dict[Path, Library] = {}    # by entry


def unit_of(source: str) -> tuple[rewrite.HostSource, str]:
    """The host source of ``source`` and the whole translation unit to compile."""
    host = rewrite.rewrite(source)
    unit = (f'#include "{HEADER.name}"\n#line 1 "kernel.cu"\n{host.text}\n'
            f'#line 1 "launch.cpp"\n{rewrite.wrappers(host)}')
    return host, unit


def _key(command: list[str], *parts: str) -> str:
    """An entry's name: the hash of everything that goes into its library, ``command`` the
    compiler's."""
    return hashlib.sha256("\0".join([LAYOUT, HEADER.read_text(), RUNTIME.read_text(), *parts,
                                      *command, *FLAGS, sys.platform]).encode()).hexdigest()[:32]


def _linking(runtime_path: Path) -> tuple[list[str], list[str]]:
    """The compiler's options that name the runtime library (its own name, where a kernel's
    library will look for it) and that link a kernel's library to it, found in the kernel's own
    folder wherever the cache lies."""
    if sys.platform == "darwin":
        return ([f"-Wl,-install_name,@rpath/{runtime_path.name}"],
                [str(runtime_path), "-Wl,-rpath,@loader_path"])
    return [f"-Wl,-soname,{runtime_path.name}"], [str(runtime_path), "-Wl,-rpath,$ORIGIN"]


def runtime(command: list[str], chosen_by: str) -> Library:
    """``cuda_host.cpp`` compiled for the host by ``command`` (chosen by ``chosen_by``) and
    loaded, once a process and cache (from the cache where it was built before; an entry there
    that does not load is compiled again, and said)."""
    key = _key(command, "runtime")
    target = cache_dir() / f"runtime-{key}.so"
    if target not in _runtimes:
        _runtimes[target] = _entry(command, chosen_by, target, None, RUNTIME.read_text(), key,
                                   _linking(target)[0])
    return _runtimes[target]


def build(source: str) -> Library:
    """``source`` compiled for the host, linked to :func:`runtime`, and loaded (from the cache
    where it was built before; an entry there that does not load is compiled again, and said).
    The kernel's entry lies beside the runtime's, where its library looks for it."""
    if source in _loaded:
        return _loaded[source]
    command, chosen_by = chosen_compiler()
    linked = runtime(command, chosen_by).path
    host, unit = unit_of(source)
    key = _key(command, unit)
    library = _entry(command, chosen_by, linked.parent / f"{key}.so", host, unit, key,
                     _linking(linked)[1])
    _loaded[source] = library
    return library


def _entry(command: list[str], chosen_by: str, target: Path, host: rewrite.HostSource | None,
           unit: str, key: str, linking: list[str]) -> Library:
    """The library of cache entry ``target``: loaded, else compiled under its lock."""
    try:
        return Library(target, host, unit, key)             # the usual case: no lock, no write
    except _Unloadable:
        try:
            with FileLock(str(target.with_suffix(".lock"))):
                return _load_or_compile(command, chosen_by, host, unit, key, target, linking)
        except CacheError:
            raise
        except OSError as exc:                              # the lock, or the compilation's files
            raise _unwritable(target.parent, exc) from exc


def _load_or_compile(command: list[str], chosen_by: str, host: rewrite.HostSource | None,
                     unit: str, key: str, target: Path, linking: list[str]) -> Library:
    """Under the entry's lock: the entry as another process may just have compiled it, else
    compiled now (an entry there that does not load is said, once)."""
    what = "kernel" if host is not None else "host runtime of the kernels"
    try:
        return Library(target, host, unit, key)
    except _Unloadable as exc:
        if target.exists():
            print(f"warning: the compiled {what} {target} does not load ({exc}): compiling it "
                  f"again", file=sys.stderr, flush=True)
    _compile(command, chosen_by, unit, key, target, linking)
    try:
        return Library(target, host, unit, key)
    except _Unloadable as exc:
        raise CompilerError(f"the {what} compiled by {named(command, chosen_by)} into {target} "
                            f"does not load ({exc}): {choose_another(chosen_by)}") from exc


def _compile(command: list[str], chosen_by: str, unit: str, key: str, target: Path,
             linking: list[str]) -> None:
    """Compile ``unit`` into ``target`` in a folder beside it (the compiler's temporaries
    too), renamed into place once whole; ``linking``: the options that name or link the
    runtime library."""
    files.remove_stale_temporaries(target.parent)      # of compilations killed on the way
    work = files.temporary_beside(target.with_suffix(".build"))
    try:
        os.mkdir(work)
        cpp = Path(work) / "kernel.cpp"
        cpp.write_text(unit)
        with files.replacing(target) as partial:
            line = [*command, *FLAGS, "-I", str(HEADER.parent), str(cpp), *linking, "-o",
                    partial]
            environment = dict(os.environ, TMPDIR=work, LC_ALL="C")
            try:
                done = subprocess.run(line, capture_output=True, text=True, timeout=600,
                                      env=environment)
            except subprocess.TimeoutExpired as exc:
                raise BuildError(f"the C++ compiler {named(command, chosen_by)} did not finish "
                                 f"within {exc.timeout:g} s") from exc
            except OSError as exc:
                raise CompilerError(f"the C++ compiler {named(command, chosen_by)} could not "
                                    f"run: {exc}; {choose_another(chosen_by)}") from exc
            if done.returncode != 0:
                raise _failure(done, command, chosen_by)
            if not os.path.exists(partial):
                raise CompilerError(f"the C++ compiler {named(command, chosen_by)} wrote no "
                                    f"library (it exited with status 0); "
                                    f"{choose_another(chosen_by)}")
            with open(partial, "rb+") as library:
                library.write(_seal(library.read(), key))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _failure(done: subprocess.CompletedProcess, command: list[str], chosen_by: str) -> Exception:
    """The error for a compilation that failed: no room in the cache (an ``OSError``), the
    errors in the source's lines where the compiler names any, or else the compiler itself at
    fault."""
    errors = done.stderr + done.stdout
    for number in NO_ROOM:
        if os.strerror(number) in errors:       # the library, or the compiler's temporaries
            return OSError(number, os.strerror(number))
    if any(f"{name}:" in errors for name in ("kernel.cu", "launch.cpp", HEADER.name)):
        return BuildError(_explain(errors, shlex.join(command)))
    said = next((e.strip() for e in errors.splitlines() if e.strip()), "")   # the first
    said = f" ({said[:300]})" if said else " and printed nothing"
    return CompilerError(f"the C++ compiler {named(command, chosen_by)} does not work: it "
                         f"failed with status {done.returncode}{said}, naming no line of the "
                         f"kernel's source; {choose_another(chosen_by)}")


def _explain(errors: str, command: str) -> str:
    """The compiler's errors about the kernel's lines, with a hint for the usual one."""
    lines = [e for e in errors.splitlines() if "kernel.cu:" in e and "error" in e] \
        or errors.strip().splitlines()[-20:]
    hint = ""
    if "deleted" in errors and "minitfm::ref" in errors:
        hint = ("\n(an array element is kept whole, as in `auto v = x[i]` or `c ? x[i] : y[j]`:"
                " give it its type, `float v = x[i]`, or cast one side, `(float)x[i]`)")
    return (f"the kernel's source did not compile for the host ({command}); its errors, by "
            f"line of the kernel's source:\n" + "\n".join(lines[:20]) + hint)
