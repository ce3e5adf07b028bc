"""Whole files are written whole or not at all (minitfm.files.replacing), a failed write names the
file, its folder and the free space there, and a cache left incomplete is rebuilt, saying so.

The full disk is simulated in-process (``os.fsync`` failing with ENOSPC, as a real full disk
fails when the data reaches it) for the messages; the caches a full disk or a crash leaves
behind (a 0-byte vocabulary metadata file beside a complete model, a token manifest cut short,
tokens without a manifest) are planted for the real command lines, which must rebuild them and
exit 0.
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from minitfm import checkpoint, files
from minitfm.cli import average, exits
from minitfm.training import rundir
from minitfm.models import lm
from tests.test_train_wmt import sentence_pairs, write_split
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}
WMT = ["--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--vocab-size", "64",
       "--max-tokens", "256", "--warmup", "10", "--backend", "numpy", "--quiet",
       "--source-lang", "en", "--target-lang", "de", "--max-steps", "2"]
LM = ["--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--block-size", "16",
      "--batch-size", "4", "--warmup", "1", "--quiet", "--samples", "0", "--eval-blocks", "2",
      "--max-steps", "2"]


@pytest.fixture
def disk_full(monkeypatch):
    """Every fsync fails with ENOSPC: the data of a whole file cannot reach the disk."""
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", full)


def no_temporaries(directory: Path) -> bool:
    return not [p for p in directory.rglob("*") if p.name.endswith(".tmp")]


# ---- the helper ---------------------------------------------------------------------------------

def test_a_failed_write_names_the_file_its_folder_and_the_free_space(tmp_path, disk_full):
    target = tmp_path / "out" / "model.npz"
    target.parent.mkdir()
    target.write_bytes(b"the earlier file")
    with pytest.raises(files.WriteError) as caught:
        with files.replacing(target) as tmp, open(tmp, "xb") as f:
            f.write(b"the new file")
    error = caught.value
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC
    assert error.filename == str(target)                  # the destination, not the temporary
    assert error.strerror.startswith("No space left on device (")
    assert f"free in {target.parent})" in error.strerror
    assert target.read_bytes() == b"the earlier file" and no_temporaries(tmp_path)


def test_an_error_of_another_file_read_meanwhile_is_not_called_a_write_failure(tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        with files.replacing(tmp_path / "out.txt"):
            open(tmp_path / "missing.txt")
    assert not isinstance(caught.value, files.WriteError)
    assert os.listdir(tmp_path) == []


def test_a_device_or_a_pipe_is_written_in_place_not_replaced(tmp_path):
    """``--output /dev/null`` or a named pipe: a rename would put a regular file in its place."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)

    def through_the_pipe(write) -> bytes:
        received = []
        reader = threading.Thread(target=lambda: received.append(pipe.read_bytes()), daemon=True)
        reader.start()
        write()
        reader.join(timeout=10)
        assert stat.S_ISFIFO(os.stat(pipe).st_mode)                      # still the pipe
        assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]     # no temporary
        return received[0]

    def write_text():
        with files.replacing(pipe) as tmp, open(tmp, "wb") as f:
            f.write(b"through the pipe")
    assert through_the_pipe(write_text) == b"through the pipe"
    cfg = lm.LMConfig(vocab=5, n_layers=1, d_model=4, n_heads=2, d_ff=8, max_len=8)
    params = {name: np.asarray(a) for name, a in lm.init_params(cfg).items()}
    saved = through_the_pipe(lambda: checkpoint.save(pipe, params, step=1, config=cfg.to_dict(),
                                                     vocab_id=None, kind=lm.KIND))
    with np.load(io.BytesIO(saved)) as arrays:                        # a whole checkpoint
        assert set(params) <= {name.split("/", 1)[-1] for name in arrays.files}


def test_run_json_and_the_log_name_the_free_space(tmp_path, disk_full):
    run = rundir.RunDirectory.open(tmp_path / "run", lock=False)   # (the lock writes a file too)
    with pytest.raises(rundir.WriteFailed, match=rf"run.json.*No space left on device \(.* free "
                                                 rf"in {tmp_path / 'run'}\)"):
        run.prepare(0, {"args": {}})
    assert not (tmp_path / "run" / "run.json").exists() and no_temporaries(tmp_path)


def test_averaging_onto_a_full_disk(tmp_path, disk_full, capsys):
    cfg = lm.LMConfig(vocab=5, n_layers=1, d_model=4, n_heads=2, d_ff=8, max_len=8)
    params = {name: np.asarray(a) for name, a in lm.init_params(cfg).items()}
    with pytest.MonkeyPatch.context() as patch:           # the inputs are written normally
        patch.setattr(os, "fsync", lambda fd: None)
        checkpoint.save(tmp_path / "checkpoint_00000001.npz", params, step=1,
                        config=cfg.to_dict(), vocab_id=None, kind=lm.KIND)
    before = (tmp_path / "checkpoint_00000001.npz").read_bytes()
    output = tmp_path / "averaged.npz"
    assert average.main(["--inputs", str(tmp_path), "--output", str(output)]) == 1
    err = capsys.readouterr().err
    assert f"cannot write the averaged checkpoint {output}: No space left on device" in err
    assert f"free in {tmp_path})" in err
    assert not output.exists() and no_temporaries(tmp_path)
    assert (tmp_path / "checkpoint_00000001.npz").read_bytes() == before


