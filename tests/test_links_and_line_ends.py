"""Symbolic links that lead nowhere and line ends that are carriage returns alone, through the
real command lines.

- A path that is a loop of symbolic links, a link to a file that does not exist, or a path whose
  folders pass through a loop is said to be what it is, with what to do and status 2, wherever a
  command reads one: translate's input and checkpoint, a corpus side, a test set, average's and
  export's inputs, train_lm's text and checkpoint; never "file not found" or a damaged
  checkpoint. A plain missing file is still said to be missing. An error of the system on such a
  path that no command words itself (an output in a folder that is a loop) says so as well.
- A text file without a line feed whose one line holds carriage returns (the line ends of old
  Mac files) is refused saying so, with the count and the command that converts it, wherever text
  is read (corpora, test sets, translate's input or standard input, train_lm's text), also past
  1 MiB; never a misaligned corpus or sentencepiece's own failed check. One line that ends in a CR
  alone, and CR LF line ends, are read as before.
- A corpus in which sentencepiece finds nothing to train on (every line too long, characters it
  removes), or a vocabulary size the text cannot fill, is a message about the data and the option
  to change, never sentencepiece's internal check.
"""

from __future__ import annotations

import errno
import gzip
import os
import sys
from pathlib import Path

import pytest

from minitfm.cli import exits
from minitfm.data.reading import MAX_LINE_BYTES
from tests.test_train_wmt import TINY, corpus, corpus_args, sentence_pairs  # noqa: F401
from tests.test_translate import ckpt, vocab  # noqa: F401  (fixtures)
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}
LM = ["--max-steps", "200", "--quiet"]      # errors come before any step


def command(*args, stdin: bytes = b"", cwd: Path | None = None) -> tuple[int, str, str]:
    """``python ARGS`` in a child process, as a user runs it: (status, stdout, stderr)."""
    done = forkserver.run([sys.executable, *map(str, args)], input=stdin, env=ENV,
                          capture_output=True, cwd=cwd)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def refused(done: tuple[int, str, str], *words: str) -> str:
    """The one error line of a bad-input refusal, which holds every one of ``words``."""
    code, _, err = done
    assert code == 2, err
    assert "Traceback" not in err and err.count("error:") == 1, err
    for word in words:
        assert word in err, (word, err)
    return err


def loop(folder: Path, name: str = "loop1", other: str = "loop2") -> Path:
    """``folder/name`` -> ``other`` -> ``name``: a loop of two symbolic links."""
    os.symlink(other, folder / name)
    os.symlink(name, folder / other)
    return folder / name


def dangling(folder: Path, name: str, target: str = "gone") -> Path:
    """``folder/name``, a symbolic link to ``target``, which does not exist."""
    os.symlink(target, folder / name)
    return folder / name


def said_loop(path: Path, other: str = "loop2") -> str:
    return f"{path} is a loop of symbolic links ({path} -> {path.parent / other} -> {path})"


def said_dangling(path: Path, target: str = "gone") -> str:
    return f"{path} is a symbolic link to {target}, which does not exist"


def translate(*args, stdin: bytes = b"") -> tuple[int, str, str]:
    return command("-m", "minitfm.translate", *args, stdin=stdin)


def train_wmt(*args) -> tuple[int, str, str]:
    return command(ROOT / "train_wmt.py", *TINY, "--max-steps", 2, *args)


def train_lm(*args) -> tuple[int, str, str]:
    return command(ROOT / "train_lm.py", *LM, *args)


# ---- symbolic links that lead nowhere -------------------------------------------------------

def test_translate_input_that_leads_nowhere(ckpt, tmp_path):  # noqa: F811
    looped, lost = loop(tmp_path), dangling(tmp_path, "in.en")
    err = refused(translate("--checkpoint", ckpt, "--input", looped), said_loop(looped),
                  "point it at a text file, or give the file itself")
    assert "not found" not in err
    refused(translate("--checkpoint", ckpt, "--input", lost), said_dangling(lost))
    refused(translate("--checkpoint", ckpt, "--input", tmp_path / "none.en"),
            f"{tmp_path / 'none.en'}: file not found")


def test_translate_checkpoint_that_leads_nowhere(tmp_path):
    looped, lost = loop(tmp_path), dangling(tmp_path, "model.npz")
    err = refused(translate("--checkpoint", looped), f"checkpoint {said_loop(looped)}",
                  "point it at a checkpoint file, or give the file itself")
    assert "damaged" not in err and "Errno" not in err and "newest" not in err
    refused(translate("--checkpoint", lost), f"checkpoint {said_dangling(lost)}")
    refused(translate("--checkpoint", tmp_path / "none.npz"),
            f"checkpoint {tmp_path / 'none.npz'} does not exist")


