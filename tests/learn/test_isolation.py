"""The learner's code in a process of its own: every check ends, the learner's code cannot
change the verdict, and what it does wrong beyond its values (an endless loop, an exit, a crash,
a gradient of the wrong kind, a change in place, a patch of numpy) is named, never passed. A
learner's kernel cannot crash the command: a failing assert, __trap(), a stack that overflows, a
wild pointer are each a fault of its thread, and an #include of a file is refused."""

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy
import pytest

from minitfm.cli import exits
from minitfm.learn import __main__ as learn
from minitfm.learn import check, report, wire, worker
from minitfm.learn.exercises import by_name
from minitfm.learn.workshop import Workshop
from tests.learn.conftest import write_exercise
from tests import forkserver

ROOT = Path(__file__).resolve().parents[2]
LINEAR = by_name("linear")
DX = "dx = (dy2 @ cache.w.T)"                  # a line of linear's backward, to plant before
LIMIT = 1.5
HANG = 0.75                                   # the limit where the learner's code never ends


def planted(folder, before: str, ex=LINEAR, at=DX, function="backward"):
    """The exercise written with the library's code, ``before`` planted above the line ``at``
    (indented as it is)."""
    return write_exercise(folder, ex, {function: [(at, before.replace("\n", "\n    ") + "\n    "
                                                   + at)]})


def at_top(folder, line: str, ex=LINEAR):
    """The exercise written with the library's code, ``line`` at the top level of its file."""
    path = write_exercise(folder, ex)
    path.write_text(path.read_text(encoding="utf-8") + "\n" + line + "\n", encoding="utf-8")
    return path


def line_of(path: Path, text: str) -> int:
    return next(n for n, s in enumerate(path.read_text().splitlines(), 1) if text in s)


def test_an_endless_loop_is_stopped_at_the_learners_line(folder):
    path = planted(folder, "while True:\n    pass")
    started = time.monotonic()
    result = check.run_check(LINEAR, path, limit=HANG)
    assert time.monotonic() - started < HANG + worker.GRACE + 3
    text = report.describe(result)
    assert result.status == "fail", text
    assert f"did not return within {HANG:g} s" in text and "--time-limit" in text
    assert f"01_linear.py, line {line_of(path, 'while True:') + 1}, in backward" in text or \
        f"01_linear.py, line {line_of(path, 'while True:')}, in backward" in text, text


def test_an_endless_loop_at_import_is_stopped_too(folder):
    path = at_top(folder, "while True:\n    pass")
    result = check.run_check(LINEAR, path, limit=HANG)
    text = report.describe(result)
    assert result.status == "fail" and "did not return" in text
    assert "01_linear.py, line " in text and "in <module>" in text, text


EXITS = {"sys.exit(0)": "import sys; sys.exit(0)", "os._exit(0)": "import os; os._exit(0)",
         "SystemExit": "raise SystemExit(0)", "exit()": "exit()"}


@pytest.mark.parametrize("where", ["body", "import"])
@pytest.mark.parametrize("how", list(EXITS), ids=list(EXITS))
def test_an_exit_never_passes_and_is_named(how, where, folder):
    code = EXITS[how]
    path = planted(folder, code) if where == "body" else at_top(folder, code)
    result = check.run_check(LINEAR, path, limit=LIMIT)
    text = report.describe(result)
    assert result.status != "pass", text
    assert "ended its process" in text, text
    assert f"01_linear.py, line {line_of(path, code.split(';')[-1].strip())}" in text, text


