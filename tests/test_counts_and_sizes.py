"""Counts and sizes that cannot work, refused through the real command lines before any work,
with one ``error:`` line and status 2: a number of workers below 1, or beyond what one machine
runs or its open files allow; a negative value of a numeric option, refused by the option's own
type and not taken for a missing value; a ``max_len`` whose position table cannot be held in
memory, at training and at export; and sizes too large for any memory, refused by the memory
check without a traceback or a wait."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from minitfm import checkpoint
from minitfm.cli.launch import FILES_PER_WORKER, LAUNCHER_FILES, MAX_WORKERS_PER_CORE
from minitfm.workers.placement import available_cores

from .test_distributed import mpi  # noqa: F401  (a fixture)
from .test_train_wmt import TINY, corpus, corpus_args  # noqa: F401  (corpus: a fixture)
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}
# a value beyond any machine's memory, within every type's range
HUGE = 10**15


def command(*args, cwd=None, open_files: int | None = None) -> subprocess.CompletedProcess:
    """``python ARGS`` (a script of the repository, or ``-m module ...``) in a child process;
    ``open_files`` limits the files it may open (RLIMIT_NOFILE)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
    return forkserver.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          env=ENV, cwd=cwd, timeout=120, preexec_fn=limit if open_files else None)


def error_line(done: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line of a refused command (status 2), without a traceback."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, done.stderr
    return errors[0]


def script(name: str) -> Path:
    return ROOT / name


# ---- the number of workers of python -m minitfm.launch -----------------------------------------

def marker_program(mark: Path) -> list[str]:
    """A worker's program that leaves ``mark`` behind: whether anything started."""
    return [sys.executable, "-c", f"open({str(mark)!r}, 'w').close()"]


@pytest.mark.parametrize("counts", [["-n", "0"], ["-np", "-1"], ["-n", "two"], ["--n=0"],
                                    ["-genv", "A", "B", "-n", "0"]])
def test_a_count_of_workers_below_one_is_refused_before_anything_starts(tmp_path, counts):
    mark = tmp_path / "started"
    line = error_line(command("-m", "minitfm.launch", *counts, *marker_program(mark)))
    shown = counts[-1].replace("--n=", "-n ") if "=" in counts[-1] else " ".join(counts[-2:])
    assert f"error: {shown}: the number of workers must be a whole number of 1 or more" in line
    assert not mark.exists()


def test_a_count_below_one_of_any_program_of_the_line_is_refused(tmp_path):
    mark = tmp_path / "started"
    program = marker_program(mark)
    line = error_line(command("-m", "minitfm.launch", "-n", "1", *program, ":", "-n", "0",
                              *program))
    assert "-n 0: the number of workers must be" in line and not mark.exists()


def test_more_workers_than_one_machine_runs_are_refused_naming_its_cores(tmp_path):
    mark = tmp_path / "started"
    count = 10**8            # above MAX_WORKERS_PER_CORE per core on any machine
    # the open-file limit keeps a launcher that failed to refuse from starting many processes
    line = error_line(command("-m", "minitfm.launch", "-n", count, *marker_program(mark),
                              open_files=64))
    cores = available_cores()
    assert f"error: -n {count}: more workers than this machine can run well" in line
    assert f"{cores} core" in line and f"at most {cores * MAX_WORKERS_PER_CORE} workers" in line
    assert f"use -n {cores} or fewer" in line and "-hosts" in line
    assert not mark.exists()


def test_workers_beyond_the_open_files_allowed_are_refused_with_the_limit_to_raise(tmp_path):
    mark = tmp_path / "started"
    allowed = 2 * FILES_PER_WORKER + LAUNCHER_FILES - 1      # one file short for -n 2
    line = error_line(command("-m", "minitfm.launch", "-n", "2", *marker_program(mark),
                              open_files=allowed))
    assert f"-n 2: mpiexec keeps {FILES_PER_WORKER} files open per worker" in line
    assert f"more than the {allowed} this process may open (ulimit -n)" in line
    assert not mark.exists()


@pytest.mark.mpi
def test_a_few_workers_more_than_cores_run_after_one_warning(tmp_path, mpi):
    cores = available_cores()
    marks = [tmp_path / f"started{i}" for i in range(cores + 1)]
    program = [sys.executable, "-c", "import os; open(os.path.join(%r, 'started' + "
               "os.environ.get('PMI_RANK', '0')), 'w').close()" % str(tmp_path)]
    done = command("-m", "minitfm.launch", "-n", cores + 1, *program)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: -n {cores + 1} starts {cores + 1} workers on the "
                        f"{cores} core{'s' if cores != 1 else ''} this process may use: they "
                        f"take turns on the cores, which is slower than one worker per core "
                        f"(-n {cores})"]
    assert all(mark.exists() for mark in marks)


# ---- negative values: the option's own message ----------------------------------------------

TOY = [script("train_toy.py"), "--preset", "tiny"]
WMT = [script("train_wmt.py"), "--trainpref", "nowhere/train"]
LEARN = ["-m", "minitfm.learn", "--dir"]


