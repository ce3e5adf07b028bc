"""The record of a run, ``run.json`` in its run directory: how the run started and every session
since, and what a resume is held to.

- The start, as it was written: ``"args"`` (every option as given: what a resume is held to,
  :func:`changed_options`), ``"config"``, ``"command"``, ``"started"``.
- Every resume appended to ``"resumes"``: its own command, options, start and ``"from_step"``.
- Each session (the start and every resume) gets its ``"outcome"`` (:func:`outcome`:
  ``"running"`` while it runs, then ``"finished"``, ``"stopped by SIGTERM"``, ``"failed: ..."``),
  with ``"ended"``, the ``"step"`` it reached and its ``"last_checkpoint"``. One that ended
  without a word (``kill -9``) is marked ``"ended unrecorded ..."`` by the next session: the run
  directory's lock says no other process runs it.
- A fresh start in a directory whose earlier attempt left a record but no checkpoint keeps that
  record in ``"earlier"``; a record that cannot be read is moved aside (``run.json.unreadable``,
  a later one to ``run.json.unreadable.1``, ``.2``, ...), never overwritten, and no copy kept
  aside before is either.
- With a best metric, ``"best"``: the metric, its best value so far and the step of that
  validation.

The file is written whole or not at all (``files.replacing``), and only once the checks of a new
or resumed run have passed: a command refused before training changes nothing in it.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import signal
import sys

from minitfm import files
from minitfm.training.state import config_field

__all__ = ["RUNNING", "UNREADABLE_SUFFIX", "RunRecord", "outcome", "changed_options",
           "command_line", "timestamp"]

UNREADABLE_SUFFIX = ".unreadable"      # an unreadable run.json is kept under this name
RUNNING = "running"                    # a session's outcome until it ends


class RunRecord:
    """The record at ``path`` (``run.json``), and which of its sessions this process runs."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._recorded = False                  # this session's start is in the record ...
        self._session: int | None = None        # ... as resume number _session (None: the start)

    def read(self) -> tuple[dict, str | None]:
        """The record as a dict ({} if there is none), and why it cannot be read (None if it
        can). A read the system fails (an I/O error: the file was not judged) raises
        ``files.ReadError``."""
        try:
            with open(self.path, encoding="utf-8") as f:
                record = json.load(f)
        except FileNotFoundError:
            return {}, None
        except OSError as exc:
            files.raise_if_read_failed(self.path, exc)
            return {}, str(exc)
        except ValueError as exc:
            return {}, str(exc)
        if not isinstance(record, dict):
            return {}, f"a JSON {type(record).__name__}, not an object"
        return record, None

    def started_args(self) -> dict:
        """The options the run was started with ({} where the record does not say)."""
        args = self.read()[0].get("args")
        return args if isinstance(args, dict) else {}

    def start(self, step: int, run_info: dict, resumed: bool) -> None:
        """Record this session (``run_info``: its ``"args"``, ``"config"`` and so on) at
        ``step``: as the start of the run, or with ``resumed`` as one more entry of
        ``"resumes"``, the start kept as it is. Raises ``OSError`` if it cannot be written."""
        session = {**run_info, "command": command_line(), "started": timestamp(),
                   "outcome": RUNNING}
        record, unreadable = self.read()
        if unreadable:
            aside = _free_name(self.path + UNREADABLE_SUFFIX)
            os.rename(self.path, aside)         # a free name: no earlier copy is replaced
            print(f"warning: {self.path} could not be read ({unreadable}): kept as {aside}; a "
                  f"new record starts here", file=sys.stderr, flush=True)
        for earlier in [record, *record.get("resumes", [])]:
            if earlier.get("outcome") == RUNNING:     # its process is gone: the lock is ours
                earlier["outcome"] = ("ended unrecorded (killed, or the machine stopped); what "
                                      "it kept is its last checkpoint")
        if not resumed:
            earlier = [*record.pop("earlier", []), record] if record else []
            record = {**session, **({"earlier": earlier} if earlier else {})}
            self._session = None
        else:
            if not record:
                record = {"start": f"not recorded: {os.path.basename(self.path)} was "
                                   f"{'unreadable' if unreadable else 'missing'} when the run "
                                   f"was resumed at step {step}"}
            session.pop("config", None)         # a resume has the run's config (checked)
            record.setdefault("resumes", []).append({**session, "from_step": step})
            self._session = len(record["resumes"]) - 1
        _write(self.path, record)
        self._recorded = True

    def end(self, outcome: str, step: int, last_checkpoint: str | None = None) -> None:
        """Record how this process's session ended (``outcome``, at ``step``, its newest
        checkpoint ``last_checkpoint``), if it recorded its start. A read or write that fails is
        said on stderr (a warning), not raised: the error that ended the run (a full disk, say)
        is the one to report."""
        if not self._recorded:
            return
        self._recorded = False
        try:
            record, unreadable = self.read()
            resumes = record.get("resumes", [])
            session = record if self._session is None else (
                resumes[self._session] if self._session < len(resumes) else None)
            if unreadable or not isinstance(session, dict):
                return
            session.update({"outcome": outcome, "ended": timestamp(), "step": step,
                            "last_checkpoint": last_checkpoint
                            and os.path.basename(last_checkpoint)})
            _write(self.path, record)
        except OSError as exc:                  # a read the system failed, or the write
            failed = exc if isinstance(exc, files.ReadError) else files.write_error(self.path,
                                                                                    exc)
            print(f"warning: could not record the outcome ({outcome}) in {self.path}: "
                  f"{failed.strerror}", file=sys.stderr, flush=True)

    def set_best(self, best: dict) -> None:
        """Set the record's ``"best"``, keeping the rest (nothing, for a record that cannot be
        read: it was kept aside when the session started). Raises ``OSError`` if it cannot be
        written."""
        record, unreadable = self.read()
        if unreadable:
            return
        record["best"] = best
        _write(self.path, record)


