"""Text that is not UTF-8, and a terminal that translate would wait on in silence, through the
real command lines.

- UTF-16 or UTF-32 text, with a byte-order mark or without one (NUL bytes where those encodings
  put them), is refused with status 2 wherever text is read (translate's --input and standard
  input, gzipped or not; a corpus side of train_wmt.py, training, validation or test; a test
  reference of --eval-only; train_lm.py's text), naming the encoding, what shows it, and the
  iconv command that converts it; the command said works. Never translated, or trained on, as
  UTF-8 with NULs.
- A UTF-8 byte-order mark is UTF-8: it is dropped from the first line.
- Text in an 8-bit encoding (Latin-1, Windows-1252): translate replaces what is not UTF-8 and
  warns once, saying what the input seems to be (how the line reads in Windows-1252, and the
  conversion), or that a line of a UTF-8 input is damaged; a corpus so written is refused saying
  the same.
- A gzip stream that is corrupt (not only cut short) is said to be, not a traceback; a text that
  the disk fails to give is an I/O error (status 1), the file not judged.
- translate on a terminal says that it reads sentences from it, and how to end them.
"""

from __future__ import annotations

import gzip
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_links_and_line_ends import (ENV, ROOT, command, refused, train_lm,
                                            train_wmt, translate)
from tests.test_train_wmt import TINY, corpus, corpus_args, sentence_pairs  # noqa: F401
from tests.test_translate import ckpt, vocab  # noqa: F401  (fixtures)
from tests import forkserver

LINES = "a man sings\ndie straße\n\ntwo dogs\n"

# (Python's codec, the encoding the message names, what shows it)
WIDE = {
    "utf-16": ("UTF-16", "it begins with FF FE, the byte-order mark of little-endian UTF-16"),
    "utf-16-le": ("UTF-16LE", "it has a NUL byte after each ASCII character, as UTF-16LE has"),
    "utf-16-be": ("UTF-16BE", "it has a NUL byte before each ASCII character, as UTF-16BE has"),
    "utf-32": ("UTF-32", "it begins with FF FE 00 00, the byte-order mark of little-endian "
                         "UTF-32"),
    "utf-32-be": ("UTF-32BE", "it has three NUL bytes before each ASCII character, as UTF-32BE "
                              "has"),
}


def said_wide(name, codec: str, fix: str) -> str:
    encoding, evidence = WIDE[codec]
    return (f"{name} is {encoding} text, not UTF-8 ({evidence}); this command reads UTF-8: "
            f"convert it {fix}")


def file_fix(path: Path, codec: str, suffix: str = ".en", gzipped: bool = False) -> str:
    tool = f"iconv -f {WIDE[codec][0]} -t UTF-8"
    read = f"zcat {path} | {tool}" if gzipped else f"{tool} < {path}"
    return f"(e.g. {read} > fixed{suffix}) and give that file"


# ---- UTF-16 and UTF-32 ----------------------------------------------------------------------

@pytest.mark.parametrize("codec, given", [("utf-16", "file"), ("utf-16-be", "stdin"),
                                          ("utf-16-le", "gzipped"), ("utf-32", "stdin"),
                                          ("utf-32-be", "file")])
def test_translate_refuses_utf16_and_utf32_input(ckpt, tmp_path, codec, given):  # noqa: F811
    """A fault this guards against: UTF-16 input was read as UTF-8 with NULs, translated to
    garbage, and the command exited 0 with a warning about one line."""
    data = LINES.encode(codec)
    if given == "stdin":
        done = translate("--checkpoint", ckpt, "--beam", 1, stdin=data)
        words = said_wide("standard input", codec, f"on the way in (e.g. pipe it through "
                                                   f"iconv -f {WIDE[codec][0]} -t UTF-8)")
    else:
        path = tmp_path / ("in.en.gz" if given == "gzipped" else "in.en")
        path.write_bytes(gzip.compress(data) if given == "gzipped" else data)
        done = translate("--checkpoint", ckpt, "--beam", 1, "--input", path)
        words = said_wide(path, codec, file_fix(path, codec, gzipped=given == "gzipped"))
    refused(done, words)
    assert done[1] == ""                                    # nothing translated


@pytest.mark.skipif(shutil.which("iconv") is None, reason="needs iconv")
def test_the_conversion_said_makes_the_input_readable(ckpt, tmp_path):  # noqa: F811
    plain = tmp_path / "plain.en"
    plain.write_text(LINES, encoding="utf-8")
    wide = tmp_path / "in.en"
    wide.write_bytes(LINES.encode("utf-16"))
    _, _, err = translate("--checkpoint", ckpt, "--beam", 1, "--input", wide)
    conversion = err.split("(e.g. ")[1].split(") and give")[0]
    forkserver.run(conversion, shell=True, check=True, cwd=tmp_path)
    assert (tmp_path / "fixed.en").read_bytes() == plain.read_bytes()
    expected = translate("--checkpoint", ckpt, "--beam", 1, "--input", plain)
    assert expected[0] == 0 and expected[1].count("\n") == 4
    assert translate("--checkpoint", ckpt, "--beam", 1, "--input", tmp_path / "fixed.en") \
        == expected


