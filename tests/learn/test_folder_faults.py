"""The workshop's folder under bad conditions: no room, a read-only mount, no rights, a damaged
progress of any shape, a ``--dir`` that is no folder, exercise files that are links to nowhere,
folders or devices, a terminal that shows ASCII alone. Each ends with one message and its status,
and the folder holds what it held before, byte for byte, unless the command meant to change it."""

import errno
import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from minitfm.cli import exits
from minitfm.learn import __main__ as learn
from minitfm.learn.workshop import Workshop
from tests import failing_disk
from tests import forkserver

ROOT = Path(__file__).resolve().parents[2]


def run(folder, *argv, capsys):
    status = learn.main(["--dir", str(folder), *argv])
    return status, capsys.readouterr()


def tree(root: Path) -> dict:
    """Every entry under ``root``: a file's hash, a link's target, a folder's mark."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            found[name] = "-> " + os.readlink(path)
        elif path.is_dir():
            found[name] = "folder"
        else:
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture
def started(folder, capsys):
    """A workshop with linear started and edited by the learner, a hint asked for."""
    run(folder, "start", "linear", capsys=capsys)
    with open(folder / "01_linear.py", "a", encoding="utf-8") as f:
        f.write("# my notes\n")
    run(folder, "hint", "linear", capsys=capsys)
    return folder


FAULTS = {"full": (errno.ENOSPC, "make room on that disk, or copy"),
          "read-only": (errno.EROFS, "is on a read-only mount: mount it read-write, or copy"),
          "denied": (errno.EACCES, "this user may not write there: give yourself the right "
                                   "(chmod u+w")}


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("command", [("reset", "linear"), ("start", "embedding"),
                                     ("check", "linear"), ("hint", "linear")])
def test_a_folder_without_room_or_rights_changes_nothing_and_says_what_to_do(
        started, capsys, fault, command):
    """Before: a full disk during reset moved the learner's file into attempts/ and said
    nothing; the messages named the problem but not the fix."""
    number, fix = FAULTS[fault]
    before = tree(started)
    with failing_disk.failing([(str(started), number, "write")]):
        status, said = run(started, *command, capsys=capsys)
    assert tree(started) == before
    assert status == exits.FAILED, said
    lines = said.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in said.err
    assert os.strerror(number) in lines[0] and fix in lines[0]
    assert f"was not saved, and nothing in {started} was changed" in lines[0]
    assert "give it with --dir" in lines[0]
    if number == errno.ENOSPC:
        assert " free in " in lines[0]          # where the room is missing


def test_reset_keeps_the_attempt_whole_before_the_fresh_copy_takes_its_place(started, capsys):
    mine = (started / "01_linear.py").read_bytes()
    status, said = run(started, "reset", "linear", capsys=capsys)
    assert status == exits.DONE, said
    assert (started / "attempts" / "01_linear.1.py").read_bytes() == mine
    assert b"# my notes" not in (started / "01_linear.py").read_bytes()
    data = json.loads((started / "progress.json").read_text())
    assert data["current"] == "linear" and "linear" not in data["hints"]
    assert not [p for p in started.rglob(".*.tmp")]


def test_reset_refuses_an_attempts_folder_that_is_a_file(started, capsys):
    (started / "attempts").write_text("not a folder\n")
    before = tree(started)
    status, said = run(started, "reset", "linear", capsys=capsys)
    assert status == exits.BAD_INPUT and tree(started) == before
    assert f"{started / 'attempts'} is a file, where the workshop keeps your old attempts: " \
           f"move it aside" in said.err


@pytest.mark.parametrize("progress, words", [
    ({"passed": [], "hints": {}}, '"passed" is a JSON array, not an object'),
    ({"hints": {"linear": "three"}}, '"hints" of linear is "three", not a count of hints'),
    ({"hints": {"linear": -1}}, '"hints" of linear is -1, not a count'),
    ({"hints": {"linear": True}}, '"hints" of linear is true, not a count'),
    ({"hints": {"linear": 2.5}}, '"hints" of linear is 2.5, not a count'),
    ({"hard": {"linear": "yes"}}, '"hard" of linear is "yes", not true or false'),
    ({"passed": {"linear": 7}}, '"passed" of linear is 7, not the hash'),
    ({"current": 5}, '"current" is a JSON number, not an exercise\'s name'),
    ({"current": ["linear"]}, '"current" is a JSON array'),
    ("linear", "a JSON string, not an object"),
])
@pytest.mark.parametrize("command", [("list",), ("hint", "linear"), ("check", "linear"),
                                     ("reset", "linear"), ("start", "embedding")])
def test_progress_of_any_shape_is_one_message(started, capsys, progress, words, command):
    """Before: wrong types or a count that is a word were a traceback."""
    (started / "progress.json").write_text(json.dumps(progress))
    before = tree(started)
    status, said = run(started, *command, capsys=capsys)
    assert status == exits.BAD_INPUT and tree(started) == before, said
    assert said.err.count("error:") == 1 and words in said.err, said.err
    assert said.err.rstrip().endswith("move it aside and the workshop starts a new one (the "
                                      "exercise files stay)")


def test_progress_naming_exercises_that_do_not_exist_is_read(started, capsys):
    data = json.loads((started / "progress.json").read_text())
    data["hints"]["no_such_exercise"] = 2
    data["passed"]["gone"] = "0" * 64
    data["current"] = "renamed"
    (started / "progress.json").write_text(json.dumps(data))
    status, said = run(started, "list", capsys=capsys)
    assert status == exits.DONE and "01 linear" in said.out


def _link_loop(path):
    os.symlink(path.name, path)


def _link_to_nothing(path):
    os.symlink("gone.py", path)


def _folder(path):
    path.mkdir()


def _device(path):
    os.symlink(os.devnull, path)


@pytest.mark.parametrize("make, words", [
    (_link_loop, "is a loop of symbolic links ({p} -> {p}), where the exercise's file should "
                 "be: remove the link (rm {p})"),
    (_link_to_nothing, "is a symbolic link to gone.py, which does not exist, where the "
                       "exercise's file should be"),
    (_folder, "is a directory, where the exercise's file should be: move it aside"),
    (_device, "is a character device, where the exercise's file should be"),
])
@pytest.mark.parametrize("command", [("check", "embedding"), ("start", "embedding"),
                                     ("reset", "embedding"), ("list",)])
def test_an_exercise_file_that_is_no_file_is_said_to_be(started, capsys, make, words, command):
    """Before: a link loop was "not started", overwritten by start and moved by reset."""
    path = started / "02_embedding.py"
    make(path)
    before = tree(started)
    status, said = run(started, *command, capsys=capsys)
    assert status == exits.BAD_INPUT and tree(started) == before, said
    assert said.err.count("error:") == 1 and "Traceback" not in said.err
    assert f"error: {path} " + words.format(p=path) in said.err, said.err
    if command == ("list",):                    # the others are listed as ever
        assert " ! 02 embedding         unusable" in said.out
        assert " 01 linear            started" in said.out


def test_an_exercise_file_that_links_to_a_file_is_the_file(started, capsys):
    mine = started / "elsewhere.py"
    os.replace(started / "01_linear.py", mine)
    os.symlink(mine.name, started / "01_linear.py")
    status, said = run(started, "list", capsys=capsys)
    assert status == exits.DONE and "01 linear            started" in said.out
    status, said = run(started, "reset", "linear", capsys=capsys)
    assert status == exits.DONE
    assert b"# my notes" in mine.read_bytes()           # the file linked to: as it was
    assert b"# my notes" in (started / "attempts" / "01_linear.1.py").read_bytes()
    assert not (started / "01_linear.py").is_symlink()


@pytest.mark.parametrize("make, words", [
    (lambda p: p.write_text("x"), "is a file, not a folder"),
    (lambda p: os.symlink(p.name, p), "is a loop of symbolic links"),
    (lambda p: os.symlink("nowhere", p), "is a symbolic link to nowhere, which does not exist"),
])
@pytest.mark.parametrize("command", [("list",), ("start", "linear"), ("check", "linear"),
                                     ("watch",)])
def test_a_dir_that_is_not_a_folder_says_so(tmp_path, capsys, make, words, command):
    """Before: start said "[Errno 17] File exists", list and check went on as if empty."""
    given = tmp_path / "workshop"
    make(given)
    before = tree(tmp_path)
    status, said = run(given, *command, capsys=capsys)
    assert status == exits.BAD_INPUT and tree(tmp_path) == before
    assert said.err.startswith(f"error: --dir {given} {words}") and said.err.count("\n") == 1
    assert said.err.endswith(": give --dir the workshop's folder, or a path where none is yet "
                             "(start makes it)\n")


def test_a_dir_through_a_file_says_which(tmp_path, capsys):
    (tmp_path / "notes").write_text("x")
    status, said = run(tmp_path / "notes" / "workshop", "start", capsys=capsys)
    assert status == exits.BAD_INPUT
    assert f"passes through {tmp_path / 'notes'}, which is a file, not a folder" in said.err


def test_list_in_the_posix_locale(started, capsys):
    """Before: a traceback (UnicodeEncodeError) where standard output is ASCII."""
    environment = {**os.environ, "LC_ALL": "POSIX", "PYTHONUTF8": "0",
                   "PYTHONIOENCODING": "", "PYTHONPATH": str(ROOT)}
    done = forkserver.run([sys.executable, "-m", "minitfm.learn", "--dir", str(started),
                           "list"], capture_output=True, env=environment, timeout=60)
    assert done.returncode == 0 and not done.stderr, done.stderr
    out = done.stdout.decode("ascii")
    assert " >- 01 linear            started" in out


def test_watch_sees_a_save_that_keeps_the_size_and_the_time(started, capsys):
    """An editor's restore, or a checkout, can give the file its old size and time back."""
    path = started / "01_linear.py"
    text = path.read_text()
    stamp = os.stat(path)
    looks = []

    def stop():
        looks.append(1)
        if len(looks) == 2:
            path.write_text(text.replace("# my notes", "# my NOTES"))
            os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
            assert os.stat(path).st_size == stamp.st_size
        return len(looks) > 6
    workshop = Workshop(started)
    assert learn.watch(workshop, every=0.01, stop=stop) == exits.DONE
    out = capsys.readouterr().out
    assert out.count("--- ") == 2 and out.count("linear: not written yet") == 2, out


def test_train_refuses_a_count_of_steps_it_cannot_run(started, capsys):
    for steps in ("100001", "1e23", str(10 ** 23)):
        with pytest.raises(SystemExit) as stopped:
            learn.main(["--dir", str(started), "train", "--steps", steps])
        assert stopped.value.code == exits.BAD_INPUT
        assert f"argument --steps: must be an integer in [1, 100000], got '{steps}'" \
            in capsys.readouterr().err
    assert Workshop(started).progress()["current"] == "linear"


def test_no_exercise_written_in_a_started_workshop_is_unchanged_by_reading(started, capsys):
    before = tree(started)
    for command in (("list",), ("solution", "linear", "--reveal")):
        status, _ = run(started, *command, capsys=capsys)
        assert status == exits.DONE
    assert tree(started) == before
