"""The learner's code in a process of its own, under a time limit: what the check side asks of
it, and what comes back. Host-only code (processes and bytes).

Every run of a learner's file (a check's cases, a kernel's launch, ``train``'s run) happens in a
child process, forked from a command that has never run any of the learner's code (or, where
the system has no fork, started fresh): whatever that code does to ``numpy``, to the library or
to the process dies with the child, and the verdict is computed on the checking side alone, from
the arrays the child sends back. A child:

- is a process group of its own, killed whole (with anything it started) when the check ends,
  is cancelled, runs past its limit, or the command is stopped (Ctrl-C, SIGTERM); on Linux it
  also dies with the command if the command is killed;
- reads nothing from the terminal (its standard input is empty) and prints to the command's
  output, so a learner's ``print`` shows;
- runs a task in phases (compiling a kernel, running), each under its own limit; past it the
  child writes the stack of the running code (Python's ``faulthandler``: even a loop in
  compiled code), from which the learner's line is read, and is killed;
- ends in one of the ways of :class:`Outcome`: a result, an exception it raised (with the
  learner's line), an exit of its own (``sys.exit``, ``os._exit``), a signal (a crash), the time
  limit, or a cancel (``watch``: the file saved again).

What crosses from the child is plain data (:mod:`minitfm.learn.wire`): numbers, strings, lists,
tuples, dicts with string keys, and arrays of numbers, rebuilt from their bytes on the checking
side (never unpickled); anything else arrives as an ``Other`` naming its type.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import re
import signal
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from minitfm.learn.wire import decode, encode

__all__ = ["Outcome", "run", "LIMIT", "learner_lines", "LearnerExit", "outcome_words",
           "signal_name"]

LIMIT = 10.0            # seconds: a check of the library's own code takes well under one
GRACE = 2.0             # seconds after a phase's limit before the child is killed from outside
POLL = 0.05             # seconds between looks at a cancel request and the clock


# ---- how a run ends ----------------------------------------------------------------------------

@dataclass
class Outcome:
    """How the child's task ended: ``status`` "done" (``value`` its result), "raised" (an
    exception escaped the task: ``message`` says which, at the learner's line), "exit" (the
    process ended before it sent its result: an exit of the learner's code), "signal" (killed by
    a signal: a crash), "timeout" (past the limit of phase ``phase``), "cancelled"; ``where``
    the learner's lines of the stack when it ended that way, where known."""
    status: str
    value: object = None
    message: str = ""
    where: str = ""
    phase: str = ""
    limit: float = 0.0
    code: int | None = None

    @property
    def done(self) -> bool:
        return self.status == "done"


class LearnerExit(BaseException):
    """``os._exit`` called by the learner's code (in the child, it raises this instead, so that
    the line is known)."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


# ---- the child -----------------------------------------------------------------------------------

class Channel:
    """The child's side: ``send(tree)`` a message to the checking side; ``phase(name, limit)``
    starts a phase under its own time limit."""

    def __init__(self, conn, dump):
        self.conn, self.dump = conn, dump

    def send(self, tree) -> None:
        self.conn.send_bytes(encode(tree))

    def phase(self, name: str, limit: float) -> None:
        faulthandler.cancel_dump_traceback_later()
        faulthandler.dump_traceback_later(limit, exit=True, file=self.dump)
        self.send({"phase": name, "limit": float(limit)})


def _die_with(parent: int) -> None:
    """On Linux, the child is killed when the command that started it dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))          # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:                      # it died before prctl took effect
        os._exit(137)