@pytest.mark.parametrize("side, codec", [("train.en", "utf-16"), ("val.de.gz", "utf-16-le"),
                                         ("test.en", "utf-32-be")])
def test_train_wmt_refuses_a_corpus_side_in_utf16_or_utf32(corpus, tmp_path, side,  # noqa: F811
                                                           codec):
    """Faults this guards against: a UTF-16 training side was trained on as UTF-8 with NULs, a
    UTF-16 validation or test side read as so many misaligned lines."""
    split = side.split(".")[0]
    src, tgt = sentence_pairs({"train": 300, "val": 30, "test": 20}[split],
                              {"train": 0, "val": 1, "test": 2}[split])
    data = ("\n".join(src if ".en" in side else tgt) + "\n").encode(codec)
    path = corpus / side
    path.write_bytes(gzip.compress(data) if side.endswith(".gz") else data)
    out = tmp_path / "run"
    refused(train_wmt(*corpus_args(corpus), "--out", out),
            said_wide(path, codec, file_fix(path, codec, "." + side.split(".")[1],
                                            gzipped=side.endswith(".gz"))))
    assert not out.exists()


def test_eval_only_refuses_a_test_reference_in_utf16(corpus, ckpt, tmp_path):  # noqa: F811
    _, tgt = sentence_pairs(20, 2)
    ref = tmp_path / "ref.de"
    ref.write_bytes(("\n".join(tgt) + "\n").encode("utf-16"))
    refused(train_wmt("--eval-only", "--checkpoint", ckpt, "--test-src", corpus / "test.en",
                      "--test-ref", ref, "--out", tmp_path / "scores"),
            said_wide(ref, "utf-16", file_fix(ref, "utf-16", ".de")))
    assert not (tmp_path / "scores").exists()


@pytest.mark.parametrize("tokenizer, codec", [("char", "utf-16-le"), ("bpe", "utf-16")])
def test_train_lm_refuses_a_text_in_utf16(tmp_path, tokenizer, codec):
    """A fault this guards against: a UTF-16 text without a byte-order mark was trained on, its
    NULs characters of the vocabulary."""
    text = tmp_path / "input.txt"
    text.write_bytes(("the quick brown fox jumps over the lazy dog.\n" * 40).encode(codec))
    out = tmp_path / "run"
    refused(train_lm("--data", text, "--tokenizer", tokenizer, "--vocab-size", 40, "--out", out),
            said_wide(text, codec, file_fix(text, codec, ".txt")))
    assert not out.exists()


def test_a_utf8_byte_order_mark_is_dropped(ckpt):  # noqa: F811
    plain = translate("--checkpoint", ckpt, "--beam", 1, stdin=LINES.encode())
    assert plain[0] == 0 and plain[2] == ""
    assert translate("--checkpoint", ckpt, "--beam", 1,
                     stdin=b"\xef\xbb\xbf" + LINES.encode()) == plain


# ---- 8-bit encodings ------------------------------------------------------------------------

def test_translate_says_what_input_that_is_not_utf8_seems_to_be(ckpt, tmp_path):  # noqa: F811
    code, out, err = translate("--checkpoint", ckpt, "--beam", 1,
                               stdin=LINES.encode("cp1252") + "un café\n".encode("cp1252"))
    assert code == 0 and len(out.splitlines()) == 5
    assert err.count("warning:") == 1 and "error" not in err
    assert ("invalid UTF-8 replaced by U+FFFD on 2 line(s) of standard input: 2, 5; it seems to "
            "be in an 8-bit encoding such as Windows-1252 or Latin-1, in which that line reads "
            "'straße': convert it to UTF-8 on the way in (e.g. pipe it through iconv -f "
            "WINDOWS-1252 -t UTF-8)") in err
    damaged = tmp_path / "in.en.gz"                 # UTF-8 with one line cut inside a character
    damaged.write_bytes(gzip.compress(LINES.encode() + "un café\n".encode()[:-2] + b"\n"))
    code, out, err = translate("--checkpoint", ckpt, "--beam", 1, "--input", damaged)
    assert code == 0 and len(out.splitlines()) == 5
    assert (f"on 1 line(s) of {damaged}: 5; other lines of it are UTF-8, with characters beyond "
            f"ASCII: it is UTF-8 text, and a line that is not is damaged") in err
    unknown = tmp_path / "in.txt"                   # not even Windows-1252
    unknown.write_bytes(b"a man\n\x81\x8d\n")
    code, out, err = translate("--checkpoint", ckpt, "--beam", 1, "--input", unknown)
    assert code == 0 and (f"it is not Windows-1252 or Latin-1 either (byte 0x81 is none of "
                          f"their letters): find its encoding (e.g. with file -i) and convert "
                          f"it (e.g. iconv -f ENCODING -t UTF-8 < {unknown} > fixed.txt)") in err