# ---- the log: appended, cut back to complete lines ----------------------------------------------

def test_resuming_cuts_the_log_back_to_its_complete_lines(tmp_path):
    log = tmp_path / rundir.LOG_NAME
    log.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3}\n'
                   '{"step": 2, "lo', encoding="utf-8")          # a line a crash cut short
    rundir.cut_log(str(log), 2)
    assert log.read_text() == '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'
    log.write_text('{"step": 1}\n{"step": 2}', encoding="utf-8")   # complete JSON, no newline
    rundir.cut_log(str(log), 5)
    rundir.RunDirectory.open(tmp_path).append_log({"step": 2})
    assert [json.loads(line) for line in log.read_text().splitlines()] == \
        [{"step": 1}, {"step": 2}]


# ---- caches a full disk or a crash left behind --------------------------------------------------

def run(*argv) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, *map(str, argv)], capture_output=True, text=True,
                          env=ENV, cwd=ROOT, timeout=300)


@pytest.fixture
def corpus(tmp_path) -> list:
    for split, n, seed in (("train", 300, 0), ("val", 30, 1)):
        write_split(tmp_path / split, *sentence_pairs(n, seed))
    return ["--trainpref", tmp_path / "train", "--validpref", tmp_path / "val"]


def test_a_vocabulary_written_onto_a_full_disk_leaves_nothing_trusted(tmp_path, corpus,
                                                                     monkeypatch, capsys):
    from tests.test_train_wmt import train_wmt
    data = tmp_path / "data"
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
    argv = [*WMT, *corpus, "--data-dir", data]
    out = ["--out", tmp_path / "run", "--no-lock"]       # (the lock's own file would fail first)
    assert train_wmt.main([str(a) for a in argv + out]) == exits.FAILED      # a full disk: 1
    err = capsys.readouterr().err
    model = data / "spm.en-de.64.model"
    assert "Traceback" not in err and err.count("error:") == 1
    assert f"error: {model}: No space left on device (" in err and f"free in {data})" in err
    assert not model.exists() and not (data / "spm.en-de.64.json").exists()
    assert no_temporaries(tmp_path)
    monkeypatch.undo()                                   # space again: the next run builds it
    done = run("train_wmt.py", *argv, "--out", tmp_path / "run2")
    assert done.returncode == 0, done.stderr
    assert "incomplete" not in done.stdout + done.stderr
    assert json.loads((data / "spm.en-de.64.json").read_text())["vocab_size"] == 64


def test_broken_vocabulary_and_token_caches_are_rebuilt_saying_so(tmp_path, corpus):
    data = tmp_path / "data"
    argv = [*WMT, *corpus, "--data-dir", data]
    assert run("train_wmt.py", *argv, "--out", tmp_path / "run1").returncode == 0
    metadata = data / "spm.en-de.64.json"
    model_bytes = (data / "spm.en-de.64.model").read_bytes()
    [manifest] = (data).glob("encoded-*/train/train.en-de.json")
    metadata.write_bytes(b"")                                   # a 0-byte metadata file
    manifest.write_text(manifest.read_text()[:40])              # a manifest cut short
    [valid_manifest] = (data).glob("encoded-*/valid/val.en-de.json")
    valid_manifest.unlink()                                     # tokens without a manifest
    done = run("train_wmt.py", *argv, "--out", tmp_path / "run2")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Traceback" not in out and "JSONDecodeError" not in out
    lines = [line for line in out.splitlines() if "incomplete" in line]
    assert len(lines) == 3, out
    assert f"the vocabulary cache is incomplete: its metadata {metadata} is empty; training it " \
           f"again" in lines[0]
    assert f"its metadata {manifest} is cut short or damaged; encoding it again" in lines[1]
    assert "val.en-de" in lines[2] and "has no metadata val.en-de.json beside it" in lines[2]
    assert json.loads(metadata.read_text())["vocab_size"] == 64
    assert (data / "spm.en-de.64.model").read_bytes() == model_bytes      # the same vocabulary
    assert json.loads(manifest.read_text())["pairs"] == 300
    assert json.loads(valid_manifest.read_text())["pairs"] == 30
    again = run("train_wmt.py", *argv, "--out", tmp_path / "run3")
    assert again.returncode == 0 and "incomplete" not in again.stdout + again.stderr


def test_a_broken_text_token_cache_is_rebuilt_saying_so(tmp_path):
    text = tmp_path / "story.txt"
    text.write_text("anna sees the cat.\nbob sees a dog.\n" * 100, encoding="utf-8")
    cache = tmp_path / "cache"
    argv = ["train_lm.py", "--data", text, *LM, "--cache-dir", cache]
    assert run(*argv, "--out", tmp_path / "run1").returncode == 0
    [manifest] = cache.glob("story.txt.char-*.json")
    good = manifest.read_text()
    manifest.write_bytes(b"")
    done = run(*argv, "--out", tmp_path / "run2")
    assert done.returncode == 0, done.stderr
    assert "JSONDecodeError" not in done.stderr and "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if "incomplete" in line]
    assert f"its metadata {manifest} is empty; encoding {text} again" in line
    assert manifest.read_text() == good