def _child(task, payload: dict, conn, dump_path: str, limit: float, parent: int) -> None:
    real_exit = os._exit
    if hasattr(os, "setpgid"):
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
    _die_with(parent)
    for signum in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if signum is not None:
            signal.signal(signum, signal.SIG_DFL)
    status = 0
    with open(dump_path, "w", encoding="utf-8") as dump:
        faulthandler.enable(dump)                   # a crash: the stack, then the signal
        channel = Channel(conn, dump)

        def learner_exit(code=0):
            raise LearnerExit(code)
        os._exit = learner_exit
        try:
            channel.phase("run", limit)
            result = task(payload, channel)
            _flush()
            channel.send({"done": result})
        except BaseException as exc:                # noqa: B036 (the learner's exits too)
            _flush()
            try:
                channel.send({"raised": raised_words(exc, payload.get("path"))})
            except Exception:
                status = 3
        finally:
            faulthandler.cancel_dump_traceback_later()
    real_exit(status)


def _flush() -> None:
    """What the learner's code printed, out before the result (the child may be killed once it
    is sent)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def raised_words(exc: BaseException, path) -> str:
    """An exception that escaped a task, as the learner reads it."""
    from minitfm.learn.learner import location, where_in
    if isinstance(exc, (SystemExit, LearnerExit)):
        how = "os._exit" if isinstance(exc, LearnerExit) else "sys.exit"
        where = location(exc, path) if path else ""
        return (f"your code ended its process with {how}({exc.code!r}) before the check had "
                f"its results: a function of the exercise returns its results, it does not "
                f"end the program" + (f"\n{where}" if where else ""))
    if isinstance(exc, KeyboardInterrupt):
        return "your code was interrupted (KeyboardInterrupt)"
    return where_in(exc, path) if path else f"{type(exc).__name__}: {exc}"


# ---- the checking side -------------------------------------------------------------------------

def _context():
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    return multiprocessing.get_context(method)


def _start(process) -> None:
    """The child started in a process group of its own (both sides set it: no race)."""
    process.start()
    if hasattr(os, "setpgid"):
        try:
            os.setpgid(process.pid, process.pid)
        except OSError:
            pass


def _kill(process) -> None:
    """The child and its process group, killed and reaped."""
    if process.pid is None:
        return
    if hasattr(os, "killpg"):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass
    if process.is_alive():
        process.kill()
    process.join()


def run(task, payload: dict, *, limit: float = LIMIT, cancel=None, on_message=None) -> Outcome:
    """Run ``task(payload, channel)`` in a child (see the module's docstring; ``task`` a function
    of a module, so that a child started fresh finds it by name):
    its :class:`Outcome`. ``cancel()``: asked every few hundredths of a second, True ends the
    child at once ("cancelled"); ``on_message(tree)``: each message the task sends before its
    result."""
    ctx = _context()
    receive, send = ctx.Pipe(duplex=False)
    handle, dump_path = tempfile.mkstemp(prefix="minitfm-learn-", suffix=".txt")
    os.close(handle)
    process = ctx.Process(target=_child, args=(task, payload, send, dump_path, float(limit),
                                               os.getpid()), daemon=True)
    phase, phase_limit = "run", float(limit)
    for stream in (sys.stdout, sys.stderr):     # a forked child would print it again
        stream.flush()
    try:
        _start(process)
        send.close()
        deadline = time.monotonic() + phase_limit + GRACE
        while True:
            if cancel is not None and cancel():
                _kill(process)
                return Outcome("cancelled")
            message = None
            if receive.poll(POLL):
                try:
                    message = decode(receive.recv_bytes())
                except (EOFError, OSError):
                    break                               # the child is gone
                except (ValueError, KeyError, IndexError, TypeError, struct.error) as exc:
                    _kill(process)
                    return Outcome("raised", message=f"what your code sent back could not be "
                                                     f"read ({type(exc).__name__}: {exc})")
            if isinstance(message, dict) and "phase" in message:
                phase, phase_limit = str(message["phase"]), float(message["limit"])
                deadline = time.monotonic() + phase_limit + GRACE
            elif isinstance(message, dict) and "done" in message:
                process.join(GRACE)
                return Outcome("done", value=message["done"])
            elif isinstance(message, dict) and "raised" in message:
                process.join(GRACE)
                return Outcome("raised", message=str(message["raised"]))
            elif message is not None and on_message is not None:
                on_message(message)
            if message is None and not process.is_alive() and not receive.poll(0):
                break
            if time.monotonic() > deadline:
                _kill(process)
                return Outcome("timeout", where=learner_lines(_dumped(dump_path), payload),
                               phase=phase, limit=phase_limit)
        process.join(GRACE)
        if process.is_alive():
            _kill(process)
        return _ended(process.exitcode, _dumped(dump_path), payload, phase, phase_limit)
    finally:
        if process.pid is not None and process.exitcode is None:
            _kill(process)
        receive.close()
        try:
            os.unlink(dump_path)
        except OSError:
            pass


def _ended(code: int | None, dumped: str, payload: dict, phase: str, limit: float) -> Outcome:
    """How a child that sent no result ended: its exit code and the stack it dumped, if any."""
    where = learner_lines(dumped, payload)
    if dumped.startswith("Timeout ("):                  # faulthandler's, at the phase's limit
        return Outcome("timeout", where=where, phase=phase, limit=limit)
    if code is not None and code < 0:
        return Outcome("signal", code=code, where=where)
    return Outcome("exit", code=code, where=where)


def _dumped(path: str) -> str:
    """What the child's faulthandler wrote ("" where it wrote nothing, or it is unreadable)."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>\S+)', re.M)


