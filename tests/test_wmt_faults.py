"""train_wmt.py through its real command line where what it prints could say more than was
done: scoring into a folder that cannot be written fails before the decoding (status 1, no
score printed), and the vocabulary is announced as the kind it is.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import sentencepiece as spm

from minitfm.ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from tests.test_train_wmt import TINY, corpus, corpus_args  # noqa: F401  (fixture)
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}


def train_wmt(*args, wrapper: list[str] = ()) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, *wrapper, str(ROOT / "train_wmt.py"),
                           *map(str, args)], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120)


def test_eval_only_into_a_read_only_folder_fails_before_decoding(corpus, tmp_path):  # noqa: F811
    """Scoring a checkpoint whose folder is on a read-only mount: one error naming the
    hypotheses' file and the fix, status 1 (a write failure, not bad input), found before the
    test set is decoded, and no BLEU printed; nothing in the folder changes."""
    out = tmp_path / "run"
    done = train_wmt(*corpus_args(corpus), *TINY, "--max-steps", 2, "--out", out)
    assert done.returncode == 0, done.stderr
    before = sorted(os.listdir(out))
    model = out / "checkpoint_00000002.npz"
    done = train_wmt("--eval-only", "--checkpoint", model, "--testpref", corpus / "test",
                     "--source-lang", "en", "--target-lang", "de", "--beam", 1, "--backend",
                     "numpy", wrapper=[str(ROOT / "tests" / "failing_disk.py"), "--read-only",
                                       str(out), "--"])
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1, done.stderr
    assert f"cannot write hypotheses {out / 'checkpoint_00000002.test.hyp.de'}: Read-only " \
           f"file system" in done.stderr and "pass an --out where files can be written" \
           in done.stderr, done.stderr
    assert "BLEU" not in done.stdout + done.stderr and "sent/s" not in done.stderr
    assert sorted(os.listdir(out)) == before


def sentencepiece_model(lines: list[str], model_type: str, size: int) -> bytes:
    """A sentencepiece model of ``model_type`` with minitfm's special ids, as another program
    would train it."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type=model_type,
        vocab_size=size, hard_vocab_limit=False, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID,
        eos_id=EOS_ID, minloglevel=2)
    return model.getvalue()


def test_the_vocabulary_is_announced_as_the_kind_it_is(corpus, tmp_path):  # noqa: F811
    """A unigram model in the data folder, where the cache of the BPE one was: the run uses
    it and says "unigram", not "BPE"; the run that trained the BPE one says "BPE"."""
    data = tmp_path / "data"
    first = train_wmt(*corpus_args(corpus), *TINY, "--max-steps", 1, "--data-dir", data,
                      "--out", tmp_path / "first")
    assert first.returncode == 0, first.stderr
    assert "joint BPE pieces" in first.stdout, first.stdout
    [model] = data.glob("spm.*.model")
    lines = (corpus / "train.en").read_text(encoding="utf-8").splitlines()
    model.write_bytes(sentencepiece_model(lines, "unigram", 64))
    second = train_wmt(*corpus_args(corpus), *TINY, "--max-steps", 1, "--data-dir", data,
                       "--out", tmp_path / "second")
    assert second.returncode == 0, second.stderr
    assert "joint unigram pieces" in second.stdout and "BPE pieces" not in second.stdout, \
        second.stdout


