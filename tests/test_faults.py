"""Faults and bad input through the real command lines: every one gets a clear message and a
non-zero exit, never a bare traceback, and nothing saved before is changed or lost.

The classes follow the list of faults the command lines must handle: write failures (1), SIGTERM
(2), a second Ctrl-C during the save (3), a refused --resume that must leave the run directory as
it was (4), empty corpora (5), the model's length limit (6), gzipped and invalid input to
translate (7), a bad MINITFM_BACKEND (8), bad option values (9), silent divergence (10) and
misleading messages (11); plus the report of the backend ``auto`` chose.
"""

from __future__ import annotations

import errno
import gzip
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from minitfm import backend, checkpoint
from minitfm.decoding import batched, translation
from minitfm.cli import exits, translate, wmt
from minitfm.training import rundir, validation
from minitfm.training.rundir import LOG_NAME
from minitfm.training.state import TrainOptions
from tests import trainrun
from minitfm.models import translator
from minitfm.data import EncodedCorpus, epoch_batches, eval_arrays
from tests.test_train_wmt import TINY, corpus, corpus_args, run, sentence_pairs, train_wmt  # noqa: F401
from tests.test_train_wmt import write_split
from tests.test_translate import ckpt, vocab  # noqa: F401  (fixtures)
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
TOY = ["--task", "copy", "--length", "5", "--vocab", "5", "--batch-size", "8", "--preset", "tiny",
       "--eval-size", "10", "--quiet"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}


