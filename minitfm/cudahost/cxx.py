"""The C++ compiler that builds the kernels for the host: which one, and how to name it.

Host-only code. The compiler is the first of: ``$MINITFM_CXX`` (a command line, for example
``clang++`` or ``python -m ziglang c++``), ``$CXX``, ``c++``, ``g++``, ``clang++`` on the path,
and the clang that the ``ziglang`` package carries (installed with the ``test`` extra, for a
machine with no compiler of its own). A compiler that is not there, cannot run, or fails naming
no line of the source is a :class:`CompilerError` (a setting, not the kernel's fault), named with
the variable that chose it and how to choose another; :func:`check_compiler` finds a program
that is not there before anything is compiled (:mod:`minitfm.cudahost.build` compiles).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys

from minitfm.backend import BackendError

__all__ = ["BuildError", "CompilerError", "chosen_compiler", "check_compiler", "compiler",
           "named", "choose_another"]


class BuildError(RuntimeError):
    """No compiler, a compiler that fails, or a kernel's host C++ that did not compile (the
    message has the errors)."""


class CompilerError(BuildError, BackendError):
    """The C++ compiler is not there, cannot run, or does not work (it fails naming no line of
    the kernel's source): a setting to change, named with the variable that chose it (a
    ``BackendError`` too: as a backend this machine cannot run, it is bad input, status 2)."""


def chosen_compiler() -> tuple[list[str], str]:
    """The compiler's command line (see the module's docstring) and what chose it:
    ``"MINITFM_CXX"``, ``"CXX"`` or ``"default"``; :class:`BuildError` if there is none."""
    for variable in ("MINITFM_CXX", "CXX"):
        if os.environ.get(variable, "").strip():
            try:
                command = shlex.split(os.environ[variable])
            except ValueError as exc:
                raise CompilerError(f"{variable}={os.environ[variable]!r} is not a command line "
                                    f"({exc}): {choose_another(variable)}") from None
            if command and command[0]:
                return command, variable
            raise CompilerError(f"{variable}={os.environ[variable]!r} names no program: "
                                f"{choose_another(variable)}")
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return [found], "default"
    try:
        import ziglang  # noqa: F401  (only whether it is there)
        return [sys.executable, "-m", "ziglang", "c++"], "default"
    except ImportError:
        pass
    raise CompilerError("no C++ compiler to run the kernels on the host: install one (g++ or "
                        "clang++), or `pip install ziglang` (the test extra does), or name one "
                        "in MINITFM_CXX")


def check_compiler() -> None:
    """The compiler's program is there to run; else :class:`CompilerError`, naming it, the
    variable that chose it and how to choose another (found here, before a process of its own
    compiles: a setting at fault is said as one, not as the kernel's)."""
    command, chosen_by = chosen_compiler()
    if shutil.which(command[0]) is None:
        where = "there (missing, or not a program)" if os.sep in command[0] else "on the PATH"
        raise CompilerError(f"the C++ compiler {named(command, chosen_by)} cannot run: there is "
                            f"no program {command[0]} {where}; {choose_another(chosen_by)}")


def compiler() -> list[str]:
    """The compiler's command line (see the module's docstring); :class:`BuildError` if none."""
    return chosen_compiler()[0]


def named(command: list[str], chosen_by: str) -> str:
    """The compiler in words: its command line and what chose it."""
    how = ("the first C++ compiler found on this machine" if chosen_by == "default"
           else f"named by {chosen_by}")
    return f"{shlex.join(command)} ({how})"


def choose_another(chosen_by: str) -> str:
    """How to choose a compiler other than the one ``chosen_by`` chose."""
    working = "a C++ compiler that works (g++, clang++, or `python -m ziglang c++`)"
    if chosen_by == "MINITFM_CXX":
        return f"set MINITFM_CXX to {working}, or unset it to use CXX or the machine's"
    if chosen_by == "CXX":
        return f"set CXX, or MINITFM_CXX (which comes first), to {working}"
    return f"name {working} in MINITFM_CXX"