def test_a_crash_is_named_with_its_line(folder):
    path = planted(folder, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    text = report.describe(result := check.run_check(LINEAR, path, limit=LIMIT))
    assert result.status == "fail" and "crashed its process (SIGSEGV" in text, text
    assert f"line {line_of(path, 'os.kill(')}, in backward" in text, text


def test_an_empty_file_or_a_deleted_backward_is_not_written(folder):
    path = write_exercise(folder, LINEAR)
    path.write_text("")
    result = check.run_check(LINEAR, path)
    assert result.status == "not written" and "defines no backward" in result.message
    text = write_exercise(folder, LINEAR).read_text()
    start = text.index("def backward(")
    path.write_text(text[:start])                       # backward deleted (it is the last)
    result = check.run_check(LINEAR, path)
    assert result.status == "not written", report.describe(result)
    path.write_text(text[:start] + "from minitfm.layers.linear import backward\n")
    result = check.run_check(LINEAR, path)
    assert result.status == "not written" and "defines no backward" in result.message
    path.write_text(text + "\nfrom minitfm.layers.linear import backward  # the library's\n")
    result = check.run_check(LINEAR, path)
    assert result.status == "not written" and "does not define backward" in result.message, \
        report.describe(result)


@pytest.mark.parametrize("returned, words", [
    ("dx + 0j", "complex numbers"),
    ('"dx"', "not an array: your backward gives a str"),
    ("dx.tolist()", "not an array: your backward gives a list"),
    ("dx.astype('float32')", "an array of float32, where the check's arrays are float64"),
    ("len", "not an array: your backward gives a builtin_function_or_method")])
def test_a_gradient_of_the_wrong_kind_is_named(returned, words, folder):
    path = write_exercise(folder, LINEAR, {"backward": [
        ("return dx, grads", f"dx = {returned}\n    return dx, grads")]})
    result = check.run_check(LINEAR, path)
    text = report.describe(result)
    assert result.status == "fail" and words in text, text
    assert "Traceback" not in text


def test_a_result_of_the_wrong_form_is_named(folder):
    path = write_exercise(folder, LINEAR, {"backward": [("return dx, grads",
                                                         "return [dx, grads]")]})
    result = check.run_check(LINEAR, path)
    text = report.describe(result)
    assert result.status == "fail" and "your backward returns a list" in text, text


@pytest.mark.parametrize("ex, change, named", [
    (LINEAR, "dy[...] = 0", "dy"),
    (by_name("layernorm"), "cache.xhat[...] = 0", "cache.xhat"),
    (by_name("layernorm"), "cache.gamma[...] *= 2", "cache.gamma")])
def test_what_a_backward_changes_in_place_is_named(ex, change, named, folder):
    first = {"linear": DX, "layernorm": "xhat, rstd, gamma = cache.xhat, cache.rstd, cache.gamma"}
    path = planted(folder, change, ex, first[ex.name])
    result = check.run_check(ex, path)
    out = report.describe(result)
    assert result.status == "fail", out
    assert f"your backward changes {named} in place" in out, out


def test_the_librarys_own_changes_in_place_are_allowed(folder):
    """loss.backward turns the cached exponentials into the gradient, as the contract says:
    the same in the learner's code passes."""
    ex = by_name("loss")
    assert check.run_check(ex, write_exercise(folder, ex)).status == "pass"


PATCH = ("import numpy, minitfm.learn.diagnose, minitfm.gradcheck.check\n"
         "numpy.allclose = numpy.array_equal = lambda *a, **k: True\n"
         "minitfm.learn.diagnose.distance = lambda *a, **k: 0.0\n"
         "minitfm.gradcheck.check.relative_error = lambda *a, **k: 0.0\n"
         "numpy.linalg.norm = lambda *a, **k: 0.0")


def test_a_patch_of_numpy_or_the_library_dies_with_its_check(folder, capsys):
    """A wrong backward that patches numpy and the checks at import fails; the next
    exercise, checked in the same command (as watch does), is judged by an unpatched library."""
    path = write_exercise(folder, LINEAR, {"backward": [(DX, "dx = 0 * (dy2 @ cache.w.T)")]})
    path.write_text(path.read_text() + "\n" + PATCH + "\n")
    result = check.run_check(LINEAR, path)
    assert result.status == "fail", report.describe(result)
    nxt = by_name("embedding")
    wrong = write_exercise(folder, nxt, {"backward": [("* cache.scale", "* 2.0")]})
    assert check.run_check(nxt, wrong).status == "fail"
    assert numpy.linalg.norm(numpy.ones(4)) == 2.0 and not numpy.allclose(1.0, 2.0)


def test_what_crosses_from_the_child_is_plain_data():
    tree = {"a": numpy.arange(6, dtype=numpy.float32).reshape(2, 3), "b": (1, 2.5, "x", None),
            "c": [numpy.float64(3.0), 1 + 2j, True], "d": numpy.zeros(0)}
    back = wire.decode(wire.encode(tree))
    assert back["a"].dtype == numpy.float32 and (back["a"] == tree["a"]).all()
    assert back["b"] == (1, 2.5, "x", None) and back["c"][1:] == [1 + 2j, True]
    assert isinstance(back["c"][0], numpy.float64) and back["d"].shape == (0,)
    assert wire.decode(wire.encode({5: 1})) == wire.Other("a dict")
    inner = wire.decode(wire.encode({"f": len, "o": numpy.array([object()])}))
    assert inner["f"] == wire.Other("a builtin_function_or_method")
    assert inner["o"] == wire.Other("an array of object")


def hanging_command(folder, grandchild: Path):
    """``check linear`` as a real process, its backward starting a process of its own (its
    pid written to ``grandchild``) and then looping."""
    planted(folder, "import subprocess, pathlib\n"
                    "child = subprocess.Popen(['sleep', '300'])\n"
                    f"pathlib.Path({str(grandchild)!r}).write_text(str(child.pid))\n"
                    "while True:\n    pass")
    return forkserver.Popen([sys.executable, "-m", "minitfm.learn", "--dir", str(folder),
                             "check", "linear", "--time-limit", "300"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return True
    return state == "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM"])
def test_a_signal_stops_a_hanging_check_at_once_and_nothing_outlives_it(signum, folder,
                                                                         tmp_path):
    grandchild = tmp_path / "grandchild.pid"
    command = hanging_command(folder, grandchild)
    deadline = time.monotonic() + 60
    while not grandchild.exists() or not grandchild.read_text():
        assert time.monotonic() < deadline and command.poll() is None, command.communicate()
        time.sleep(0.05)
    time.sleep(0.3)
    command.send_signal(signum)
    started = time.monotonic()
    out, err = command.communicate(timeout=20)
    assert time.monotonic() - started < 5, (out, err)
    assert command.returncode == exits.for_signal(signum), (out, err)
    pid = int(grandchild.read_text())
    deadline = time.monotonic() + 5
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid), f"the learner's process {pid} outlived the command"


