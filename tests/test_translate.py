"""Tests of minitfm.translate: the command-line plumbing on a tiny random-weight checkpoint with
a tiny sentencepiece vocabulary (the translations are garbage; lines, formats, warnings and errors
are what is checked)."""

import io
import sys

import numpy as np
import pytest

from minitfm import checkpoint
from minitfm.decoding import translation
from minitfm.cli import translate
from minitfm.models import lm, translator
from minitfm.data.vocab import train_vocab
from tests import forkserver

TEXT = """a man is riding a bike down the street
two dogs play in the grass
a woman sings on a stage
children are running on the beach
the cat sleeps near the window
ein mann fährt mit dem fahrrad die straße entlang
zwei hunde spielen im gras
eine frau singt auf einer bühne""".splitlines()


@pytest.fixture(scope="module")
def vocab():
    return train_vocab(TEXT * 4, 40, hard_vocab_limit=False, num_threads=1)


def write_checkpoint(path, vocab, with_vocab=True, seed=0):
    cfg = translator.Config.preset("tiny", src_vocab=vocab.size, tgt_vocab=vocab.size, max_len=24)
    params = translator.init_params(cfg, seed=seed, dtype=np.float32)
    checkpoint.save(path, params, step=1, config=cfg.to_dict(), vocab_id=vocab.identifier,
                    vocab_model=vocab.serialized_model() if with_vocab else None)
    return str(path)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, vocab):
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny.npz", vocab)


def run(args, text):
    out = io.StringIO()
    code = translate.main(args, stdin=io.BytesIO(text.encode("utf-8")), stdout=out)
    return code, out.getvalue()


def test_one_line_out_per_line_in_and_empty_lines_stay_empty(ckpt):
    text = "a man sings\n\ntwo dogs\n   \nthe cat sleeps on the beach\n"
    code, out = run(["--checkpoint", ckpt, "--beam", "2", "--batch-size", "2"], text)
    assert code == 0
    lines = out.split("\n")
    assert lines[-1] == "" and len(lines) - 1 == 5
    assert lines[1] == "" and lines[3] == ""


def test_input_file_and_greedy(ckpt, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXT[:3]) + "\n", encoding="utf-8")
    code, out = run(["--checkpoint", ckpt, "--input", str(source), "--beam", "1"], "")
    assert code == 0 and len(out.splitlines()) == 3


def test_same_translations_whatever_the_batch_size(ckpt):
    text = "\n".join(TEXT) + "\n"
    _, one = run(["--checkpoint", ckpt, "--batch-size", "1"], text)
    _, many = run(["--checkpoint", ckpt, "--batch-size", "5"], text)
    assert one == many


def test_nbest_prints_indices_texts_and_scores(ckpt):
    code, out = run(["--checkpoint", ckpt, "--beam", "3", "--nbest", "3"], "a man\n\ntwo dogs\n")
    assert code == 0
    rows = [line.split(" ||| ") for line in out.splitlines()]
    assert [r[0] for r in rows] == ["0", "0", "0", "1", "2", "2", "2"]
    assert all(len(r) == 3 for r in rows)
    scores = [float(r[2]) for r in rows]
    assert scores[0] >= scores[1] >= scores[2] and scores[4] >= scores[5] >= scores[6]
    assert rows[3][1:] == ["", "0.0000"]                             # the empty line


def test_long_lines_are_truncated_with_a_warning(ckpt, capsys):
    long_line = " ".join(TEXT[:4])                       # far more than max_len = 24 tokens
    code, out = run(["--checkpoint", ckpt, "--beam", "2"], f"a man\n{long_line}\n")
    assert code == 0 and len(out.splitlines()) == 2
    err = capsys.readouterr().err
    assert "warning" in err and "line 2" in err and "first 23 tokens" in err


def test_checkpoint_without_vocabulary_is_a_clear_error(tmp_path, vocab, capsys):
    path = write_checkpoint(tmp_path / "novocab.npz", vocab, with_vocab=False)
    code, out = run(["--checkpoint", path], "a man\n")
    assert code == 2 and out == ""
    assert "has no vocabulary" in capsys.readouterr().err


def test_a_language_model_checkpoint_is_refused_by_kind(tmp_path, vocab, capsys):
    cfg = lm.LMConfig.preset("tiny", vocab=vocab.size)
    path = tmp_path / "lm.npz"
    checkpoint.save(path, lm.init_params(cfg), step=1, config=cfg.to_dict(),
                    vocab_id=vocab.identifier, vocab_model=vocab.serialized_model(), kind=lm.KIND)
    code, out = run(["--checkpoint", str(path)], "a man\n")
    assert code == 2 and out == ""
    assert "holds a decoder-only language model" in capsys.readouterr().err


def test_missing_checkpoint_and_bad_options(tmp_path, ckpt, capsys):
    code, _ = run(["--checkpoint", str(tmp_path / "nothing.npz")], "a\n")
    assert code == 2 and "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        translate.main(["--checkpoint", ckpt, "--beam", "2", "--nbest", "3"])
    assert "--nbest must be between 1 and --beam" in capsys.readouterr().err
    code, _ = run(["--checkpoint", ckpt, "--max-len", "1000"], "a\n")
    assert code == 2 and "--max-len" in capsys.readouterr().err


def test_translate_lines_api(ckpt):
    params, cfg, vocab = translation.load_translator(ckpt)
    results = translation.translate_lines(params, cfg, vocab, ["a man", "", "two dogs"], beam=2,
                                          nbest=2)
    assert [len(r) for r in results] == [2, 1, 2]
    assert results[1] == [("", 0.0)]
    assert all(isinstance(text, str) and isinstance(score, float) for r in results for text, score in r)


def test_command_line_reads_stdin(ckpt):
    done = forkserver.run([sys.executable, "-m", "minitfm.translate", "--checkpoint", ckpt,
                           "--beam", "1"], input="a man\n\ntwo dogs\n".encode(),
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert len(done.stdout.decode().split("\n")) == 4 and done.stdout.decode().split("\n")[1] == ""