def test_corpus_side_or_folder_that_leads_nowhere(corpus, tmp_path):  # noqa: F811
    side = corpus / "train.en"
    side.unlink()
    loop(corpus, "train.en", "other.en")
    err = refused(train_wmt(*corpus_args(corpus), "--out", tmp_path / "run"),
                  said_loop(side, "other.en"))
    assert "not found" not in err
    folder = loop(tmp_path, "data", "elsewhere")
    refused(train_wmt("--trainpref", folder / "train", "--source-lang", "en", "--target-lang",
                      "de", "--out", tmp_path / "run2"),
            f"{folder / 'train.en'} is a path that passes through a loop of symbolic links")


def test_test_set_that_leads_nowhere(corpus, ckpt, tmp_path):  # noqa: F811
    lost = dangling(tmp_path, "test.de")
    refused(train_wmt("--eval-only", "--checkpoint", ckpt, "--test-src", corpus / "test.en",
                      "--test-ref", lost, "--out", tmp_path / "scores"),
            said_dangling(lost), "point it at a text file")


def test_average_input_that_leads_nowhere(ckpt, tmp_path):  # noqa: F811
    looped, lost = loop(tmp_path), dangling(tmp_path, "model.npz")
    out = tmp_path / "averaged.npz"
    err = refused(command("-m", "minitfm.average", "--inputs", ckpt, looped, "--output", out),
                  f"input {said_loop(looped)}", "point it at a checkpoint file or a run directory")
    assert "neither" not in err and not out.exists()
    refused(command("-m", "minitfm.average", "--inputs", lost, "--best", 1, "--output", out),
            f"input {said_dangling(lost)}")
    refused(command("-m", "minitfm.average", "--inputs", tmp_path / "none", "--output", out),
            f"input {tmp_path / 'none'} is neither a checkpoint file nor a directory")


def test_export_input_that_leads_nowhere(tmp_path):
    looped, lost = loop(tmp_path), dangling(tmp_path, "model.safetensors")
    out = tmp_path / "model.out"
    err = refused(command("-m", "minitfm.export", looped, "--to", "safetensors", "--out", out),
                  f"checkpoint {said_loop(looped)}")
    assert "damaged" not in err
    refused(command("-m", "minitfm.export", tmp_path / "none.npz", "--to", "safetensors",
                    "--out", out), f"checkpoint {tmp_path / 'none.npz'} does not exist")
    pytest.importorskip("safetensors")
    refused(command("-m", "minitfm.export", lost, "--from", "safetensors", "--out", out),
            said_dangling(lost), "point it at a safetensors file")
    refused(command("-m", "minitfm.export", looped, "--from", "safetensors", "--out", out),
            said_loop(looped))


def test_train_lm_text_and_checkpoint_that_lead_nowhere(tmp_path):
    looped, lost = loop(tmp_path), dangling(tmp_path, "model.npz")
    refused(train_lm("--data", looped, "--out", tmp_path / "run"), said_loop(looped),
            "point it at a text file")
    refused(train_lm("--sample", "--checkpoint", lost), f"checkpoint {said_dangling(lost)}")


def test_an_output_in_a_loop_is_said_to_be_one(ckpt, tmp_path):  # noqa: F811
    looped = loop(tmp_path)
    refused(command("-m", "minitfm.export", ckpt, "--to", "ctranslate2", "--out", looped / "m"),
            f"{looped / 'm'} is a path that passes through a loop of symbolic links: mend the "
            f"links on the way, or give another path")
    refused(command("-m", "minitfm.average", "--inputs", ckpt, "--output", looped / "a.npz"),
            f"--output {looped / 'a.npz'} is a path that passes through a loop")


def test_a_run_directory_that_is_a_loop_is_said_to_be_one(tmp_path):
    looped = loop(tmp_path)
    refused(command(ROOT / "train_toy.py", "--max-steps", 2, "--out", looped),
            f"--out {said_loop(looped)}, not a run directory")


def test_an_error_of_the_system_on_a_loop_names_it(tmp_path):
    looped = loop(tmp_path)
    error = OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(looped))
    assert exits.status_of(error) == exits.BAD_INPUT
    assert exits.message(error) == f"error: {said_loop(looped)}: point it at the file meant, " \
                                   f"or give that file itself"
    other = OSError(errno.EIO, "Input/output error", str(tmp_path / "x"))
    assert exits.status_of(other) == exits.FAILED
    assert exits.message(other) == f"error: {tmp_path / 'x'}: Input/output error"


# ---- carriage returns alone as line ends ----------------------------------------------------

def old_mac(lines: list[str]) -> bytes:
    return "\r".join(lines).encode()


def said_cr(path, lines: list[str], fixed: str) -> str:
    text = "\r".join(lines)
    return (f"{path}: no line ends: the whole file is one line of {len(text):,} characters, in "
            f"which {len(lines) - 1:,} carriage returns (CR, the line end of old Mac files) "
            f"separate the sentences; convert them to line feeds (e.g. {fixed}) and give that "
            f"file")


