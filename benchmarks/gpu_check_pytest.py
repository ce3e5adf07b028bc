"""``pytest -m gpu`` within a time budget, for the GPU check: what passed, failed, skipped, and
what was left out for time.

:func:`run_tests` starts pytest in a subprocess with this module as a plugin (``-p
gpu_check_pytest``). The plugin runs the collected tests quickest first (those marked ``slow``
last, each group in collection order), starts none after the deadline, and writes one JSON line
per event to a log file: the collected node ids, then each outcome. A test still running at the
deadline plus a grace period is stopped with the whole process group; the log then names it
as interrupted, and every test that never started as left out. A file that fails to import
(a package the machine lacks) is an error of its own and the others still run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DEADLINE_VARIABLE, LOG_VARIABLE = "GPU_CHECK_DEADLINE", "GPU_CHECK_PYTEST_LOG"


# ---- the plugin (inside pytest) ------------------------------------------------------------------

def _write(event: dict) -> None:
    with open(os.environ[LOG_VARIABLE], "a", encoding="utf-8") as log:
        log.write(json.dumps(event) + "\n")


def pytest_collection_modifyitems(session, config, items) -> None:
    items.sort(key=lambda item: item.get_closest_marker("slow") is not None)
    _write({"collected": [item.nodeid for item in items]})


def pytest_collectreport(report) -> None:
    if report.failed:
        _write({"test": report.nodeid, "outcome": "error", "when": "collect",
                "message": _first_line(report)})


def pytest_runtest_protocol(item, nextitem):
    if time.time() > float(os.environ[DEADLINE_VARIABLE]):
        return True                      # not started: the runner counts it as left out
    _write({"started": item.nodeid})
    return None


def pytest_runtest_logreport(report) -> None:
    if report.when == "call" or report.outcome != "passed":
        outcome = report.outcome if report.when == "call" or report.skipped else "error"
        _write({"test": report.nodeid, "outcome": outcome, "when": report.when,
                "seconds": round(report.duration, 3), "message": _first_line(report)})


def _first_line(report) -> str:
    if report.passed:
        return ""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    text = str(report.longrepr or "")
    errors = [line for line in text.splitlines() if line.startswith("E ")]
    return (errors[0][1:].strip() if errors else text.strip().splitlines()[-1:] or [""])[0][:300]


# ---- the runner (in the GPU check) ---------------------------------------------------------------

def run_tests(root: Path, log: Path, budget_s: float, marker: str = "gpu",
              paths: tuple[str, ...] = (), grace_s: float = 20.0, env: dict | None = None) -> dict:
    """Run ``pytest -m MARKER [PATHS]`` from ``root`` for at most ``budget_s`` seconds (no test
    starts later; a running one gets ``grace_s`` more) and summarise its log."""
    log.unlink(missing_ok=True)
    log.touch()
    env = dict(os.environ if env is None else env)
    here = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join([here, str(root), *filter(None, [env.get("PYTHONPATH")])])
    env[LOG_VARIABLE], env[DEADLINE_VARIABLE] = str(log), str(time.time() + budget_s)
    command = [sys.executable, "-m", "pytest", "-m", marker, *paths, "-p", "gpu_check_pytest",
               "-p", "no:cacheprovider", "-q", "--continue-on-collection-errors"]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=budget_s + grace_s)
        stopped = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        stopped = True
    summary = summarise([json.loads(line) for line in log.read_text().splitlines() if line])
    summary.update(command="pytest " + " ".join(command[3:]), budget_s=budget_s,
                   seconds=round(time.perf_counter() - started, 1), returncode=process.returncode,
                   stopped_at_grace=stopped, output_tail=output[-2000:])
    return summary


def summarise(events: list[dict]) -> dict:
    """Counts and names from the plugin's events."""
    collected, started, outcomes = [], [], {}
    for event in events:
        collected += event.get("collected", [])
        if "started" in event:
            started.append(event["started"])
        elif "test" in event:
            previous = outcomes.get(event["test"])
            if previous is None or previous["outcome"] in ("passed", "skipped"):
                outcomes[event["test"]] = event        # a teardown error outranks a pass
    by = {kind: sorted(t for t, e in outcomes.items() if e["outcome"] == kind)
          for kind in ("passed", "failed", "skipped", "error")}
    interrupted = [t for t in started if t not in outcomes]
    left_out = [t for t in collected if t not in outcomes and t not in interrupted]
    return {"collected": len(collected), "passed": len(by["passed"]),
            "failed": len(by["failed"]), "skipped": len(by["skipped"]),
            "errors": len(by["error"]),
            "failures": [{"test": t, "message": outcomes[t]["message"]}
                         for t in by["failed"] + by["error"]],
            "interrupted": interrupted, "left_out_for_time": left_out}