def toy(*args, limit_file_size: int | None = None, **kwargs) -> subprocess.Popen:
    """train_toy.py in a child process; ``limit_file_size`` sets RLIMIT_FSIZE there."""
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_size, limit_file_size))
    return forkserver.Popen([sys.executable, str(ROOT / "train_toy.py"), *TOY, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=limit if limit_file_size else None, **kwargs)


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err


def snapshot(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def wait_for(path: Path, process: subprocess.Popen, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, finish(process)
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


def assert_clean_error(err: str) -> None:
    assert "Traceback" not in err and err.count("error:") == 1, err


# ---- 1. write failures ------------------------------------------------------------------------

def test_disk_full_at_a_checkpoint_keeps_the_previous_one(tmp_path):
    """A real EFBIG (RLIMIT_FSIZE in the child) while saving: one error line naming the file, the
    reason and the intact previous checkpoint, which is byte-identical and loads."""
    assert finish(toy("--max-steps", 4, "--out", tmp_path))[0] == 0
    [previous] = [Path(p) for _, p in checkpoint.list_checkpoints(tmp_path)]
    before = previous.read_bytes()
    code, _, err = finish(toy("--max-steps", 8, "--out", tmp_path, "--resume",
                              limit_file_size=len(before) // 2))
    assert code == 1
    assert_clean_error(err)
    assert "cannot write checkpoint" in err and "checkpoint_00000008.npz" in err
    assert "File too large" in err and f"previous checkpoint {previous} is intact" in err
    assert "--resume" in err
    assert previous.read_bytes() == before and checkpoint.load(previous).step == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [previous.name, "log.jsonl",
                                                          rundir.RUN_INFO_NAME, rundir.LOCK_NAME]


def test_unwritable_log_names_the_log_and_the_checkpoint(tmp_path, monkeypatch, capsys):
    import builtins

    def read_only_log(path, mode="r", *args, **kwargs):
        if str(path).endswith(LOG_NAME) and "a" in mode:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return builtins.open(path, mode, *args, **kwargs)

    module = load_toy()
    monkeypatch.setattr(rundir, "open", read_only_log, raising=False)
    assert module.main(TOY + ["--max-steps", "12", "--save-every", "5", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert_clean_error(err)
    assert f"cannot write the log {tmp_path / 'log.jsonl'}: Read-only file system" in err
    assert "checkpoint_00000005.npz is intact" in err
    assert checkpoint.load(tmp_path / "checkpoint_00000005.npz").step == 5


def test_run_directory_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, _, err = finish(toy("--max-steps", 2, "--out", blocker / "run"))
    assert code == 1 and "cannot write the run directory" in err and "Not a directory" in err
    assert_clean_error(err)


def test_average_output_that_cannot_be_written(tmp_path):
    assert finish(toy("--max-steps", 4, "--save-every", 2, "--out", tmp_path))[0] == 0
    size = os.path.getsize(checkpoint.latest(tmp_path))
    output = tmp_path / "averaged.npz"
    output.write_bytes(b"an earlier average")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 4, size // 4))
    done = forkserver.run([sys.executable, "-m", "minitfm.average", "--inputs", str(tmp_path),
                           "--last", "2", "--output", str(output)], capture_output=True,
                          text=True, env=ENV, preexec_fn=limit)
    assert done.returncode == 1
    assert_clean_error(done.stderr)
    assert f"cannot write the averaged checkpoint {output}: File too large" in done.stderr
    assert output.read_bytes() == b"an earlier average"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_eval_only_hypotheses_that_cannot_be_written(corpus, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    assert run(*corpus_args(corpus), *TINY, "--max-steps", 2, "--out", out) == 0
    blocker = tmp_path / "file"
    blocker.write_text("")
    capsys.readouterr()
    assert run("--eval-only", "--checkpoint", out / "checkpoint_00000002.npz", "--testpref",
               corpus / "test", "--beam", 1, "--backend", "numpy", "--quiet", "--out",
               blocker / "scores") == exits.BAD_INPUT
    err = capsys.readouterr().err
    assert_clean_error(err)
    assert f"cannot write hypotheses {blocker / 'scores'}" in err and "Not a directory" in err


def load_toy():
    """train_toy.py's command module."""
    from minitfm.commands import train_toy
    return train_toy


# ---- 2, 3. signals ----------------------------------------------------------------------------

def test_sigterm_saves_a_checkpoint_and_the_run_resumes(tmp_path):
    process = toy("--max-steps", 1_000_000, "--out", tmp_path)
    wait_for(tmp_path / LOG_NAME, process)
    process.send_signal(signal.SIGTERM)
    code, out, err = finish(process)
    assert code == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM at step" in out and "--resume" in out and "Traceback" not in err
    [(step, path)] = checkpoint.list_checkpoints(tmp_path)
    assert checkpoint.load(path).step == step >= 10
    code, out, err = finish(toy("--max-steps", step + 3, "--out", tmp_path, "--resume",
                                "--examples", 0))
    assert code == 0 and "exact match on 10 held-out sequences" in out and "->" not in out


def test_a_second_ctrl_c_does_not_cut_the_save_short(tmp_path):
    process = toy("--max-steps", 1_000_000, "--out", tmp_path)
    wait_for(tmp_path / LOG_NAME, process)
    for _ in range(3):                        # Ctrl-C, then impatient repeats during the save
        process.send_signal(signal.SIGINT)
        time.sleep(0.002)
    code, out, err = finish(process)
    assert code == 130, err
    assert "interrupted at step" in out and "Traceback" not in err
    [(step, path)] = checkpoint.list_checkpoints(tmp_path)
    assert checkpoint.load(path).step == step
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_ctrl_c_arriving_during_the_save_waits_for_it(tmp_path, monkeypatch):
    """Deterministic: the second SIGINT lands inside checkpoint.save itself."""
    cfg = translator.Config.preset("tiny")
    rng = np.random.default_rng(0)
    batch = (rng.integers(4, 11, (4, 5)), np.concatenate(
        [np.full((4, 1), cfg.bos_id), rng.integers(4, 11, (4, 4)), np.full((4, 1), cfg.eos_id)], 1))
    real_save, saves = checkpoint.save, []

    def slow_save(path, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)   # the impatient second Ctrl-C
        saves.append(path)
        return real_save(path, *args, **kwargs)

    def batches(epoch):
        for i in range(100):
            if epoch == 0 and i == 3:
                os.kill(os.getpid(), signal.SIGINT)
            yield batch

    monkeypatch.setattr(checkpoint, "save", slow_save)
    before = signal.getsignal(signal.SIGINT)    # default_int_handler; SIG_IGN in a background job
    state = trainrun.train(cfg, batches, TrainOptions(max_steps=50, out_dir=str(tmp_path),
                                                      warmup=5, progress=False))
    assert state.interrupted and state.stop_signal == signal.SIGINT and state.step == 3
    assert checkpoint.load(saves[-1]).step == 3
    assert signal.getsignal(signal.SIGINT) is before


# ---- 4. a refused --resume writes nothing -------------------------------------------------------

def test_refused_resume_leaves_the_run_directory_byte_identical(corpus, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    common = [*corpus_args(corpus), *TINY, "--save-every", 2, "--out", out]
    assert run(*common, "--max-steps", 4) == 0
    before = snapshot(out)
    for changed, word in ((["--d-model", 32], "--d-model: the run has 16, now 32"),
                          (["--vocab-size", 48], "--vocab-size: the run has")):
        capsys.readouterr()
        assert run(*common, "--max-steps", 6, "--resume", *changed) == exits.BAD_INPUT
        assert word in capsys.readouterr().err
        assert snapshot(out) == before
    latest = Path(checkpoint.latest(out))
    latest.write_bytes(latest.read_bytes()[:1000])
    before = snapshot(out)
    capsys.readouterr()
    assert run(*common, "--max-steps", 6, "--resume") == exits.BAD_INPUT
    err = capsys.readouterr().err
    assert "damaged" in err and "list_checkpoints" not in err and "rename it" in err
    assert snapshot(out) == before


# ---- 5. corpora checked up front ------------------------------------------------------------------

@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_an_empty_corpus_is_refused_before_any_work(corpus, tmp_path, capsys, split):  # noqa: F811
    write_split(corpus / split, [], [])
    (corpus / f"{split}.en").write_text("")
    (corpus / f"{split}.de.gz").write_bytes(gzip.compress(b""))
    out = tmp_path / "run"
    assert run(*corpus_args(corpus), *TINY, "--max-steps", 2, "--out", out) == exits.BAD_INPUT
    err = capsys.readouterr().err
    assert f"no sentence pairs in {corpus / split}.en / {corpus / split}.de.gz" in err
    assert "Traceback" not in err and not out.exists()


# ---- 6. the model's length limit ----------------------------------------------------------------

def test_length_limit_for_train_valid_and_test():
    """Pairs one below, at and one above what the model takes: training keeps the first two and
    drops the third, validation truncates the third, decoding truncates an over-long source."""
    cfg = translator.Config.preset("tiny", max_len=12)
    params = translator.init_params(cfg, 0)
    longest = cfg.max_len - 2                      # target tokens that fit BOS ... EOS
    lengths = [longest - 1, longest, longest + 1]
    corpus = EncodedCorpus.from_ids([[5] * n for n in lengths], [[6] * n for n in lengths])
    args = train_wmt.parse_args(["--trainpref", "x", "--max-tokens", "1000"])
    batches = list(epoch_batches(corpus, 1000, seed=0,
                                 max_positions=wmt.train_positions(args, cfg))(0))
    kept = sorted(int((row != cfg.pad_id).sum()) - 2 for _, tgt in batches for row in tgt)
    assert kept == lengths[:2]                     # BOS and EOS are not target tokens
    for src, tgt in batches:
        translator.loss_and_grads(params, cfg, src, tgt)
    valid = eval_arrays(corpus, 8, max_positions=cfg.max_len - 1)
    assert sum(len(src) for src, _ in valid) == 3
    validation.evaluate(params, cfg, valid)
    sources = [[5] * n for n in (cfg.max_len - 2, cfg.max_len - 1, cfg.max_len)]
    warnings = []
    encoded = [translation.encode_lines(_Pieces(), cfg, [" ".join("x" * n)],
                                        warn=warnings.append)[0]
               for n in map(len, sources)]
    assert [len(ids) for ids in encoded] == [cfg.max_len - 2, cfg.max_len - 1, cfg.max_len - 1]
    assert len(warnings) == 1 and "line 1" in warnings[0]
    assert len(batched.translate_ids(params, cfg, encoded, beam=1)) == 3


class _Pieces:
    """A stand-in vocabulary: one token per space-separated piece."""

    def encode(self, texts):
        return [[5] * len(text.split()) for text in texts]


# ---- 7. translate's input ------------------------------------------------------------------------

def translate_cli(args, stdin: bytes = b"") -> tuple[int, str, str]:
    done = forkserver.run([sys.executable, "-m", "minitfm.translate", *map(str, args)],
                          input=stdin, capture_output=True, env=ENV)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def test_translate_reads_gzip_and_reports_truncated_gzip(ckpt, tmp_path):  # noqa: F811
    text = "a man\ntwo dogs\n\na woman\n".encode()
    plain, packed = tmp_path / "in.en", tmp_path / "in.en.gz"
    plain.write_bytes(text)
    packed.write_bytes(gzip.compress(text))
    expected = translate_cli(["--checkpoint", ckpt, "--beam", 1, "--input", plain])
    assert expected[0] == 0 and len(expected[1].splitlines()) == 4
    assert translate_cli(["--checkpoint", ckpt, "--beam", 1, "--input", packed]) == expected
    assert translate_cli(["--checkpoint", ckpt, "--beam", 1], stdin=gzip.compress(text)) == expected
    packed.write_bytes(gzip.compress(text * 50)[:-20])
    code, _, err = translate_cli(["--checkpoint", ckpt, "--beam", 1, "--input", packed])
    assert code == 2 and "corrupt or truncated" in err and str(packed) in err
    assert_clean_error(err)


def test_translate_warns_once_about_invalid_utf8(ckpt):  # noqa: F811
    code, out, err = translate_cli(["--checkpoint", ckpt, "--beam", 1],
                                   stdin=b"a man\n\xff dog\nok\n\xfe\xfe\n")
    assert code == 0 and len(out.splitlines()) == 4
    assert err.count("warning:") == 1 and "2 line(s) of standard input: 2, 4" in err


# ---- 8. MINITFM_BACKEND ---------------------------------------------------------------------------

@pytest.mark.parametrize("command", [
    [str(ROOT / "train_toy.py"), "--max-steps", "1"],
    [str(ROOT / "train_wmt.py"), "--trainpref", "nowhere"],
    ["-m", "minitfm.translate", "--checkpoint", "nowhere.npz"],
])
def test_bad_backend_variable_is_an_error_message(command, tmp_path):
    done = forkserver.run([sys.executable, *command], capture_output=True, text=True,
                          env={**ENV, "MINITFM_BACKEND": "foo"}, cwd=tmp_path)
    assert done.returncode != 0
    assert "MINITFM_BACKEND='foo'" in done.stderr and "numpy, cupy or auto" in done.stderr
    assert_clean_error(done.stderr)


# ---- 9. option values -----------------------------------------------------------------------------

@pytest.mark.parametrize("command, option, value", [
    ("train_wmt", "--clip-norm", "-1"), ("train_wmt", "--max-tokens", "2"),
    ("train_wmt", "--lr-factor", "inf"), ("train_wmt", "--dropout", "1"),
    ("translate", "--lenpen", "nan"), ("translate", "--beam", "0"),
    ("train_toy", "--lr-factor", "nan"), ("train_toy", "--batch-size", "0"),
    ("train_toy", "--batch-size", "-1"), ("train_toy", "--eval-size", "0"),
    ("train_toy", "--max-steps", "ten"), ("average", "--last", "0"),
    ("plot", "--d-model", "-4"),
])
def test_bad_option_values_are_usage_errors_naming_the_option(command, option, value, capsys):
    from minitfm.cli import average, plot
    mains = {"train_wmt": lambda argv: train_wmt.main(["--trainpref", "x", *argv]),
             "translate": lambda argv: translate.main(["--checkpoint", "x", *argv]),
             "train_toy": lambda argv: load_toy().main(argv),
             "average": lambda argv: average.main(["--inputs", "x", "--output", "y", *argv]),
             "plot": lambda argv: plot.main(["positional", *argv])}
    with pytest.raises(SystemExit) as exit_:
        mains[command]([option, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: must be" in err and repr(value) in err


def test_length_too_long_for_the_preset(tmp_path, capsys):
    assert load_toy().main(TOY + ["--length", "70", "--out", str(tmp_path)]) == 2
    assert "--length 70 is too long for the tiny preset's 64 positions" in capsys.readouterr().err


# ---- 10. silent divergence ------------------------------------------------------------------------

def test_a_loss_far_above_chance_stops_the_run(tmp_path):
    code, _, err = finish(toy("--max-steps", 60, "--out", tmp_path, "--lr-factor", 300,
                              "--clip-norm", 1, "--warmup", 5, "--save-every", 5))
    assert code == 1
    assert_clean_error(err.replace("RuntimeWarning", ""))
    assert "the training loss ran off" in err and "above 4 ln V" in err    # the first log line
    assert "at step 10;" in err
    assert "checkpoint_00000005.npz, is intact" in err or "after the loss ran off" in err


# ---- 11. messages that said the wrong thing ------------------------------------------------------

def test_checkpoint_that_is_a_directory_or_holds_objects(tmp_path, capsys):
    assert translate.main(["--checkpoint", str(tmp_path)]) == 2
    assert f"{tmp_path} is a directory: pass a checkpoint file" in capsys.readouterr().err
    pickled = tmp_path / "objects.npz"
    np.savez(pickled, meta=np.array([{"format": "minitfm-checkpoint"}], dtype=object))
    assert translate.main(["--checkpoint", str(pickled)]) == 2
    err = capsys.readouterr().err
    assert "holds Python objects" in err and "refused without unpickling" in err
    assert "damaged" not in err


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_advice_names_options_the_command_has(tmp_path, capsys):
    module = load_toy()
    code = module.main(TOY + ["--max-steps", "20", "--lr-factor", "1e6", "--warmup", "2",
                              "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and "--clip-norm" in err and "clip_norm" not in err


def test_cleaning_names_each_drop_reason(corpus, tmp_path, capsys):  # noqa: F811
    src, tgt = sentence_pairs(300, seed=0)
    src[:3], tgt[:3] = ["", "x", "a"], ["y", "", " ".join(["b"] * 20)]
    write_split(corpus / "train", src, tgt)
    assert run(*corpus_args(corpus), *TINY, "--max-steps", 1, "--out", tmp_path / "run") == 0
    assert "297 of 300 kept after cleaning; dropped: empty 2, ratio 1" in capsys.readouterr().out


# ---- also: the backend auto chose, and the big presets on a CPU ----------------------------------

def test_auto_says_why_it_chose_numpy(numpy_backend):
    backend.use("auto")
    if backend.name == "numpy":
        assert backend.describe().startswith("numpy (auto: CuPy")
    backend.use("numpy")
    assert backend.describe() == "numpy"


def test_base_preset_on_numpy_is_warned_about(tmp_path, capsys, numpy_backend):
    assert train_wmt.main(["--preset", "base", "--backend", "numpy", "--trainpref",
                           str(tmp_path / "nowhere"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "warning: the base preset on the CPU" in err and "--backend cupy" in err


# ---- 12. standard output that fails, a log with lines that cannot be read --------------------

FULL_OUTPUT = ("error: cannot write to standard output (/dev/full): No space left on device. "
               "Nothing is lost: no file was written or changed by what went there. Send the "
               "output where there is room (> a file on a disk with free space) and run the "
               "command again\n")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize("command", ["translate", "train_toy"])
def test_standard_output_on_a_full_disk_is_named(command, ckpt, tmp_path):  # noqa: F811
    args = ([sys.executable, "-m", "minitfm.translate", "--checkpoint", str(ckpt), "--beam", "1"]
            if command == "translate" else
            [sys.executable, str(ROOT / "train_toy.py"), *TOY, "--max-steps", "2", "--out",
             str(tmp_path / "run")])
    with open("/dev/full", "w") as full:
        done = forkserver.run(args, input=b"a man\ntwo dogs\n", stdout=full,
                              stderr=subprocess.PIPE, env=ENV, timeout=120)
    assert done.returncode == exits.FAILED
    assert done.stderr.decode() == FULL_OUTPUT              # one line, nothing more on the way out
    assert not (tmp_path / "run").exists()                  # refused at its first line


def test_standard_output_closed_by_its_reader_ends_quietly(ckpt):  # noqa: F811
    process = forkserver.Popen([sys.executable, "-m", "minitfm.translate", "--checkpoint",
                                str(ckpt), "--beam", "1"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    process.stdout.close()                                  # as `| head` does once it has enough
    _, err = process.communicate(b"a man\n" * 100, timeout=120)
    assert process.returncode == 128 + signal.SIGPIPE and err == b""


def test_plot_names_the_log_lines_it_skips(tmp_path):
    pytest.importorskip("matplotlib")
    log = tmp_path / "run" / LOG_NAME
    log.parent.mkdir()
    log.write_text("".join(f'{{"step": {s}, "loss": {5 / s}}}\n' for s in range(1, 9))
                   + '{"step": 9, "lo')                     # cut short by a crash
    done = forkserver.run([sys.executable, "-m", "minitfm.plot", "curves", str(log), "--out",
                           str(tmp_path / "c.png")], capture_output=True, text=True, env=ENV)
    assert done.returncode == 0 and (tmp_path / "c.png").exists()
    assert done.stderr == (f"warning: {log}: skipped 1 line that could not be read: line 9 (cut "
                           f"short: no line end); the curves are drawn without it\n")
