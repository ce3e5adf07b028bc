"""The workshop's folder and command line: start, list, check, hint, solution, reset and watch,
progress kept in the folder, and nothing written outside it."""

import hashlib
import json
import os
import sys
from pathlib import Path

from minitfm.cli import exits
from minitfm.learn import __main__ as learn
from minitfm.learn.exercises import EXERCISES, by_name
from minitfm.learn.workshop import Workshop
from tests.learn.conftest import write_exercise
from tests import forkserver

ROOT = Path(__file__).resolve().parents[2]

PACKAGE = Path(learn.__file__).resolve().parents[1]


def run(folder, *argv, capsys):
    status = learn.main(["--dir", str(folder), *argv])
    return status, capsys.readouterr()


def test_start_check_and_list(folder, capsys):
    status, out = run(folder, "start", capsys=capsys)
    assert status == exits.DONE and "01_linear.py" in out.out
    status, out = run(folder, "check", capsys=capsys)
    assert status == exits.FAILED and "not written yet" in out.out
    write_exercise(folder, by_name("linear"))
    status, out = run(folder, "check", capsys=capsys)
    assert status == exits.DONE and "linear passes" in out.out and "start embedding" in out.out
    status, out = run(folder, "list", capsys=capsys)
    lines = out.out.splitlines()
    assert "1 of 21 exercises pass" in lines[0]
    assert ">✓ 01 linear" in lines[1] and "passing" in lines[1]
    assert "02 embedding" in lines[2] and "not started" in lines[2]
    assert lines[-1].startswith("progress [#")
    progress = json.loads((folder / "progress.json").read_text())
    assert progress["current"] == "linear" and "linear" in progress["passed"]


def test_a_passing_exercise_edited_is_written_again(folder, capsys):
    ex = by_name("softmax")
    path = write_exercise(folder, ex)
    assert run(folder, "check", "softmax", capsys=capsys)[0] == exits.DONE
    assert Workshop(folder).state(ex) == "passing"
    path.write_text(path.read_text() + "\n# a note\n")
    assert Workshop(folder).state(ex) == "written"


def test_start_refuses_to_overwrite_and_reset_keeps_the_attempt(folder, capsys):
    run(folder, "start", "layernorm", capsys=capsys)
    path = Workshop(folder).file(by_name("layernorm"))
    path.write_text(path.read_text() + "# my attempt\n")
    status, out = run(folder, "start", "layernorm", capsys=capsys)
    assert status == exits.BAD_INPUT and "exists already" in out.err and "reset" in out.err
    status, out = run(folder, "reset", "layernorm", capsys=capsys)
    kept = folder / "attempts" / "06_layernorm.1.py"
    assert status == exits.DONE and kept.read_text().endswith("# my attempt\n")
    assert "# my attempt" not in path.read_text()
    run(folder, "reset", "layernorm", capsys=capsys)
    assert (folder / "attempts" / "06_layernorm.2.py").exists()


def test_hints_come_in_order(folder, capsys):
    run(folder, "start", "layernorm", capsys=capsys)
    hints = [run(folder, "hint", "layernorm", capsys=capsys)[1].out for _ in range(4)]
    assert hints[0].startswith("hint 1 of 3") and "(3, 5, 6)" in hints[0]
    assert hints[1].startswith("hint 2 of 3") and "three paths" in hints[1]
    assert hints[2].startswith("hint 3 of 3") and "dL/dgamma = sum_rows dy * xhat" in hints[2]
    assert hints[3] == hints[2]
    kernel = run(folder, "hint", "kernel_softmax", capsys=capsys)[1].out
    assert "blockIdx.x" in kernel


def test_the_solution_only_once_it_passes(folder, capsys):
    run(folder, "start", "softmax", capsys=capsys)
    status, out = run(folder, "solution", "softmax", capsys=capsys)
    assert status == exits.BAD_INPUT and "--reveal" in out.err
    status, out = run(folder, "solution", "softmax", "--reveal", capsys=capsys)
    assert status == exits.DONE and "def backward(dp, p, scale):" in out.out
    status, out = run(folder, "solution", "kernel_softmax", "--reveal", capsys=capsys)
    assert "softmax_backward" in out.out and "block_sum" in out.out


def test_an_unknown_exercise_is_a_usage_error(folder, capsys):
    status, out = run(folder, "check", "layernrom", capsys=capsys)
    assert status == exits.BAD_INPUT and "no exercise 'layernrom'" in out.err
    assert "layernorm" in out.err


def test_watch_moves_on_when_an_exercise_passes(folder, capsys):
    workshop = Workshop(folder)
    workshop.start(by_name("linear"))
    looks = []

    def stop():
        looks.append(1)
        if len(looks) == 2:                     # after the first check: the learner saves
            write_exercise(folder, by_name("linear"))
        return workshop.current() is not None and workshop.current().name == "embedding" \
            and len(looks) > 4
    assert learn.watch(workshop, every=0.01, stop=stop) == exits.DONE
    out = capsys.readouterr().out
    assert out.index("not written yet") < out.index("linear passes")
    assert "watching" in out and "02_embedding.py" in out
    assert workshop.file(by_name("embedding")).exists()


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()


