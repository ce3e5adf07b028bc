"""``python -m minitfm.learn COMMAND``: the workshop's command line (see minitfm/learn/__init__.py).

    list                 every exercise in reading order, its state, and the progress
    start [NAME]         write the exercise into the workshop folder (the next one by default)
    check [NAME]         check it (the current exercise by default): 0 passed, 1 not yet
    watch                check the current exercise at every save; on to the next when it passes
    hint NAME            the next hint: the shapes, the chain-rule step, the derivation's start
    solution NAME        the library's own code, once the exercise passes (or with --reveal)
    train                the copy task on your passing layers, beside the library's run
    reset NAME           start over, the old attempt kept in the folder's attempts/

``--dir`` (default ``./workshop``) is the workshop folder, where the progress lives too.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time

from minitfm.workers import placement
from minitfm.cli import exits
from minitfm.cli.argtypes import Parser, integer, number
from minitfm.cli.reporting import report_errors
from minitfm.cli.exits import UsageError
from minitfm.data import DataError
from minitfm.learn import check as checking
from minitfm.learn import report as reporting
from minitfm.learn import worker
from minitfm.learn.exercises import EXERCISES, Exercise, by_name
from minitfm.learn.workshop import Workshop, digest

MAX_WAIT = 3600.0        # seconds: watch looks at the file at least once an hour
MAX_LIMIT = 86400.0      # seconds: a time limit of a day at most
MAX_STEPS = 100_000      # train: the library's run and the learner's, one after the other
MARKS = {"not started": " ", "started": "…", "written": "✗", "passing": "✓"}
PLAIN_MARKS = {"not started": " ", "started": "-", "written": "x", "passing": "+"}   # in ASCII


def marks() -> dict:
    """The states' marks in ``list``: in ASCII where standard output cannot show the others (a
    terminal in the POSIX locale)."""
    try:
        "".join(MARKS.values()).encode(sys.stdout.encoding or "ascii")
        return MARKS
    except (UnicodeEncodeError, LookupError):
        return PLAIN_MARKS


def readable_output() -> None:
    """Standard output and error that cannot show a character (the POSIX locale, Python's UTF-8
    mode off) show its escape, ``\\u2713``, rather than fail on it (a path, a learner's
    text)."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


def main(argv=None) -> int:
    readable_output()
    args = parse_args(argv)
    return report_errors(lambda: run(args))