def test_a_corpus_in_latin1_is_refused_saying_so(corpus, tmp_path):  # noqa: F811
    """A fault this guards against: the message said to read the corpus "with
    skip_invalid=True", which no command line has."""
    src, tgt = sentence_pairs(300, 0)
    tgt[6] = "große häuser"
    path = corpus / "train.de.gz"
    path.write_bytes(gzip.compress(("\n".join(tgt) + "\n").encode("latin-1")))
    err = refused(train_wmt(*corpus_args(corpus), "--out", tmp_path / "run"),
                  f"{path}, line 7: invalid UTF-8 (invalid continuation byte at byte 3); it "
                  f"seems to be in an 8-bit encoding such as Windows-1252 or Latin-1, in which "
                  f"that line reads 'große': convert it to UTF-8 (e.g. zcat {path} | iconv -f "
                  f"WINDOWS-1252 -t UTF-8 > fixed.de) and give that file")
    assert "skip_invalid" not in err


def test_train_lm_says_what_a_text_that_is_not_utf8_seems_to_be(tmp_path):
    """A fault this guards against: train_lm.py said only "the text must be UTF-8: convert it,
    e.g. `iconv -t UTF-8`", naming no encoding to convert from."""
    text = tmp_path / "input.txt"
    text.write_bytes(("un café au lait\n" + "the quick brown fox\n" * 40).encode("cp1252"))
    for tokenizer in ("char", "bpe"):
        refused(train_lm("--data", text, "--tokenizer", tokenizer, "--vocab-size", 40, "--out",
                         tmp_path / "run"),
                f"{text}, line 1: invalid UTF-8 (invalid continuation byte at byte 6); it "
                f"seems to be in an 8-bit encoding such as Windows-1252 or Latin-1, in which "
                f"that line reads 'café': convert it to UTF-8 (e.g. iconv -f WINDOWS-1252 -t "
                f"UTF-8 < {text} > fixed.txt) and give that file")


# ---- damaged gzip, a failing disk -----------------------------------------------------------

def test_a_corrupt_gzip_input_is_said_to_be(ckpt, tmp_path):  # noqa: F811
    """A fault this guards against: a gzip stream corrupt inside (zlib's "invalid bit length
    repeat") ended translate with a traceback."""
    data = bytearray(gzip.compress(b"a man sings\n" * 1000))
    data[20:30] = b"\xff" * 10
    path = tmp_path / "in.en.gz"
    path.write_bytes(bytes(data))
    refused(translate("--checkpoint", ckpt, "--input", path),
            f"{path}: read failed (Error -3 while decompressing data", "the file is corrupt or "
            "truncated, re-create or re-download it")


def test_a_text_the_disk_fails_to_give_is_an_io_error(ckpt, corpus, tmp_path):  # noqa: F811
    """A fault this guards against: an I/O error opening the input was status 2, bad input
    (train_lm.py: "the file is corrupt or truncated"; plot: "cannot read training log")."""
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 1, "loss": 2.0}\n', encoding="utf-8")
    for source, args in (
            (corpus / "test.en", ["-m", "minitfm.translate", "--checkpoint", ckpt, "--input",
                                  corpus / "test.en"]),
            (corpus / "train.en", [ROOT / "train_wmt.py", *TINY, "--max-steps", 2,
                                   *corpus_args(corpus), "--out", tmp_path / "run"]),
            (corpus / "train.en", [ROOT / "train_lm.py", "--data", corpus / "train.en",
                                   "--out", tmp_path / "run"]),
            (log, ["-m", "minitfm.plot", "curves", log, "--out", tmp_path / "curves.png"])):
        code, _, err = command(ROOT / "tests" / "failing_disk.py", "--eio", source, "--", *args)
        assert code == 1 and err.count("error:") == 1 and "Traceback" not in err, err
        assert f"{source}: reading it failed: Input/output error. The file itself was not " \
               f"judged" in err
    assert not (tmp_path / "run").exists()


# ---- a terminal -----------------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_translate_on_a_terminal_says_how_to_end_the_input(ckpt):  # noqa: F811
    """A fault this guards against: translate on a terminal waited there without a word."""
    leader, follower = os.openpty()
    process = forkserver.Popen([sys.executable, "-m", "minitfm.translate", "--checkpoint", ckpt,
                                "--beam", "1"], stdin=follower, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=ENV)
    os.close(follower)
    try:
        assert select.select([process.stderr], [], [], 60)[0], "nothing said on standard error"
        note = process.stderr.readline().decode()
        assert note == ("note: reading sentences from the terminal, one per line, until Ctrl-D; "
                        "or give them with --input FILE or through a pipe\n")
        os.write(leader, b"a man\n\x04")                 # one Ctrl-D ends the input
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait()
        os.close(leader)
    assert process.returncode == 0 and len(out.splitlines()) == 1, err