@pytest.mark.parametrize("sides", ["both", "target"])
def test_a_corpus_with_carriage_returns_alone(corpus, tmp_path, sides):  # noqa: F811
    src, tgt = sentence_pairs(300, 0)
    (corpus / "train.de.gz").write_bytes(gzip.compress(old_mac(tgt)))
    if sides == "both":
        (corpus / "train.en").write_bytes(old_mac(src))
        path, lines, fixed = corpus / "train.en", src, f"tr '\\r' '\\n' < {corpus}/train.en > " \
                                                       f"fixed.en"
    else:
        path, lines, fixed = corpus / "train.de.gz", tgt, f"zcat {corpus}/train.de.gz | " \
                                                          f"tr '\\r' '\\n' > fixed.de"
    err = refused(train_wmt(*corpus_args(corpus), "--out", tmp_path / "run"),
                  said_cr(path, lines, fixed))
    assert "misaligned" not in err and "sentencepiece" not in err


def test_a_test_set_with_carriage_returns_alone(corpus, ckpt, tmp_path):  # noqa: F811
    _, tgt = sentence_pairs(20, 2)
    ref = tmp_path / "ref.de"
    ref.write_bytes(old_mac(tgt))
    refused(train_wmt("--eval-only", "--checkpoint", ckpt, "--test-src", corpus / "test.en",
                      "--test-ref", ref, "--out", tmp_path / "scores"),
            said_cr(ref, tgt, f"tr '\\r' '\\n' < {ref} > fixed.de"))


def test_translate_input_with_carriage_returns_alone(ckpt, tmp_path):  # noqa: F811
    refused(translate("--checkpoint", ckpt, stdin=b"a man\rtwo dogs\ra woman"),
            "standard input: no line ends: the whole input is one line of 22 characters, in "
            "which 2 carriage returns (CR, the line end of old Mac files) separate the "
            "sentences; convert them to line feeds on the way in (e.g. pipe it through "
            "tr '\\r' '\\n')")
    code, out, err = translate("--checkpoint", ckpt, "--beam", 1, stdin=b"a man\r")
    assert code == 0 and len(out.splitlines()) == 1, err
    code, out, err = translate("--checkpoint", ckpt, "--beam", 1, stdin=b"a man\r\ntwo dogs\r\n")
    assert code == 0 and len(out.splitlines()) == 2, err
    big = tmp_path / "big.en"
    big.write_bytes(b"a man\r" * 200_000)               # 1.1 MiB, no line feed
    returns = (MAX_LINE_BYTES + 1) // len(b"a man\r")    # in the part read: 1 MiB and a byte
    refused(translate("--checkpoint", ckpt, "--input", big),
            f"{big}: no line ends: its first 1 MiB holds no line feed, but {returns:,} carriage "
            f"returns (CR, the line end of old Mac files), which separate the sentences; "
            f"convert them to line feeds (e.g. tr '\\r' '\\n' < {big} > fixed.en)")


def test_train_lm_text_with_carriage_returns_alone(tmp_path):
    text = tmp_path / "text"
    text.write_bytes(b"ab\rcd\ref")
    refused(train_lm("--data", text, "--out", tmp_path / "run"),
            f"{text}: no line ends: the whole file is one line of 8 characters, in which 2 "
            f"carriage returns", f"tr '\\r' '\\n' < {text} > fixed.txt")


# ---- text sentencepiece cannot train on ------------------------------------------------------

@pytest.mark.parametrize("blank", ["", " \n"])        # a line of a space: sentencepiece keeps it
def test_a_corpus_of_lines_too_long_for_sentencepiece(tmp_path, blank):
    long = " ".join(["the cat sees a dog"] * 300)       # 5,699 bytes
    for side in ("en", "de"):
        (tmp_path / f"c.{side}").write_text((long + "\n") * 3 + blank, encoding="utf-8")
    err = refused(train_wmt("--trainpref", tmp_path / "c", "--source-lang", "en",
                            "--target-lang", "de", "--out", tmp_path / "run"),
                  "no sentence to train a vocabulary on: all 6 lines with text of corpus",
                  "are longer than 4,192 bytes (the longest 5,699)", "one sentence per line")
    assert "INTERNAL" not in err and "sentences_" not in err


@pytest.mark.parametrize("text, vocab_size, words", [
    ("ab ab ab\n" * 20, 64, ["is too small for a 64-piece vocabulary: it makes at most 10 "
                             "pieces; lower the vocabulary size (--vocab-size) to 10 or less"]),
    ("".join(map(chr, range(0x4E00, 0x4EC8))) + "\n", 64,
     ["holds more distinct characters than a 64-piece vocabulary has room for",
      "raise the vocabulary size (--vocab-size) to 205 or more"]),
    ("\u200b\u200b\n" * 50, 64, ["no characters to train a vocabulary on: the 50 lines with "
                                 "text of", "normalization removes"]),
])
def test_text_a_vocabulary_cannot_be_trained_on(tmp_path, text, vocab_size, words):
    data = tmp_path / "text.txt"
    data.write_text(text, encoding="utf-8")
    err = refused(train_lm("--data", data, "--tokenizer", "bpe", "--vocab-size", vocab_size,
                           "--out", tmp_path / "run"), str(data), *words)
    assert "INTERNAL" not in err and "trainer_interface" not in err
