"""The workshop page shows what the commands print: its transcripts are run again here, and its
table lists every exercise in order."""

import re
from pathlib import Path

import pytest

from minitfm.learn import __main__ as learn
from minitfm.learn.exercises import EXERCISES
from minitfm.learn.workshop import Workshop

PAGE = Path(__file__).resolve().parents[2] / "docs" / "workshop.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)


def transcript(command: str) -> list[str]:
    return [b for b in blocks("text") if b.startswith(f"$ {command}\n")]


def timeless(text: str) -> str:
    return re.sub(r"\(\d+\.\d s\)", "(T s)", text).strip()


def checked(tmp_path, monkeypatch, capsys, name) -> str:
    monkeypatch.chdir(tmp_path)
    learn.main(["check", name])
    return "$ python -m minitfm.learn check " + name + "\n" + capsys.readouterr().out


def test_the_layernorm_transcript(tmp_path, monkeypatch, capsys, numpy_backend):
    attempt, fix = blocks("python")
    wrong, right = transcript("python -m minitfm.learn check layernorm")
    path = Workshop(tmp_path / "workshop").start(next(e for e in EXERCISES
                                                      if e.name == "layernorm"))
    text = path.read_text()
    start = text.index("    # TODO: write backward.")
    end = text.index("\n", text.index("raise NotImplementedError"))
    path.write_text(text[:start] + attempt.rstrip("\n") + text[end:])
    assert timeless(checked(tmp_path, monkeypatch, capsys, "layernorm")) == timeless(wrong)
    broken = [line for line in attempt.splitlines() if line.lstrip().startswith("dx =")][0]
    path.write_text(path.read_text().replace(broken, fix.rstrip("\n")))
    assert timeless(checked(tmp_path, monkeypatch, capsys, "layernorm")) == timeless(right)


def test_the_kernel_transcript(tmp_path, monkeypatch, capsys, numpy_backend):
    (wrong,) = transcript("python -m minitfm.learn check kernel_dropout")
    path = Workshop(tmp_path / "workshop").start(next(e for e in EXERCISES
                                                      if e.name == "kernel_dropout"))
    line = re.search(r"\n        (dx\[i\] = .*)\n", wrong).group(1)
    path.write_text(path.read_text().replace(
        "    // TODO: write the kernel's body\n",
        "    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n    " + line + "\n"))
    assert timeless(checked(tmp_path, monkeypatch, capsys, "kernel_dropout")) == timeless(wrong)


def test_the_table_lists_every_exercise_in_order():
    rows = re.findall(r"^\| (\d\d) \| `(\w+)` \|", PAGE.read_text(encoding="utf-8"), re.M)
    assert rows == [(f"{e.number:02d}", e.name) for e in EXERCISES]


@pytest.mark.parametrize("command", ["start", "watch", "check", "hint", "solution", "reset",
                                     "train", "list"])
def test_every_command_is_on_the_page(command):
    assert f"`{command}" in PAGE.read_text(encoding="utf-8")
