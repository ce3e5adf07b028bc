"""Validation and test lines longer than the model reads are refused before training, never cut
silently: the message gives how many, the longest and the limit, and the fix (--max-len); BLEU
compares against the references as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from minitfm import checkpoint
from tests.test_train_wmt import (TINY, WORDS, corpus, corpus_args, run,  # noqa: F401 (fixture)
                                  sentence_pairs, write_split)


@pytest.fixture(autouse=True)
def numpy_only(numpy_backend):
    """train_wmt selects the backend globally: restore it after each test."""


def lengthen(prefix: Path, line: int, words: int) -> None:
    """Make pair ``line`` (from 1) of split ``prefix`` ``words`` words long on both sides (the
    splits of the ``corpus`` fixture: val 30 pairs from seed 1, test 20 from seed 2)."""
    n, seed = (30, 1) if prefix.name == "val" else (20, 2)
    src, tgt = sentence_pairs(n, seed)
    src[line - 1] = " ".join(WORDS[i % len(WORDS)] for i in range(words))
    tgt[line - 1] = " ".join(w[::-1] + "en" for w in src[line - 1].split())
    write_split(prefix, src, tgt)


def refused(corpus: Path, out: Path, capsys) -> str:
    """Train on ``corpus`` with --max-len 32: refused with status 2, one error line and no
    traceback, before any training. Its standard error."""
    assert run(*corpus_args(corpus), *TINY, "--max-len", 32, "--max-steps", 2, "--out", out) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 1, err
    assert checkpoint.latest(out) is None
    return err


def test_an_over_long_validation_pair_is_refused_with_the_fix(
        corpus, tmp_path, capsys):  # noqa: F811
    lengthen(corpus / "val", 5, 60)
    err = refused(corpus, tmp_path / "run", capsys)
    assert "error: 1 of 30 validation pairs of " in err
    assert "are longer than the model reads (30 tokens a side with --max-len 32): the longest, " \
           "pair 5, has " in err
    assert "Train with --max-len " in err and "or remove those pairs" in err
    longest = int(err.split("pair 5, has ")[1].split()[0])
    assert longest > 30
    # the fix it gives works
    fix = int(err.split("Train with --max-len ")[1].split()[0])
    assert fix == longest + 2
    assert run(*corpus_args(corpus), *TINY, "--max-len", fix, "--max-steps", 2,
               "--out", tmp_path / "fixed") == 0


def test_an_over_long_test_source_is_refused_before_training(
        corpus, tmp_path, capsys):  # noqa: F811
    lengthen(corpus / "test", 3, 60)
    err = refused(corpus, tmp_path / "run", capsys)
    assert "error: 1 of 20 test sources of " in err and "test.en are longer than the model " \
           "reads (31 tokens with --max-len 32): the longest, line 3, has " in err
    assert "they would be translated cut short. Train with --max-len" in err


def test_eval_only_refuses_a_test_source_its_model_cannot_read(
        corpus, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    assert run(*corpus_args(corpus), *TINY, "--max-len", 32, "--max-steps", 1, "--out", out) == 0
    lengthen(corpus / "test", 2, 60)
    capsys.readouterr()
    assert run("--eval-only", "--checkpoint", checkpoint.latest(out), "--testpref",
               corpus / "test", "--backend", "numpy", "--quiet") == 2
    err = capsys.readouterr().err
    assert "1 of 20 test sources" in err and "than the model of " in err
    assert "Score a model trained with a larger --max-len, or a test set without those lines" \
        in err