def test_nothing_is_written_outside_the_workshop_folder(tmp_path):
    """The commands as a learner runs them, in a folder of their own: the package is unchanged
    and the folder holds only the workshop."""
    before = _tree_digest(PACKAGE)
    folder = tmp_path / "learner"
    folder.mkdir()
    for argv in (["start"], ["check"], ["hint", "linear"], ["list"], ["reset", "linear"]):
        forkserver.run([sys.executable, "-m", "minitfm.learn", *argv], cwd=folder,
                       capture_output=True, check=False, timeout=120)
    assert _tree_digest(PACKAGE) == before
    assert sorted(p.name for p in folder.iterdir()) == ["workshop"]
    names = sorted(p.name for p in (folder / "workshop").iterdir())
    assert names == ["01_linear.py", "attempts", "progress.json"]


def test_the_command_reports_through_its_exit_status(tmp_path):
    """A real process: the module's entry point, its statuses and one error line."""
    done = forkserver.run([sys.executable, "-m", "minitfm.learn", "--dir", str(tmp_path / "w"),
                           "check", "nonsense"], capture_output=True, text=True, timeout=120)
    assert done.returncode == exits.BAD_INPUT
    assert done.stderr.startswith("error: no exercise 'nonsense'")
    assert len(EXERCISES) == 21


def test_a_file_saved_in_another_encoding_is_named_with_the_fix(tmp_path):
    """The learner's file saved as UTF-16 by an editor, or in Windows-1252: check names the
    file, the line and the encoding, and says how to save it as UTF-8 (before, a bare "'utf-8'
    codec can't decode byte 0xff" naming no file); list shows it written, and the kernel's
    exercise says the same."""
    folder = tmp_path / "w"

    def learn(*argv):
        return forkserver.run([sys.executable, "-m", "minitfm.learn", "--dir", str(folder),
                               *argv], capture_output=True, text=True, timeout=120)

    assert learn("start", "linear").returncode == 0
    assert learn("start", "kernel_dropout").returncode == 0
    for name in ("01_linear.py", by_name("kernel_dropout").filename):
        path = folder / name
        text = path.read_text(encoding="utf-8")
        path.write_bytes(text.encode("utf-16"))
        exercise = "linear" if name == "01_linear.py" else "kernel_dropout"
        done = learn("check", exercise)
        said = " ".join(done.stdout.split())            # the report wraps its prose
        assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done
        assert f"{name}, line 1: UTF-16 text, not UTF-8 (it begins with FF FE, the byte-order " \
               f"mark of little-endian UTF-16): save it as UTF-8" in said, done.stdout
        assert f"iconv -f UTF-16 -t UTF-8 {name}" in said
        path.write_bytes((text + "# café\n").encode("cp1252"))
        done = learn("check", exercise)
        line = text.count("\n") + 1
        assert done.returncode == 1, done
        assert f"{name}, line {line}: not UTF-8 (invalid continuation byte" in " ".join(
            done.stdout.split()), done.stdout
    listed = learn("list")
    assert listed.returncode == 0 and "01 linear            written" in listed.stdout, listed


def test_the_workshops_files_damaged_unreadable_or_pipes_are_said_to_be(tmp_path):
    """progress.json damaged (before: a traceback), or a named pipe (before: waited on); the
    learner's file a named pipe, or unreadable for the disk: one error line each, status 2 for
    what the folder holds, 1 for the disk's failure (the file not judged)."""
    folder = tmp_path / "w"

    def learn(*argv, wrapper=()):
        return forkserver.run([sys.executable, *wrapper, "-m", "minitfm.learn", "--dir",
                               str(folder), *argv], capture_output=True, text=True, timeout=60,
                              cwd=ROOT)

    assert learn("start", "linear").returncode == 0
    progress, mine = folder / "progress.json", folder / "01_linear.py"
    kept = progress.read_bytes()
    for damage in (b"{broken", b"[1]"):
        progress.write_bytes(damage)
        done = learn("list")
        assert done.returncode == exits.BAD_INPUT and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith(f"error: {progress} is damaged (") and done.stderr.rstrip() \
            .endswith("move it aside and the workshop starts a new one (the exercise files "
                      "stay)"), done.stderr
    progress.unlink()
    os.mkfifo(progress)
    done = learn("list")
    assert done.returncode == exits.BAD_INPUT, done.stderr
    assert f"error: {progress} is a named pipe, where the workshop keeps its progress" \
        in done.stderr
    progress.unlink()
    progress.write_bytes(kept)
    done = learn("check", "linear", wrapper=[str(ROOT / "tests" / "failing_disk.py"), "--eio",
                                             str(mine), "--"])
    assert done.returncode == exits.FAILED and done.stderr.count("error:") == 1, done.stderr
    assert f"error: {mine}: reading it failed: Input/output error. The file itself was not " \
           f"judged" in done.stderr
    text = mine.read_bytes()
    mine.unlink()
    os.mkfifo(mine)
    done = learn("check", "linear")
    assert done.returncode == exits.BAD_INPUT, done.stderr
    assert f"error: {mine} is a named pipe, where the exercise's file should be" in done.stderr
    mine.unlink()
    mine.write_bytes(text)
    assert learn("list").returncode == 0


def test_checking_an_exercise_not_started_leaves_the_current_one(folder, capsys):
    run(folder, "start", "linear", capsys=capsys)
    status, out = run(folder, "check", "layernorm", capsys=capsys)
    assert status == exits.FAILED and "start the exercise first" in out.out
    assert Workshop(folder).current().name == "linear"