def learner_lines(dumped: str, payload: dict) -> str:
    """The innermost line of the learner's file(s) in the stack the child dumped (its
    faulthandler's text), with its text: ``"01_linear.py, line 52, in backward:\\n    ..."``."""
    files = {str(Path(p).resolve()) for p in payload.get("paths", [payload.get("path")]) if p}
    for match in FRAME.finditer(dumped):
        if str(Path(match["file"]).resolve()) in files:
            line = int(match["line"])
            try:
                source = Path(match["file"]).read_text(encoding="utf-8").splitlines()
                shown = source[line - 1].strip() if 0 < line <= len(source) else ""
            except (OSError, UnicodeDecodeError):
                shown = ""
            return f"{Path(match['file']).name}, line {line}, in {match['name']}" + \
                (f":\n    {shown}" if shown else "")
    return ""


def signal_name(code: int | None) -> str:
    """A child's negative exit code as the signal's name and meaning."""
    if code is None or code >= 0:
        return f"status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"
    meaning = {"SIGSEGV": "a segmentation fault: memory read or written outside what was "
                          "allocated", "SIGABRT": "an abort (a failed assert, or abort())",
               "SIGFPE": "an arithmetic fault (an integer division by zero)",
               "SIGBUS": "a bus error", "SIGILL": "an illegal instruction (a trap)",
               "SIGKILL": "killed (out of memory?)"}.get(name, "")
    return name + (f", {meaning}" if meaning else "")


def outcome_words(outcome: Outcome, what: str = "your code") -> str:
    """A child's run that gave no result (:class:`~minitfm.learn.worker.Outcome`), in words."""
    where = f"\n{outcome.where}" if outcome.where else ""
    if outcome.status == "timeout":
        doing = "the compiler did not finish" if outcome.phase == "compile" else \
            f"{what} did not return"
        return (f"{doing} within {outcome.limit:g} s (the time limit: --time-limit), and was "
                f"stopped; where it was:{where or ' (not known)'}\n(an endless loop, or a "
                f"loop whose condition never turns false?)")
    if outcome.status == "raised":
        return outcome.message
    if outcome.status == "signal":
        return f"{what} crashed its process ({signal_name(outcome.code)}){where}"
    if outcome.status == "exit":
        return (f"{what} ended its process (exit status {outcome.code}) before the check had "
                f"its results: a function of the exercise returns its results, it does not "
                f"end the program{where}")
    return f"{what} did not finish ({outcome.status})"