def test_a_cache_the_disk_fails_to_read_is_not_rebuilt_over(corpus, tmp_path):  # noqa: F811
    """EIO reading the vocabulary's cached model, its metadata, or a cached token array on a
    resume: status 1 naming the file and the I/O error, never "incomplete" or "damaged", and
    nothing trained or encoded again over the file the disk would not give back."""
    first = tmp_path / "first"
    done = train_wmt(*corpus_args(corpus), *TINY, "--max-steps", 2, "--out", first)
    assert done.returncode == 0, done.stderr
    [tokens] = (first / "data").glob("encoded-*/train/train.en-de.en.tokens.npy")
    for unreadable in (first / "data" / "spm.en-de.64.model", first / "data" / "spm.en-de.64.json",
                       tokens):
        run = tmp_path / "run"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(first, run)
        path = run / unreadable.relative_to(first)
        before = path.read_bytes()
        done = train_wmt(*corpus_args(corpus), *TINY, "--max-steps", 3, "--out", run, "--resume",
                         wrapper=[str(ROOT / "tests" / "failing_disk.py"), "--eio", str(path),
                                  "--"])
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1, done.stderr
        assert f"{path}: reading it failed: Input/output error" in done.stderr, done.stderr
        said = done.stdout + done.stderr
        assert not any(word in said for word in ("incomplete", "damaged", "training a",
                                                 "encoding it")), said
        assert path.read_bytes() == before


OUT_OF_MEMORY_IN = """
import importlib, runpy, sys
module, name = sys.argv[1].rsplit(".", 1)

def out_of_memory(*args, **kwargs):
    raise MemoryError("Unable to allocate 119. GiB for an array")

setattr(importlib.import_module(module), name, out_of_memory)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_memory_running_out_after_training_says_the_training_is_saved(corpus, tmp_path):  # noqa: F811
    """Memory that runs out once training is done (train_wmt's test evaluation, train_toy's
    held-out examples): status 1, the checkpoint of the last step saved and named, with how to
    do the rest alone and what to lower there -- not the training's sizes."""
    out = tmp_path / "wmt"
    done = forkserver.run(
        [sys.executable, "-c", OUT_OF_MEMORY_IN, "minitfm.cli.wmt.score_test",
         str(ROOT / "train_wmt.py"), *corpus_args(corpus), *TINY, "--max-steps", "3",
         "--out", str(out)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stderr.count("error:") == 1, done.stderr
    saved = out / "checkpoint_00000003.npz"
    assert saved.is_file()
    assert (f"Unable to allocate 119. GiB for an array, in the test set's evaluation after "
            f"training; the training is done and its checkpoint {saved} (step 3) is saved: "
            f"score it alone with python train_wmt.py --eval-only --checkpoint {saved} and the "
            f"same test options; lower --eval-batch-size or --beam, or use") in done.stderr
    out = tmp_path / "toy"
    done = forkserver.run(
        [sys.executable, "-c", OUT_OF_MEMORY_IN, "minitfm.commands.train_toy.report",
         str(ROOT / "train_toy.py"), "--task", "copy", "--length", "5", "--vocab", "5",
         "--preset", "tiny", "--max-steps", "2", "--out", str(out)],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stderr.count("error:") == 1, done.stderr
    assert (f"in the held-out examples after training; the training is done and its "
            f"checkpoint {out / 'checkpoint_00000002.npz'} (step 2) is saved: lower --eval-size "
            f"and continue with --resume") in done.stderr and "lower --eval-size, or use" \
        in done.stderr


def test_a_cache_file_that_is_a_named_pipe_is_refused_not_waited_on(corpus, tmp_path):  # noqa: F811
    """A named pipe where the vocabulary's metadata or a token array of the cache was: status 2
    at once, naming it and the fix, never a read that waits for a writer (or a write into it)."""
    first = tmp_path / "first"
    done = train_wmt(*corpus_args(corpus), *TINY, "--max-steps", 2, "--out", first)
    assert done.returncode == 0, done.stderr
    [tokens] = (first / "data").glob("encoded-*/train/train.en-de.en.tokens.npy")
    for cached in (first / "data" / "spm.en-de.64.json", tokens):
        run = tmp_path / "run"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(first, run)
        path = run / cached.relative_to(first)
        path.unlink()
        os.mkfifo(path)
        done = train_wmt(*corpus_args(corpus), *TINY, "--max-steps", 3, "--out", run, "--resume")
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1, done.stderr
        assert f"error: {path} is a named pipe, where a cache keeps a regular file: move it out " \
               f"of {path.parent}" in done.stderr, done.stderr