def test_watch_checks_a_fix_saved_during_a_hanging_check(folder, capsys):
    workshop = Workshop(folder)
    path = planted(folder, "while True:\n    pass")
    workshop.set_current(LINEAR)

    def save_the_fix():
        time.sleep(0.5)
        write_exercise(folder, LINEAR)
    threading.Thread(target=save_the_fix, daemon=True).start()
    started = time.monotonic()

    def stop():
        return workshop.current().name == "embedding" or time.monotonic() - started > 60
    assert learn.watch(workshop, every=0.05, stop=stop, limit=120) == exits.DONE
    out = capsys.readouterr().out
    assert time.monotonic() - started < 30, out
    assert "saved again during the check" in out and "linear passes" in out, out
    assert path.exists()


KERNEL = by_name("kernel_dropout")
KERNEL_BODY = "    // TODO: write the kernel's body\n"


def kernel_file(folder, body: str) -> Path:
    path = Workshop(folder).start(KERNEL)
    path.write_text(path.read_text().replace(KERNEL_BODY, body))
    return path


def test_a_kernel_that_never_ends_is_stopped_at_its_loop(folder):
    path = kernel_file(folder, "    long long i = (long long)blockIdx.x * blockDim.x + "
                               "threadIdx.x;\n    while (i < n) { }\n")
    started = time.monotonic()
    result = check.run_check(KERNEL, path, limit=LIMIT)
    text = report.describe(result)
    assert time.monotonic() - started < 60, text        # the first compilation included
    assert result.status == "fail", text
    line = line_of(path, "while (i < n)")
    assert f"{path.name}, line {line}: has run" in text and "without ending" in text, text
    assert "block (0, 0, 0)" in text and "thread (" in text and "--time-limit" in text, text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_a_hanging_kernel_check_at_once(folder, tmp_path):
    path = kernel_file(folder, "    while (true) { }\n")
    check.run_check(KERNEL, path, limit=LIMIT)             # compiled once, outside the timing
    command = forkserver.Popen([sys.executable, "-m", "minitfm.learn", "--dir", str(folder),
                                "check", "kernel_dropout", "--time-limit", "300"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    children = []
    while not children:                                 # the kernel running, in a process of
        assert time.monotonic() < deadline and command.poll() is None, command.communicate()
        time.sleep(0.05)                                # its own
        children = Path(f"/proc/{command.pid}/task/{command.pid}/children").read_text().split()
    time.sleep(0.3)
    command.send_signal(signal.SIGINT)
    started = time.monotonic()
    out, err = command.communicate(timeout=20)
    assert time.monotonic() - started < 5 and command.returncode == 130, (out, err)
    deadline = time.monotonic() + 5
    while not all(gone(int(pid)) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(int(pid)) for pid in children), "the kernel's process outlived the command"


INDEX = "    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
WRITE = "    if (i < n) dx[i] = keep[i] ? dy[i] * scale : 0.0f;\n"
OVERFLOW = ("the thread's stack overflowed: its local arrays (or a recursion) need more than 512 "
            "KiB; a device thread has at most 512 KiB of local memory (block (0, 0, 0), thread "
            "(0, 0, 0))")


@pytest.mark.parametrize("top, body, marked, words", [
    ("#include <assert.h>\n", INDEX + "    assert(i != 299);\n" + WRITE, "assert(i != 299)",
     "assertion `i != 299` failed (on a device the launch ends with cudaErrorAssert) (block (1, "
     "0, 0), thread (43, 0, 0))"),
    ("", INDEX + "    if (i == 299) __trap();\n" + WRITE, "__trap()",
     "__trap() called: on a device the launch ends with an error (block (1, 0, 0), thread (43, "
     "0, 0))"),
    ("", "    volatile float big[262144];\n    big[threadIdx.x] = 1;\n" + INDEX + WRITE, None,
     OVERFLOW),
    ("", INDEX + "    if (i == 299) *(volatile int*)0 = 1;\n" + WRITE, None,
     "a segmentation fault: it read or wrote memory at address 0x0, which is no array's of the "
     "launch (a pointer that points nowhere, or a local array indexed outside itself?) (block "
     "(1, 0, 0), thread (43, 0, 0))"),
], ids=["assert", "__trap", "a local array of 1 MiB", "a null pointer"])
def test_a_kernel_that_would_crash_its_process_fails_with_its_thread(top, body, marked, words,
                                                                     folder):
    """Through the command: status 1, the fault at the learner's line where it is known, with
    its block and thread, and the verdict; never a traceback or a crash."""
    path = kernel_file(folder, body)
    path.write_text(top + path.read_text())
    done = forkserver.run([sys.executable, "-m", "minitfm.learn", "--dir", str(folder), "check",
                           "kernel_dropout"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == exits.FAILED, done.stdout + done.stderr
    where = f"{path.name}, line {line_of(path, marked)}: " if marked else ""
    assert f"\n    {where}{words}\n" in done.stdout, done.stdout
    assert "kernel_dropout: failed" in done.stdout and "crashed" not in done.stdout
    assert done.stderr == "", done.stderr


def test_an_include_of_a_file_is_refused_at_its_line(folder):
    """``#include "/dev/zero"`` would have the compiler read for ever: refused before it runs."""
    path = kernel_file(folder, INDEX + WRITE)
    path.write_text('#include "/dev/zero"\n' + path.read_text())
    started = time.monotonic()
    done = forkserver.run([sys.executable, "-m", "minitfm.learn", "--dir", str(folder), "check",
                           "kernel_dropout"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert time.monotonic() - started < 30
    assert done.returncode == exits.FAILED and done.stderr == "", done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "line 1: `#include \"/dev/zero\"` includes the file /dev/zero, which the host " \
           "execution does not read" in said and "paste what you need from that file" in said, said
    assert "kernel_dropout: could not run" in done.stdout
