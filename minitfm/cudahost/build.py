"""Compile a kernel's host C++ with the machine's C++ compiler, once, and load it.

Host-only code. The compiler is the first of: ``$MINITFM_CXX`` (a command line, for example
``clang++`` or ``python -m ziglang c++``), ``$CXX``, ``c++``, ``g++``, ``clang++`` on the path,
and the clang that the ``ziglang`` package carries (installed with the ``test`` extra, for a
machine with no compiler of its own). ``-ffp-contract=off`` keeps ``a * b + c`` two roundings, as
the kernels' ``--fmad=false`` does on a device.

A compiled library is kept under ``$MINITFM_CACHE`` (default ``~/.cache/minitfm``), in
``cudahost/``, named by a hash of everything that went into it: the next run loads it at once.
"""

from __future__ import annotations

import ctypes
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

from minitfm.cudahost import rewrite

__all__ = ["BuildError", "compiler", "FLAGS", "HEADER", "Library", "build"]

HEADER = Path(__file__).with_name("cuda_host.h")
FLAGS = ("-std=c++14", "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math",
         "-fno-strict-aliasing", "-fno-threadsafe-statics", "-w")


class BuildError(RuntimeError):
    """No compiler, or the kernel's host C++ did not compile (the message has the errors)."""


def compiler() -> list[str]:
    """The compiler's command line (see the module's docstring); :class:`BuildError` if none."""
    for variable in ("MINITFM_CXX", "CXX"):
        if os.environ.get(variable, "").strip():
            return shlex.split(os.environ[variable])
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return [found]
    try:
        import ziglang  # noqa: F401  (only whether it is there)
        return [sys.executable, "-m", "ziglang", "c++"]
    except ImportError:
        pass
    raise BuildError("no C++ compiler to run the kernels on the host: install one (g++ or "
                     "clang++), or `pip install ziglang` (the test extra does), or name one in "
                     "MINITFM_CXX")


def cache_dir() -> Path:
    root = os.environ.get("MINITFM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "minitfm")
    path = Path(root) / "cudahost"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if os.access(path, os.W_OK | os.X_OK):
            return path
    except OSError:
        pass
    path = Path(tempfile.gettempdir()) / f"minitfm-cudahost-{os.getuid()}"   # a read-only home
    path.mkdir(parents=True, exist_ok=True)
    return path


class Library:
    """A compiled translation unit: ``entry(name)`` is the launch function of kernel ``name``;
    ``shadow_bytes`` the size of one element's race record; ``lock``, held by a launch (the
    library's state is its own: one launch at a time in it)."""

    def __init__(self, path: Path, host: rewrite.HostSource, unit: str):
        self.path, self.host, self.unit = path, host, unit
        self._dll = ctypes.CDLL(str(path))
        self.shadow_bytes = self._dll.minitfm_shadow_bytes()
        self.lock = threading.Lock()

    def entry(self, name: str):
        function = getattr(self._dll, f"minitfm_launch_{name}")
        function.restype = ctypes.c_int
        function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        return function


_loaded: dict[str, Library] = {}


def unit_of(source: str) -> tuple[rewrite.HostSource, str]:
    """The host source of ``source`` and the whole translation unit to compile."""
    host = rewrite.rewrite(source)
    unit = (f'#include "{HEADER.name}"\n#line 1 "kernel.cu"\n{host.text}\n'
            f'#line 1 "launch.cpp"\n{rewrite.wrappers(host.kernels)}')
    return host, unit


def build(source: str) -> Library:
    """``source`` compiled for the host and loaded (from the cache where it was built before)."""
    if source in _loaded:
        return _loaded[source]
    host, unit = unit_of(source)
    command = compiler()
    key = hashlib.sha256("\0".join([HEADER.read_text(), unit, *command, *FLAGS,
                                    sys.platform]).encode()).hexdigest()[:32]
    folder = cache_dir()
    target = folder / f"{key}.so"
    with FileLock(str(folder / f"{key}.lock")):
        if not target.exists():
            _compile(command, unit, target)
    library = _loaded[source] = Library(target, host, unit)
    return library


def _compile(command: list[str], unit: str, target: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="minitfm-cudahost-") as work:
        cpp = Path(work) / "kernel.cpp"
        cpp.write_text(unit)
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        line = [*command, *FLAGS, "-I", str(HEADER.parent), str(cpp), "-o", str(partial)]
        try:
            done = subprocess.run(line, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildError(f"the C++ compiler could not run ({shlex.join(command)}): {exc}; "
                             f"name another in MINITFM_CXX") from exc
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            raise BuildError(_explain(done.stderr, shlex.join(command)))
        os.replace(partial, target)


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
