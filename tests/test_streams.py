"""Inputs are streams, through the real command lines: every command reads a file once (gzip
seen in the first bytes of the same stream), so ``translate --input`` reads a pipe, /dev/stdin or
a named pipe; an input a command reads more than once (a corpus, a checkpoint) is refused with
status 2 before anything is read from it, never waited on; a line longer than MAX_LINE_BYTES is
refused naming the file and the line, before it fills the memory."""

from __future__ import annotations

import errno
import gzip
import os
import sys
import threading
from pathlib import Path

import pytest

from minitfm.data import DataError, check_input, raw_lines
from minitfm.data.reading import MAX_LINE_BYTES
from tests.test_exit_statuses import (LM, ROOT, TEXT, assert_error, command,  # noqa: F401
                                      text_file, translator_ckpt)
from tests.test_translate import vocab  # noqa: F401  (a fixture)
from tests import forkserver

LINES = "a man is riding a bike\ntwo dogs\n"

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")


def translate(ckpt, *args, stdin: bytes | None = None) -> tuple[int, str, str]:
    done = forkserver.run([sys.executable, "-m", "minitfm.translate", "--checkpoint", str(ckpt),
                           "--beam", "1", *map(str, args)], input=stdin, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT),
                               "MINITFM_BACKEND": "numpy"}, timeout=120)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def never_opened(fifo: Path) -> bool:
    """Whether no process holds ``fifo`` open for reading (a writer could not open it)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:
        return exc.errno == errno.ENXIO
    return False


def test_translate_reads_a_pipe_once(translator_ckpt, tmp_path):
    """A fault this guards against: --input <(cat file) printed nothing (the gzip check read
    the pipe first)."""
    code, plain, err = translate(translator_ckpt, stdin=LINES.encode())
    assert code == 0 and len(plain.splitlines()) == 2, err
    assert translate(translator_ckpt, "--input", "/dev/stdin",         # a pipe, gzipped
                     stdin=gzip.compress(LINES.encode())) == (0, plain, "")
    fifo = tmp_path / "input.en"                    # a named pipe, as <(...) gives one
    os.mkfifo(fifo)

    def write():
        with open(fifo, "wb") as f:
            f.write(gzip.compress(LINES.encode()))
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert translate(translator_ckpt, "--input", fifo) == (0, plain, "")
    writer.join(timeout=60)


def test_an_endless_line_is_refused_naming_the_file_and_the_line(translator_ckpt, tmp_path):
    assert_error(translate(translator_ckpt, "--input", "/dev/zero"), 2,
                 "/dev/zero, line 1: longer than 1 MiB without a line end")
    long = tmp_path / "long.txt"
    long.write_bytes(b"short\n" + b"x" * MAX_LINE_BYTES + b"\n")
    assert_error(translate(translator_ckpt, "--input", long), 2, f"{long}, line 2: longer")
    with pytest.raises(DataError, match="line 2: longer"):
        list(raw_lines(long))
    long.write_bytes(b"x" * (MAX_LINE_BYTES - 1) + b"\n")             # at the bound: read
    assert [len(line) for line in raw_lines(long)] == [MAX_LINE_BYTES - 1]


@pytest.mark.parametrize("data", ["a named pipe", "/dev/zero", "a text without line ends"])
def test_train_lm_refuses_what_it_cannot_read_twice_before_reading(tmp_path, data):
    """A fault this guards against: a FIFO hung for ever; /dev/zero filled the memory."""
    out = tmp_path / "run"
    if data == "a named pipe":
        path, words = tmp_path / "input.txt", "is a named pipe, not a regular file"
        os.mkfifo(path)
    elif data == "/dev/zero":
        path, words = Path("/dev/zero"), "is a character device, not a regular file"
    else:
        path, words = tmp_path / "input.txt", "line 1: longer than 1 MiB"
        path.write_bytes(b"x" * (MAX_LINE_BYTES + 1))
    for tokenizer in ("char", "bpe"):
        assert_error(command("train_lm.py", "--data", path, "--tokenizer", tokenizer,
                             "--vocab-size", 40, *LM, "--out", out), 2, str(path), words)
    if data == "a named pipe":
        assert never_opened(path)
    assert not out.exists()


def test_train_wmt_refuses_a_named_pipe_for_a_corpus(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.de").write_text(LINES)
    os.mkfifo(corpus / "train.en")
    assert_error(command("train_wmt.py", "--trainpref", corpus / "train", "--vocab-size", 40,
                         "--max-steps", 1, "--backend", "numpy", "--out", tmp_path / "run"), 2,
                 f"{corpus / 'train.en'} is a named pipe, not a regular file: this command "
                 f"reads it more than once; write it to a file and give that")
    assert never_opened(corpus / "train.en") and not (tmp_path / "run").exists()


def test_a_checkpoint_from_a_pipe_is_refused_as_what_it_is(translator_ckpt, tmp_path):
    fifo = tmp_path / "model.npz"
    os.mkfifo(fifo)
    assert_error(translate(fifo, stdin=LINES.encode()), 2,
                 f"{fifo} is a named pipe, not a file: a checkpoint is read out of order")
    assert never_opened(fifo)


def test_check_input(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    check_input(__file__)
    for special in (fifo, os.devnull):
        check_input(special, streamed=True)                  # read once: fine
        with pytest.raises(DataError, match="not a regular file: this command reads it more"):
            check_input(special)
    with pytest.raises(DataError, match="is a directory"):
        check_input(tmp_path, streamed=True)
    with pytest.raises(DataError, match="file not found"):
        check_input(tmp_path / "no such file")
    assert never_opened(fifo)