def parse_args(argv) -> argparse.Namespace:
    parser = Parser(prog="python -m minitfm.learn", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="workshop",
                        help="the workshop folder (default ./workshop)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("list", help="the exercises, their states and the progress")
    start = commands.add_parser("start", help="write an exercise into the workshop folder")
    start.add_argument("name", nargs="?", help="the exercise (default: the next not passing)")
    start.add_argument("--hard", action="store_true",
                       help="leave the derivation of the backward pass out of the file")
    check = commands.add_parser("check", help="check an exercise")
    check.add_argument("name", nargs="?", help="the exercise (default: the current one)")
    check.add_argument("--seed", type=integer(0), default=0,
                       help="seeds the check's draw (default 0)")
    watch = commands.add_parser("watch", help="check at every save, moving on as each passes")
    watch.add_argument("--every", type=number(0, MAX_WAIT, low_open=True), default=0.5,
                       help="seconds between looks at the file (default 0.5)")
    for command in (check, watch):
        command.add_argument("--time-limit", type=number(0, MAX_LIMIT, low_open=True),
                             default=worker.LIMIT, metavar="SECONDS",
                             help=f"stop your code after this long and say where it was "
                                  f"(default {worker.LIMIT:g}: the library's code takes well "
                                  f"under a second)")
    hint = commands.add_parser("hint", help="the next hint of an exercise")
    hint.add_argument("name", nargs="?")
    solution = commands.add_parser("solution", help="the library's own code of an exercise")
    solution.add_argument("name", nargs="?")
    solution.add_argument("--reveal", action="store_true",
                          help="show it although the exercise does not pass yet")
    train = commands.add_parser("train", help="the copy task on your passing layers")
    train.add_argument("--steps", type=integer(1, MAX_STEPS), default=None,
                       help=f"updates (default: the copy task's 300; at most {MAX_STEPS:,}, "
                            f"the library's run and yours each)")
    train.add_argument("--seed", type=integer(0), default=0)
    train.add_argument("--time-limit", type=number(0, MAX_LIMIT, low_open=True), default=None,
                       metavar="SECONDS",
                       help="stop the run on your code after this long (default: five times "
                            "the library's run, and a minute more)")
    reset = commands.add_parser("reset", help="start an exercise over")
    reset.add_argument("name")
    reset.add_argument("--hard", action="store_true", default=None,
                       help="the new copy without the derivation")
    return parser.parse_args(argv)


def exercise(name: str | None, workshop: Workshop, default_next: bool = False) -> Exercise:
    """The exercise a command names, or the current one (or the next not passing)."""
    if name is None:
        current = workshop.current()
        if current is not None and not default_next:
            return current
        data = workshop.progress()
        found = next((e for e in EXERCISES if workshop.state(e, data) != "passing"), None)
        if found is None:
            raise UsageError("every exercise passes: name one to go over it again")
        if current is None and not default_next:
            raise UsageError(f"no exercise started yet: python -m minitfm.learn start "
                             f"{found.name}")
        return found
    try:
        return by_name(name)
    except KeyError:
        names = ", ".join(e.name for e in EXERCISES)
        raise UsageError(f"no exercise {name!r}: the exercises are {names} (or their numbers, "
                         f"1 to {len(EXERCISES)})") from None


def run(args: argparse.Namespace) -> int:
    workshop = Workshop(args.dir)
    workshop.check_folder()
    workshop.progress()                 # a damaged one said before anything starts
    placement.limit_blas_threads(1)     # the checks' and the copy task's arrays are small
    if args.command == "list":
        return show_list(workshop)
    if args.command == "start":
        ex = exercise(args.name, workshop, default_next=True)
        try:
            path = workshop.start(ex, args.hard)
        except FileExistsError as exc:
            raise UsageError(str(exc)) from None
        print(f"{path}: exercise {ex.number:02d}, {ex.title}.\nWrite the body of "
              f"{', '.join(ex.write)} there, then `python -m minitfm.learn check {ex.name}` "
              f"(or `watch`, which checks it at every save).")
        return exits.DONE
    if args.command == "check":
        ex = exercise(args.name, workshop)
        return check_one(workshop, ex, args.seed, args.time_limit)
    if args.command == "watch":
        return watch(workshop, args.every, limit=args.time_limit)
    if args.command == "hint":
        ex = exercise(args.name, workshop)
        k, text = workshop.next_hint(ex)
        print(textwrap.fill(f"hint {k} of 3 for {ex.name}: {text}", 96))
        return exits.DONE
    if args.command == "solution":
        return show_solution(workshop, exercise(args.name, workshop), args.reveal)
    if args.command == "train":
        from minitfm.learn import train
        agreed = train.train_and_compare(workshop, steps=args.steps, seed=args.seed,
                                         limit=args.time_limit)
        return exits.DONE if agreed else exits.FAILED
    if args.command == "reset":
        ex = exercise(args.name, workshop)
        path, kept = workshop.reset(ex, args.hard)
        print(f"{path}: a fresh copy of {ex.name}" + (f"; your attempt is kept as {kept}"
                                                       if kept else ""))
        return exits.DONE
    raise UsageError(f"unknown command {args.command!r}")


def show_list(workshop: Workshop) -> int:
    """The exercises and their states; an exercise whose file cannot be used is listed as
    such, and said on standard error (status 2)."""
    data = workshop.progress()
    states, problems = {}, []
    for e in EXERCISES:
        try:
            states[e.name] = workshop.state(e, data)
        except DataError as exc:
            states[e.name] = "unusable"
            problems.append(str(exc))
    passing = sum(s == "passing" for s in states.values())
    current, mark = data["current"], {**marks(), "unusable": "!"}
    print(f"the workshop in {workshop.path}: {passing} of {len(EXERCISES)} exercises pass")
    width = max(len(e.name) for e in EXERCISES)
    for e in EXERCISES:
        state = states[e.name]
        here = ">" if e.name == current else " "
        print(f" {here}{mark[state]} {e.number:02d} {e.name:<{width}}  {state:<11}  {e.title}")
    bar = "#" * round(30 * passing / len(EXERCISES))
    print(f"progress [{bar:<30}] {passing}/{len(EXERCISES)}", flush=True)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return exits.BAD_INPUT if problems else exits.DONE


def check_one(workshop: Workshop, ex: Exercise, seed: int = 0, limit: float = worker.LIMIT,
              cancel=None) -> int | None:
    """Check ``ex`` and say so: its exit status (None: cancelled, nothing said)."""
    path = workshop.file(ex)
    there = workshop.exists(ex)         # what is there instead of the file, said
    report = checking.run_check(ex, path, seed, limit, cancel)
    if report.status == "cancelled":
        return None
    print(reporting.describe(report), flush=True)
    if there:
        workshop.set_current(ex)
    if report.passed:
        workshop.record_pass(ex)
        after = workshop.next_after(ex)
        print(f"{ex.name} passes." + (f" Next: python -m minitfm.learn start {after.name}"
                                      if after else " Every exercise passes: "
                                      "python -m minitfm.learn train"))
        return exits.DONE
    if report.status == "fail":
        print(f"hint: python -m minitfm.learn hint {ex.name}")
    return exits.FAILED


def _stamp(path) -> str | None:
    """What the file holds now (a hash of its bytes: a save that keeps its size and gets its old
    time back is still seen), or None where it cannot be read."""
    try:
        return digest(path)
    except (OSError, ValueError):
        return None


def watch(workshop: Workshop, every: float = 0.5, stop=None, limit: float = worker.LIMIT
          ) -> int:
    """Check the current exercise (started if need be) whenever its file changes; when it
    passes, start the next and watch that. A save during a check cancels it, and the new file
    is checked. ``stop()``: end the loop when it says so (tests); else Ctrl-C ends it."""
    ex = exercise(None, workshop, default_next=workshop.current() is None)
    seen = None
    print(f"watching {workshop.file(ex)}: save it to check it (Ctrl-C to stop)", flush=True)
    while stop is None or not stop():
        path = workshop.file(ex)
        if not workshop.exists(ex):
            workshop.start(ex)
            print(f"started {path}", flush=True)
        stamp = _stamp(path)
        if stamp != seen:
            seen = stamp
            print(f"\n--- {time.strftime('%H:%M:%S')} {path.name}", flush=True)

            def saved_again(path=path, stamp=stamp):
                return _stamp(path) != stamp or (stop is not None and stop())
            status = check_one(workshop, ex, limit=limit, cancel=_every(0.2, saved_again))
            if status is None:
                print(f"--- {path.name} saved again during the check: checking it anew",
                      flush=True)
                seen = None
                continue
            if status == exits.DONE:
                following = workshop.next_after(ex)
                if following is None:
                    return exits.DONE
                ex, seen = following, None
                workshop.set_current(ex)
                print(f"watching {workshop.file(ex)}", flush=True)
                continue
        time.sleep(every)
    return exits.DONE


def _every(seconds: float, ask):
    """``ask`` asked at most once every ``seconds`` (its last answer in between)."""
    last = [0.0, False]

    def asked():
        now = time.monotonic()
        if now - last[0] >= seconds:
            last[:] = [now, ask()]
        return last[1]
    return asked


def show_solution(workshop: Workshop, ex: Exercise, reveal: bool) -> int:
    if workshop.state(ex) != "passing" and not reveal:
        raise UsageError(f"{ex.name} does not pass yet: pass its check first, or ask with "
                         f"--reveal")
    print(ex.kind.solution(ex))
    return exits.DONE


if __name__ == "__main__":
    sys.exit(main())