@pytest.mark.parametrize("args, message", [
    ([*TOY, "--time-limit", "-5m"], "argument --time-limit: must be a time above 0, with its "
                                    "unit, s, m or h (90s, 60m, 1.5h), got '-5m'"),
    ([*TOY, "--time-limit=-5m"], "argument --time-limit: must be a time above 0"),
    ([*TOY, "--lr-factor", "-1e-3"], "argument --lr-factor: must be a finite number > 0, got "
                                     "'-1e-3'"),
    ([*TOY, "--clip-norm", "-inf"], "argument --clip-norm: must be a finite number > 0"),
    ([*WMT, "--time-limit", "-90s"], "argument --time-limit: must be a time above 0"),
    ([*WMT, "--cooldown", "-5steps"], "argument --cooldown: must be a fraction in [0, 1)"),
    ([*WMT, "--max-epochs", "-1.5e2"], "argument --max-epochs: must be a finite number > 0"),
    ([*WMT, "--dropout", "-1e-1"], "argument --dropout: must be a finite number in [0, 1)"),
    (["-m", "minitfm.export", "model.npz", "--to", "ctranslate2", "--out", "x", "--lenpen",
      "-6e-1"], "argument --lenpen: must be a finite number >= 0, got '-6e-1'"),
    ([*LEARN, "ws", "watch", "--every", "-1e-3"], "argument --every: must be a finite number in "
                                                  "(0, 3600], got '-1e-3'"),
    ([*LEARN, "ws", "train", "--steps", "-3"], "argument --steps: must be an integer in [1, 100000]"),
    ([*LEARN, "ws", "train", "--steps", "0"], "argument --steps: must be an integer in [1, 100000]"),
    ([*LEARN, "ws", "check", "--seed", "-1"], "argument --seed: must be an integer >= 0"),
    ([script("train_lm.py"), "--data", "x", "--time-limit", "-5m"],
     "argument --time-limit: must be a time above 0"),
    ([script("train_lm.py"), "--data", "x", "--temperature", "-1e-3"],
     "argument --temperature: must be a finite number > 0, got '-1e-3'"),
    (["-m", "minitfm.translate", "--checkpoint", "x", "--lenpen", "-1e-3"],
     "argument --lenpen: must be a finite number >= 0, got '-1e-3'"),
    (["-m", "minitfm.gradcheck", "--tolerance", "-1e-3"],
     "argument --tolerance: must be a finite number > 0, got '-1e-3'"),
    (["-m", "minitfm.plot", "lr", "--factor", "-1e-3"],
     "argument --factor: must be a finite number > 0, got '-1e-3'"),
    (["-m", "minitfm.average", "--inputs", "a", "--last", "-3", "--output", "b"],
     "argument --last: must be an integer >= 1, got '-3'"),
])
def test_a_negative_value_gets_the_options_own_message(tmp_path, args, message):
    line = error_line(command(*args, cwd=tmp_path))
    assert message in line, line
    assert "expected one argument" not in line
    assert not any(tmp_path.iterdir())               # nothing written


def test_a_thread_count_beyond_a_c_int_is_refused_by_the_option():
    line = error_line(command(*TOY, "--threads", 10**23))
    assert "argument --threads: must be an integer in [1, 2147483647]" in line


# ---- sizes beyond any memory ----------------------------------------------------------------

def test_train_wmt_refuses_a_max_len_whose_position_table_cannot_be_held(corpus, tmp_path):
    out = tmp_path / "run"
    line = error_line(command(script("train_wmt.py"), *corpus_args(corpus), *TINY,
                              "--max-steps", 2, "--max-len", HUGE, "--out", out))
    assert line.startswith(f"error: --max-len {HUGE}: the model's position table")
    assert re.search(r"the largest that fits, the other sizes unchanged: --max-len [1-9]\d*$",
                     line), line
    assert not list(out.glob("checkpoint_*"))


def checkpoint_with_max_len(path: Path, max_len: int) -> Path:
    """The small translator of the fixtures, saved with another ``max_len``."""
    ckpt = checkpoint.load(ROOT / "tests" / "fixtures" / "translator_step3.npz")
    checkpoint.save(path, ckpt.params, step=ckpt.step, config={**ckpt.config, "max_len": max_len},
                    vocab_id=ckpt.vocab_id, vocab_model=ckpt.vocab_model, extra=ckpt.extra,
                    kind=ckpt.kind)
    return path


def test_export_refuses_a_max_len_whose_position_table_cannot_be_held(tmp_path):
    model = checkpoint_with_max_len(tmp_path / "model.npz", HUGE)
    out = tmp_path / "model-ct2"
    line = error_line(command("-m", "minitfm.export", model, "--to", "ctranslate2",
                              "--out", out))
    assert f"the model's position table (max_len {HUGE} x d_model 4)" in line
    assert re.search(r"max_len (\d+)\. .* export a model trained with a smaller --max-len, "
                     r"\1 at most here", line), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.npz"]


def test_translate_names_max_len_when_the_outputs_cannot_be_held(tmp_path):
    """A model whose max_len is far beyond the memory (trained elsewhere): translate refuses
    it before reading any input, naming --max-len and the largest that fits (before, it said
    to lower --beam and --batch-size, which cannot make it fit)."""
    model = checkpoint_with_max_len(tmp_path / "model.npz", HUGE)
    line = error_line(command("-m", "minitfm.translate", "--checkpoint", model, "--input",
                              os.devnull))
    assert line.startswith("error: beam search needs about "), line
    assert "the largest that fits, the other sizes unchanged: --max-len " in line, line


@pytest.mark.parametrize("option, fits", [("--batch-size", "--batch-size"),
                                          ("--layers", "--layers"), ("--d-model", "--d-model")])
def test_a_size_of_many_digits_is_refused_by_the_memory_check_at_once(tmp_path, option, fits):
    line = error_line(command(*TOY, "--heads", 1, option, 10**23, "--out", tmp_path / "run"))
    assert line.startswith("error: training needs about ")
    assert f"the largest that fits, the other sizes unchanged: {fits} " in line