def outcome(state, exc: BaseException | None, patience: int) -> str:
    """How a session that ends in ``state`` (a ``TrainState``) ended, in words: ``exc`` the
    error that ended it, ``patience`` the run's."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, MemoryError):
        return "failed: out of memory" + (f" ({exc})" if str(exc) else "")
    if exc is not None:
        text = str(exc).strip().splitlines()
        return f"failed: {text[0] if text else type(exc).__name__}"
    if state.interrupted:
        return f"stopped by {signal.Signals(state.stop_signal or signal.SIGINT).name}"
    if state.out_of_patience:
        return f"stopped: no better {state.record.metric} in {patience} validations"
    if state.out_of_time:
        return "stopped: time limit reached"
    return "finished"


def changed_options(started: dict, now: dict, names, config: dict) -> list[str]:
    """The options of ``names`` that differ between the run's start (``started``) and ``now``,
    each as "--name: the run has X, now Y". An option left out (None) at the start took its
    preset's value, which the run's ``config`` holds (in the field ``config_field(name)``), and
    is compared by that value; one left out now is compared by the config once it is built."""
    changed = []
    for name in dict.fromkeys(names):
        if name not in started:
            continue
        was, value, field = started[name], now.get(name), config_field(name)
        if was is None and value is not None and field in config:
            if config[field] != value:
                changed.append(f"--{name.replace('_', '-')}: the run has {config[field]!r} "
                               f"(its preset's), now {value!r}")
        elif was is not None and value is None and field in config:
            continue
        elif was != value:
            changed.append(f"--{name.replace('_', '-')}: the run has {_given(was)}, now "
                           f"{_given(value)}")
    return changed


def _given(value) -> str:
    """An option's value in a message: its repr, or "none given" for an option left out."""
    return "none given" if value is None else repr(value)


def command_line() -> str:
    """This process's command line, as a shell would take it."""
    return shlex.join([os.path.basename(sys.executable), *sys.argv])


def timestamp() -> str:
    """Now, local time with its offset, to the second."""
    return datetime.datetime.now().astimezone().isoformat(sep=" ", timespec="seconds")


def _free_name(path: str) -> str:
    """``path`` if nothing is there, else the first of ``path.1``, ``path.2``, ... that is free
    (the run directory's lock keeps another process from taking it meanwhile)."""
    name, number = path, 0
    while os.path.lexists(name):
        number += 1
        name = f"{path}.{number}"
    return name


def _write(path: str, record: dict) -> None:
    """Write ``record`` whole or not at all (files.replacing)."""
    with files.replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(record, indent=1) + "\n")
