"""The tests' commands forked from a server (tests/forkserver.py) end as real processes do: the
same status, output and errors for the same program, and a real process wherever a fork would
not start as one does."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]

PROGRAMS = {
    "argv, __name__ and the path": "import sys; print(sys.argv, __name__, repr(sys.path[0]))",
    "an exit status": "import sys; print('out'); sys.exit(3)",
    "an exit status above 255": "import sys; sys.exit(258)",
    "a message for sys.exit": "import sys; sys.exit('it ends here')",
    "an uncaught error": "def f():\n    return 1 / 0\nf()",
    "an uncaught KeyboardInterrupt": "raise KeyboardInterrupt",
    "standard input, its line ends kept": "import sys; print(repr(sys.stdin.read()))",
    "the environment and the folder": "import os; print(os.environ['ASKED'], os.getcwd())",
    "a thread that is not a daemon": ("import threading, time\n"
                                      "threading.Thread(target=lambda: (time.sleep(0.2), "
                                      "print('joined'))).start()"),
    "exit handlers, last registered first": ("import atexit\natexit.register(print, 'first')\n"
                                             "atexit.register(print, 'second')"),
    "an error in an exit handler": "import atexit; atexit.register(lambda: 1 / 0)",
    "streams' encoding and buffering": ("import sys; print(sys.stdout.encoding, "
                                        "sys.stdout.line_buffering, sys.stderr.line_buffering, "
                                        "sys.stdout.isatty())"),
    "a signal it catches": ("import os, signal, sys\n"
                            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
                            "os.kill(os.getpid(), signal.SIGTERM)"),
}


def both(args, **options):
    """``args`` as a fork and as a real process: (status, stdout, stderr) of each, the
    addresses of objects aside."""
    options = {"capture_output": True, "text": True, "timeout": 60, **options}
    fork = forkserver.run(args, **options)
    real = subprocess.run(args, **options)
    return [(done.returncode, *(re.sub("0x[0-9a-f]+", "0x", text)
                                for text in (done.stdout, done.stderr))) for done in (fork, real)]


@pytest.mark.parametrize("program", list(PROGRAMS.values()), ids=list(PROGRAMS))
def test_a_fork_ends_as_a_real_process(program, tmp_path):
    env = {**os.environ, "ASKED": "asked"}
    fork, real = both([sys.executable, "-c", program, "one", "two"], cwd=tmp_path, env=env,
                      input="a\r\nb\rc\n")
    assert fork == real


def test_a_script_and_a_module_run_as_main(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(__name__, sys.argv, sys.path[0] == "
                      f"{str(tmp_path)!r})\nraise SystemExit(5)\n")
    fork, real = both([sys.executable, str(script), "x"], cwd=tmp_path)
    assert fork == real and fork[0] == 5
    fork, real = both([sys.executable, "-m", "minitfm.translate", "--no-such-option"],
                      cwd=ROOT)
    assert fork == real and fork[0] == 2 and "--checkpoint" in fork[2]


def test_a_command_of_the_library_is_forked_and_ends_as_it_does(tmp_path):
    args = [sys.executable, str(ROOT / "train_toy.py"), "--preset", "tiny", "--max-steps", "0",
            "--out", str(tmp_path / "run")]
    process = forkserver.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=120)
    assert forkserver.served(process)
    real = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert (process.returncode, out, err) == (real.returncode, real.stdout, real.stderr)


def test_a_fork_is_a_process_of_its_own_that_signals_end():
    process = forkserver.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                               start_new_session=True)
    assert forkserver.served(process) and process.pid != os.getpid()
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.2)
    assert os.getpgid(process.pid) == process.pid          # a session of its own, as asked
    process.send_signal(signal.SIGTERM)
    assert process.wait(10) == -signal.SIGTERM


def test_a_timeout_kills_the_fork():
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.3)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("change", [
    {"LC_ALL": "C"}, {"PYTHONIOENCODING": "latin-1"}, {"OPENBLAS_NUM_THREADS": "1"},
    {"PYTHONPATH": "numpy"}, {"PYTHONPATH": "minitfm"}],
    ids=["LC_ALL", "PYTHONIOENCODING", "OPENBLAS_NUM_THREADS", "PYTHONPATH holding a numpy",
         "PYTHONPATH holding another minitfm"])
def test_what_python_or_numpy_read_as_they_start_asks_for_a_real_process(change, tmp_path):
    """A variable read as Python, NumPy or OpenBLAS load, or a path where another copy of a
    module the server imported is: a real process (whose own start reads them)."""
    if "PYTHONPATH" in change:
        (tmp_path / change["PYTHONPATH"]).mkdir()
        (tmp_path / change["PYTHONPATH"] / "__init__.py").write_text("")
        change = {"PYTHONPATH": str(tmp_path)}
    process = forkserver.Popen([sys.executable, "-c", "print(1)"], cwd=tmp_path,
                               env={**os.environ, **change}, stdout=subprocess.PIPE)
    process.communicate(timeout=60)
    assert not forkserver.served(process)


def test_a_long_program_and_environment_reach_the_fork():
    """A request larger than one message of the socket (about 200 KiB here) arrives whole."""
    program = "import os\n" + "x = 0\n" * 20_000 + "print(sum(len(os.environ[f'BIG{i}']) " \
        "for i in range(3)), x)"
    big = {f"BIG{i}": "b" * 100_000 for i in range(3)}
    fork, real = both([sys.executable, "-c", program], env={**os.environ, **big})
    assert fork == real == (0, "300000 0\n", "")


def test_a_path_of_other_modules_is_served_and_reaches_the_command(tmp_path):
    (tmp_path / "elsewhere.py").write_text("WHERE = 'here'\n")
    fork, real = both([sys.executable, "-c", "import elsewhere; print(elsewhere.WHERE)"],
                      env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert fork == real == (0, "here\n", "")


def test_what_runs_as_a_real_process_otherwise():
    for args, options in [([sys.executable, "-X", "utf8", "-c", "print(1)"], {}),
                          (["true"], {}),
                          ([sys.executable, "-c", "print(1)"], {"preexec_fn": os.getpid})]:
        process = forkserver.Popen(args, stdout=subprocess.PIPE, **options)
        process.communicate(timeout=60)
        assert not forkserver.served(process) and process.returncode == 0, args
