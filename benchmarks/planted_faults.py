"""Planted faults: the test suite catches each of a fixed list of realistic bugs.

    python benchmarks/planted_faults.py [--repo PATH] [--only NAME ...] [--list] [--full]

Each fault of ``FAULTS`` is one small edit of the library, a bug a developer could make: a wrong
sign, a missing term or sum, an off-by-one, a transposition, a wrong constant, a write that is no
longer atomic, a wrong comparison, a missing mask. They cover the layers' backward passes, the
models, Adam and the learning-rate schedules, checkpoints and atomic writes, beam search,
batching, the data reader, the CUDA kernels (their source executed on the CPU), the run record
and the signals. The script proves that the suite, as the README runs it (a plain ``pytest`` in
the repository root: pyproject's ``addopts`` leave out the slow tests and those that need a
browser or the real CuPy), fails on every one of these bugs, and names the test that fails.

The checkout (``--repo``, by default the one this script lives in: the files git lists, tracked
or untracked but not ignored, without ``.git``) is copied into a temporary folder once; for each
fault the script makes the edit in the copy, runs the tests, and puts the file back byte for
byte. Every pytest run has the copy as its working folder and first on ``PYTHONPATH``, so that
the copy's ``minitfm`` is the one imported, by the tests and by the commands they start. A
fault whose snippet is not found exactly once in its file stops the script before anything
runs. ``--repo`` runs the same list against another checkout (an older commit's worktree, say):
before and after the tests are reorganised. Tests a fault names that the checkout does not have
are said, and that fault goes straight to the whole run.

1. A sanity run first: the tests the faults name, together, on the clean copy, must pass (a fault
   "caught" by a test that fails anyway proves nothing). A failure stops the script.
2. For each fault: the tests it names (``Fault.tests``, where to look first), with ``-x -n 0``;
   if they pass, the README's whole command (``pytest -x``, on every core). A fault is caught
   when pytest fails; the catcher is the first failing test of its summary. With ``--full`` the
   whole command runs at once, without the first look at the named tests.
3. Printed: one line per fault as it finishes (its name, its seconds, the test that caught it,
   or MISSED with the reason: every test passed, or the run passed its time limit); at the end,
   how many were caught. Exit status 0 when every fault was caught, 1 otherwise (2: the list or
   the checkout cannot be used).

``--list`` prints the faults (name, file, what) and runs nothing; ``--only`` runs the named ones.

On a shared 2-core AMD EPYC, 2026-12-02: all 47 faults caught, each by a test it names, by the
same tests before and after the default run's slower tests moved behind markers; the sanity
run 33 s, the faults 200 s (most under 10 s; the slowest, 24 s, a property-based test shrinking
its failing example).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]

HINTED_TIMEOUT = 300            # seconds for a run of the tests a fault names
FULL_TIMEOUT = 900              # seconds for the README's whole command
SANITY_TIMEOUT = 1800           # seconds for the clean run of every named test


class Fault(NamedTuple):
    name: str               # short, kebab-case
    where: str              # the file edited, relative to the repository root
    old: str                # a snippet of that file, found there exactly once
    new: str                # what replaces it: the bug
    tests: tuple            # test files or node ids expected to catch it (looked at first)
    what: str               # the bug in words


# Test files and node ids the faults name (one place, so that a moved test is renamed once).
GRADIENTS = "tests/layers/test_gradients.py"
LAYER_GRADIENTS = GRADIENTS + "::test_layer_gradients"
SAME_LOSSES = "tests/test_same_losses.py"
COMPILED_ROWS = "tests/layers/test_compiled_rows.py"
TRANSLATOR = "tests/models/test_translator.py"
LM = "tests/models/test_lm.py"
OPTIM = "tests/test_optim.py"
CHECKPOINT = "tests/test_checkpoint.py"
ATOMIC = "tests/test_atomic_writes.py"
BEAM = "tests/test_beam.py"
BATCHING = "tests/data/test_batching.py"
CORPUS = "tests/data/test_corpus.py"
HOST_KERNELS = "tests/test_kernels.py::test_the_kernel_check_on_the_host_runs_every_kernel"
RUN_RECORD = "tests/test_run_record.py"
STOPS = "tests/test_stops.py"
EXIT_STATUSES = "tests/test_exit_statuses.py"


FAULTS: list[Fault] = [
    # ---- layers: the backward passes -------------------------------------------------------------
    Fault("linear-bias-grad-mean", "minitfm/layers/linear.py",
          'grads["b"] = dy2.sum(axis=0, out=None if out is None else out["b"])   # (d_out,)',
          'grads["b"] = dy2.mean(axis=0, out=None if out is None else out["b"])   # (d_out,)',
          (LAYER_GRADIENTS,),
          "the bias gradient averages the rows' gradients instead of summing them"),
    Fault("layernorm-term3-sign", "minitfm/layers/layernorm.py",
          "    g -= xhat * mean_gx",
          "    g += xhat * mean_gx",
          (LAYER_GRADIENTS,),
          "LayerNorm's backward adds the term through the variance instead of subtracting it"),
    Fault("layernorm-dgamma-without-xhat", "minitfm/layers/layernorm.py",
          '    dgamma = xp.einsum("ni,ni->i", dy.reshape(-1, d), xhat.reshape(-1, d))',
          "    dgamma = dy.reshape(-1, d).sum(axis=0)",
          (LAYER_GRADIENTS,),
          "the gain's gradient forgets the factor xhat: it is the shift's"),
    Fault("layernorm-loop-term2-sign", "minitfm/speed/layernorm.py",
          "dx[r, c] = (dy[r, c] * gamma[c] - mean_g - xhat[r, c] * mean_gx) * scale",
          "dx[r, c] = (dy[r, c] * gamma[c] + mean_g - xhat[r, c] * mean_gx) * scale",
          (COMPILED_ROWS,),
          "the compiled LayerNorm loop (CPU row passes) adds the mean's term instead of "
          "subtracting it"),
    Fault("softmax-backward-missing-p", "minitfm/layers/softmax.py",
          "    ds *= p                                         # dS = P * (dP - rowsum(dP * P))\n",
          "",
          (LAYER_GRADIENTS,),
          "the softmax's backward forgets to multiply by P"),
    Fault("softmax-backward-missing-scale", "minitfm/layers/softmax.py",
          "    ds *= scale                                     # fold 1/sqrt(d_k) in once",
          "    # fold 1/sqrt(d_k) in once",
          (LAYER_GRADIENTS,),
          "the scores' gradient misses the 1/sqrt(d_k) of the forward pass"),
    Fault("attention-dk-from-k", "minitfm/layers/attention.py",
          "dk = xp.matmul(ds.swapaxes(-1, -2), q, out=dk_out)",
          "dk = xp.matmul(ds.swapaxes(-1, -2), k, out=dk_out)",
          (LAYER_GRADIENTS,),
          "the keys' gradient multiplies the scores' gradient by K instead of Q"),
    Fault("attention-causal-mask-off-by-one", "minitfm/layers/attention.py",
          "future = xp.triu(xp.ones((length, length), dtype=bool), k=1)",
          "future = xp.triu(xp.ones((length, length), dtype=bool), k=2)",
          ("tests/layers/test_attention.py",
           LM + "::test_future_tokens_never_change_earlier_outputs"),
          "the causal mask lets each position see the next one"),
    Fault("attention-padding-mask-on-queries", "minitfm/layers/attention.py",
          ".astype(dtype)[:, None, None, :]",
          ".astype(dtype)[:, None, :, None]",
          (TRANSLATOR + "::test_no_attention_to_padded_source_keys",
           TRANSLATOR + "::test_appending_padding_changes_nothing"),
          "the padding mask masks the padded queries' rows instead of the padded keys"),
    Fault("feedforward-relu-at-zero", "minitfm/layers/feedforward.py",
          "    da *= cache.a > 0                               # dh = da * [h > 0], in place",
          "    da *= cache.a >= 0                              # dh = da * [h > 0], in place",
          (LAYER_GRADIENTS,),
          "the ReLU's backward lets the gradient through units that were off"),
    Fault("dropout-backward-unscaled", "minitfm/layers/dropout.py",
          "    return apply(dy, cache.keep, cache.scale), {}",
          "    return apply(dy, cache.keep, 1.0), {}",
          (LAYER_GRADIENTS,),
          "dropout's backward applies the mask without the 1 / (1 - p) scale"),
    Fault("embedding-assign-not-scatter-add", "minitfm/layers/embedding.py",
          "    backend.scatter_add(dtable, cache.ids.reshape(-1), scaled)",
          "    dtable[cache.ids.reshape(-1)] += scaled",
          (LAYER_GRADIENTS,),
          "a repeated token's embedding gradient keeps one of its rows instead of their sum"),
    Fault("positional-learned-no-batch-sum", "minitfm/layers/positional.py",
          "dy.reshape(-1, length, dy.shape[-1]).sum(axis=0)",
          "dy.reshape(-1, length, dy.shape[-1])[0]",
          ("tests/layers/test_positional.py",),
          "a learned position's gradient is the first sentence's instead of the batch's sum"),
    Fault("residual-identity-skips-layernorm", "minitfm/layers/residual.py",
          "    df, _ = dropout.backward(ds, cache.dropout)\n"
          "    dx, *rest = sublayer_backward(df, cache.sublayer)\n    dx += ds ",
          "    df, _ = dropout.backward(ds, cache.dropout)\n"
          "    dx, *rest = sublayer_backward(df, cache.sublayer)\n    dx += dy ",
          (SAME_LOSSES,),
          "post-LN's identity path passes dy through, not LayerNorm's gradient"),
    Fault("loss-smoothing-off-target-constant", "minitfm/layers/loss.py",
          "    off = smoothing / (v - 1)\n    weight",
          "    off = smoothing / v\n    weight",
          (LAYER_GRADIENTS,),
          "the backward pass spreads the smoothing over V classes, the forward over V - 1"),
    Fault("loss-target-term", "minitfm/layers/loss.py",
          "dz[xp.arange(n), targets] -= (1.0 - smoothing - off) * weight",
          "dz[xp.arange(n), targets] -= (1.0 - smoothing) * weight",
          (LAYER_GRADIENTS,),
          "the target's gradient forgets that the off-target share is subtracted there too"),

    # ---- the models ------------------------------------------------------------------------------
    Fault("translator-shared-embedding-zeroed", "minitfm/models/translator.py",
          "    if src_name != tgt_name:\n        out[src_name][...] = 0.0\n",
          "    out[src_name][...] = 0.0\n",
          (TRANSLATOR + "::test_shared_embedding_gradient_is_the_sum_of_its_three_uses",),
          "a shared embedding's gradient is reset before the source's use is added: the output "
          "projection's and the target's uses are lost"),
    Fault("output-chunks-overwrite-table-grad", "minitfm/layers/output.py",
          '            dtable += g["w"].T',
          '            dtable[...] = g["w"].T',
          (TRANSLATOR + "::test_chunked_output_layer_equals_one_chunk",),
          "the output projection's gradient keeps the last chunk of rows' instead of adding "
          "every chunk's"),
    Fault("lm-input-embedding-grad-dropped", "minitfm/models/lm.py",
          "    inputs.backward(dx, cache.embed, _inputs(out))",
          "    inputs.backward(dx, cache.embed)",
          (SAME_LOSSES,),
          "the language model's input embedding gradient is computed and dropped: only the "
          "output projection's use reaches the tied table"),

    # ---- Adam and the learning-rate schedule -----------------------------------------------------
    Fault("adam-no-first-moment-correction", "minitfm/optim.py",
          "        return (beta1, beta2, float(lr) / (1.0 - beta1 ** step),",
          "        return (beta1, beta2, float(lr),",
          (OPTIM,),
          "Adam's step size leaves out the first moment's bias correction"),
    Fault("adam-second-correction-beta1", "minitfm/optim.py",
          "1.0 / math.sqrt(1.0 - beta2 ** step), keep)",
          "1.0 / math.sqrt(1.0 - beta1 ** step), keep)",
          (OPTIM,),
          "the second moment's bias correction uses beta1"),
    Fault("noam-warmup-exponent", "minitfm/optim.py",
          "min(step ** -0.5, step * self.warmup ** -1.5)",
          "min(step ** -0.5, step * self.warmup ** -0.5)",
          (OPTIM,),
          "the paper's schedule warms up with warmup^-0.5 instead of warmup^-1.5"),
    Fault("warmup-off-by-one", "minitfm/optim.py",
          "return self.peak_lr * (step / self.warmup)     # exactly",
          "return self.peak_lr * ((step - 1) / self.warmup)     # exactly",
          (OPTIM,),
          "the linear warm-up starts at 0 and peaks one step late"),

    # ---- checkpoints and atomic writes -----------------------------------------------------------
    Fault("checkpoint-second-moment-from-first", "minitfm/checkpoint.py",
          '"v": _read_group(archive, "adam_v", names, path)}',
          '"v": _read_group(archive, "adam_m", names, path)}',
          (CHECKPOINT + "::test_round_trip",),
          "loading a checkpoint fills Adam's second moment with the first"),
    Fault("keep-last-off-by-one", "minitfm/checkpoint.py",
          "list_checkpoints(directory)[:-k]",
          "list_checkpoints(directory)[:-(k + 1)]",
          (CHECKPOINT,),
          "rotation keeps one checkpoint more than asked"),
    Fault("write-in-place", "minitfm/files.py",
          "    tmp = temporary_beside(path)\n    try:\n        try:\n"
          "            os.makedirs(directory, exist_ok=True)\n            yield tmp\n",
          "    tmp = os.fspath(path)\n    try:\n        try:\n"
          "            os.makedirs(directory, exist_ok=True)\n            yield tmp\n",
          (ATOMIC,),
          "a whole-file write goes straight to the destination: not atomic, and a failed write "
          "destroys the earlier file"),
    Fault("write-without-fsync", "minitfm/files.py",
          '            with open(tmp, "rb+") as f:\n                os.fsync(f.fileno())\n'
          "            os.replace(tmp, path)\n",
          "            os.replace(tmp, path)\n",
          (ATOMIC,),
          "a whole-file write is renamed into place without its data reaching the disk first"),

    # ---- beam search -----------------------------------------------------------------------------
    Fault("beam-penalty-without-eos", "minitfm/decoding/beam.py",
          "(prefixes[parent] + tail, score / self.lp[t + 1])",
          "(prefixes[parent] + tail, score / self.lp[t])",
          (BEAM,),
          "a finished hypothesis's length penalty leaves out its final EOS"),
    Fault("beam-first-k-one-late", "minitfm/decoding/beam.py",
          "        elif len(self.hyps[s]) >= k:",
          "        elif len(self.hyps[s]) > k:",
          (BEAM,),
          "the first-k rule stops a sentence after K + 1 finished hypotheses"),
    Fault("beam-results-worst-first", "minitfm/decoding/beam.py",
          "sorted(self.hyps[s], key=lambda h: -h[1])",
          "sorted(self.hyps[s], key=lambda h: h[1])",
          (BEAM,),
          "the finished hypotheses are returned worst first"),

    # ---- batching and padding --------------------------------------------------------------------
    Fault("batching-target-size-without-bos", "minitfm/data/batching.py",
          "src_size, tgt_size = src_lengths + 1, tgt_lengths + 2",
          "src_size, tgt_size = src_lengths + 1, tgt_lengths + 1",
          (BATCHING,),
          "token batches count a target row without its BOS: batches can exceed max_tokens"),
    Fault("collate-eos-over-last-token", "minitfm/data/batching.py",
          "    tgt[rows, tgt_len + 1] = EOS_ID",
          "    tgt[rows, tgt_len] = EOS_ID",
          (BATCHING + "::test_eval_batches_keep_order_and_cover_everything",),
          "the target's EOS overwrites its last token"),
    Fault("collate-truncates-one-past", "minitfm/data/batching.py",
          "        src_len = np.minimum(src_len, max_positions - 1)",
          "        src_len = np.minimum(src_len, max_positions)",
          (BATCHING + "::test_eval_batches_truncate_over_long_sentences",),
          "an evaluation batch cuts a long source to max_positions tokens, and with its EOS it "
          "is one position longer than the model reads"),

    # ---- the data reader -------------------------------------------------------------------------
    Fault("reader-keeps-carriage-return", "minitfm/data/reading.py",
          '            yield line.rstrip(b"\\n").rstrip(b"\\r")',
          '            yield line.rstrip(b"\\n")',
          (CORPUS,),
          "lines ending in CR LF keep their CR"),
    Fault("reader-shortens-misaligned-corpus", "minitfm/data/corpus.py",
          "for src_raw, tgt_raw in zip_longest(stream_lines(src, self.src_path),",
          "for src_raw, tgt_raw in zip(stream_lines(src, self.src_path),",
          (CORPUS,),
          "a corpus whose sides differ in length is silently cut to the shorter side"),
    Fault("reader-loses-first-bytes", "minitfm/data/reading.py",
          "        super().__init__(_Replayed(head, stream, ended=len(head) < HEAD_BYTES))",
          "        super().__init__(stream)",
          (CORPUS,),
          "the first bytes read to look for gzip's magic number are lost from the text"),

    # ---- the CUDA kernels, executed on the CPU ---------------------------------------------------
    Fault("kernel-block-sum-barrier-removed", "minitfm/speed/fused.py",
          "    __syncthreads();                                  // scratch is free again\n",
          "",
          (HOST_KERNELS,),
          "block_sum writes its scratch while other threads still read the last sum: a race"),
    Fault("kernel-block-sum-step-skipped", "minitfm/speed/fused.py",
          "__device__ float block_sum(float v, float* scratch) {\n"
          "    for (int o = 16; o > 0; o >>= 1)",
          "__device__ float block_sum(float v, float* scratch) {\n"
          "    for (int o = 16; o > 1; o >>= 1)",
          (HOST_KERNELS,),
          "block_sum's warp reduction skips its last step: pairs of lanes are never added"),
    Fault("kernel-layernorm-param-grads-lane", "minitfm/speed/layernorm.py",
          "for (int k = 1; k < 8; ++k) { a += sg[k][threadIdx.x]; b += sb[k][threadIdx.x]; }",
          "for (int k = 1; k < 7; ++k) { a += sg[k][threadIdx.x]; b += sb[k][threadIdx.x]; }",
          (HOST_KERNELS,),
          "LayerNorm's parameter gradient kernel leaves out the last group of rows' sums"),
    Fault("kernel-dropout-threshold-inverted", "minitfm/speed/dropout.py",
          "        bool kept = u[j] >= threshold;",
          "        bool kept = u[j] < threshold;",
          (HOST_KERNELS,),
          "the dropout kernel keeps the elements it should drop"),
    Fault("kernel-adam-second-moment", "minitfm/speed/optim.py",
          "vi = v[i] * b2 + gi * gi * c2;",
          "vi = v[i] * b2 + gi * c2;",
          (HOST_KERNELS,),
          "the Adam kernel's second moment adds g instead of g squared"),

    # ---- the run record (run.json) ---------------------------------------------------------------
    Fault("record-resume-index-off-by-one", "minitfm/training/record.py",
          '            self._session = len(record["resumes"]) - 1',
          '            self._session = len(record["resumes"])',
          (RUN_RECORD + "::test_resumes_are_appended_and_the_start_is_kept",),
          "a resumed session's outcome is never recorded: it looks one entry past the last"),
    Fault("record-ended-sessions-marked-killed", "minitfm/training/record.py",
          '            if earlier.get("outcome") == RUNNING:',
          '            if earlier.get("outcome") != "finished":',
          (RUN_RECORD + "::test_a_stopped_and_a_killed_session_are_recorded",),
          "a resume marks every earlier session that did not finish as killed, also one a "
          "signal stopped"),
    Fault("record-last-checkpoint-full-path", "minitfm/training/record.py",
          '"last_checkpoint": last_checkpoint\n'
          '                            and os.path.basename(last_checkpoint)',
          '"last_checkpoint": last_checkpoint',
          (RUN_RECORD + "::test_resumes_are_appended_and_the_start_is_kept",),
          "a session's last checkpoint is recorded with the path it was given, not its name in "
          "the run directory"),

    # ---- signals ---------------------------------------------------------------------------------
    Fault("signal-exit-status-without-128", "minitfm/cli/runs.py",
          "    return 128 + signum\n",
          "    return signum\n",
          (EXIT_STATUSES + "::test_train_toy_signal",),
          "a run stopped by a signal exits with the signal's number instead of 128 + it"),
    Fault("signal-taken-as-ctrl-c", "minitfm/training/stops.py",
          "self.signum = signal.SIGHUP if signum == hangup_signal() else signum",
          "self.signum = signal.SIGHUP if signum == hangup_signal() else signal.SIGINT",
          (STOPS,),
          "every stop signal is recorded as SIGINT: a SIGTERM is reported, and exits, as Ctrl-C"),
    Fault("signal-stop-saves-only-what-was-saved", "minitfm/training/run.py",
          "if self.run_dir and state.last_checkpoint != self.run_dir.checkpoint_path(state.step):",
          "if self.run_dir and state.last_checkpoint == self.run_dir.checkpoint_path(state.step):",
          ("tests/test_faults.py::test_ctrl_c_arriving_during_the_save_waits_for_it",),
          "a run stopped by a signal saves a checkpoint only where it had saved that step already"),
]


class FaultError(Exception):
    """A fault that cannot be planted, or a checkout the faults cannot be run on."""


# ---- the copy ------------------------------------------------------------------------------------

def listed_files(repo: Path) -> list[str]:
    """The files git lists in ``repo``: tracked, and untracked ones that git does not ignore."""
    done = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others",
                           "--exclude-standard"], capture_output=True)
    if done.returncode != 0:
        raise FaultError(f"{repo} is not a git checkout: {done.stderr.decode().strip()}")
    return sorted({name for name in done.stdout.decode().split("\0") if name})


def copy_checkout(repo: Path, copy: Path) -> int:
    """Copy the files of ``repo`` git lists into ``copy``, with their folders; return how many.
    A tracked file deleted from the work tree is left out."""
    count = 0
    for name in listed_files(repo):
        source = repo / name
        if not os.path.lexists(source) or source.is_dir():
            continue
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
        count += 1
    return count


def check_faults(faults: list[Fault], root: Path) -> None:
    """Refuse the list unless each fault's ``old`` occurs exactly once in its file under ``root``
    and differs from its ``new``."""
    problems = []
    for fault in faults:
        path = root / fault.where
        if not path.is_file():
            problems.append(f"{fault.name}: {fault.where} does not exist")
            continue
        found = path.read_text(encoding="utf-8").count(fault.old)
        if found != 1:
            problems.append(f"{fault.name}: its snippet occurs {found} times in {fault.where}, "
                            f"not once")
        if fault.new == fault.old:
            problems.append(f"{fault.name}: its new text is its old text")
    if problems:
        raise FaultError("faults that cannot be planted:\n  " + "\n  ".join(problems))


class Planted:
    """The fault's edit in the copy while the block runs; afterwards the file's bytes and times
    as they were. The edited file gets a time of its own (``stamp``: a count of the faults
    planted so far), so that no cache keyed by a file's time and size (Python's bytecode, Numba's
    compiled loops) takes one edit's code for another's or for the original's."""

    def __init__(self, root: Path, fault: Fault, stamp: int) -> None:
        self.path, self.fault, self.stamp = root / fault.where, fault, stamp

    def __enter__(self) -> Planted:
        self.original = self.path.read_bytes()
        self.times = os.stat(self.path)
        old, new = self.fault.old.encode("utf-8"), self.fault.new.encode("utf-8")
        self.path.write_bytes(self.original.replace(old, new, 1))
        later = self.times.st_mtime_ns + self.stamp * 1_000_000_000
        os.utime(self.path, ns=(later, later))
        return self

    def __exit__(self, *exc_info) -> None:
        self.path.write_bytes(self.original)
        os.utime(self.path, ns=(self.times.st_atime_ns, self.times.st_mtime_ns))


# ---- pytest --------------------------------------------------------------------------------------

class Outcome(NamedTuple):
    status: int | None      # pytest's exit status; None when it ran out of time
    catcher: str | None     # the first failing test of the summary
    output: str             # the end of pytest's output


def pytest_env(copy: Path) -> dict:
    """The environment of every pytest run: this process's, the copy first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy)] + [p for p in env.get(
        "PYTHONPATH", "").split(os.pathsep) if p])
    return env


# a line of the summary: "FAILED <node id> - <message>" (a node id may hold spaces: a test's
# parameters), or "ERROR <node id>" for an error while collecting or in a fixture
FAILURE_LINE = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)


def run_pytest(copy: Path, args: list[str], timeout: float) -> Outcome:
    """``python -m pytest -p no:cacheprovider ARGS`` in ``copy``. Its process group is ended if
    it runs past ``timeout`` seconds (the pytest-xdist workers and the commands the tests start
    with it)."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    process = subprocess.Popen(command, cwd=copy, env=pytest_env(copy), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        try:                        # what it wrote (a process of its own may hold the pipe)
            output, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            output = ""
        return Outcome(None, None, output[-3000:])
    except BaseException:           # Ctrl-C: a new session does not get it from the terminal
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    summary = output.rfind("short test summary info")     # the failures' lines follow it
    found = FAILURE_LINE.search(output, max(summary, 0))
    return Outcome(process.returncode, found.group(1) if found else None, output[-3000:])


def caught(outcome: Outcome) -> bool:
    """Whether a run failed a test: pytest's status 1 (tests failed) or 2 (stopped: an error
    while collecting), with a failing test named."""
    return outcome.status in (1, 2) and outcome.catcher is not None


def hinted_tests(faults: list[Fault]) -> list[str]:
    """The tests the faults name, each once, in order."""
    return list(dict.fromkeys(test for fault in faults for test in fault.tests))


def named_test_found(root: Path, test: str) -> bool:
    """Whether the test file of ``test`` (a file, or a node id ``file::name[parameters]``) is in
    the checkout at ``root``, with a function of that name where one is named."""
    path, _, name = test.partition("::")
    if not (root / path).is_file():
        return False
    name = name.split("::")[-1].split("[")[0]
    return not name or f"def {name}(" in (root / path).read_text(encoding="utf-8")


def with_tests_found(root: Path, faults: list[Fault]) -> tuple[list[Fault], list[str]]:
    """The faults with only those of their named tests that the checkout at ``root`` has (a
    checkout whose tests moved: a fault left with none goes to the whole run at once), and the
    tests not found."""
    missing = [test for test in hinted_tests(faults) if not named_test_found(root, test)]
    return [fault._replace(tests=tuple(t for t in fault.tests if t not in missing))
            for fault in faults], missing


def sanity_run(copy: Path, faults: list[Fault]) -> float:
    """Run the faults' tests together on the clean copy; raise FaultError unless they pass and the
    copy's package is the one imported. Return the seconds taken."""
    where = subprocess.run([sys.executable, "-c", "import minitfm; print(minitfm.__file__)"],
                           cwd=copy, env=pytest_env(copy), capture_output=True, text=True)
    if not where.stdout.strip().startswith(str(copy)):
        raise FaultError(f"the copy's minitfm is not the one imported: {where.stdout.strip()} "
                         f"{where.stderr.strip()}")
    started, tests = time.perf_counter(), hinted_tests(faults)
    if not tests:
        return 0.0
    outcome = run_pytest(copy, ["-n", "0", "-q", *tests], SANITY_TIMEOUT)
    if outcome.status != 0:
        what = ("ran past its time limit" if outcome.status is None
                else f"failed (pytest status {outcome.status}, first failure: {outcome.catcher})")
        raise FaultError(f"the faults' tests on the clean copy {what}: a fault caught by a test "
                         f"that fails anyway proves nothing.\n{outcome.output}")
    return time.perf_counter() - started


def try_fault(copy: Path, fault: Fault, stamp: int, full: bool) -> tuple[bool, str]:
    """Plant ``fault`` in the copy and run the tests; return (caught, what to print)."""
    whole_run = "" if full or fault.tests else " (in the whole run: its tests are not here)"
    with Planted(copy, fault, stamp):
        if not full and fault.tests:
            outcome = run_pytest(copy, ["-x", "-q", "-rfE", "-n", "0", *fault.tests],
                                 HINTED_TIMEOUT)
            if caught(outcome):
                return True, f"caught by {outcome.catcher}"
            whole_run = (f" (in the whole run: the named tests ran past {HINTED_TIMEOUT} s)"
                         if outcome.status is None else
                         f" (in the whole run: the named tests ended with status "
                         f"{outcome.status})")
        outcome = run_pytest(copy, ["-x", "-q", "-rfE"], FULL_TIMEOUT)
    if caught(outcome):
        return True, f"caught by {outcome.catcher}{whole_run}"
    if outcome.status is None:
        return False, f"MISSED: the whole run passed its limit of {FULL_TIMEOUT} s"
    if outcome.status == 0:
        return False, "MISSED: every test passed"
    return False, f"MISSED: pytest ended with status {outcome.status} naming no failing test"


# ---- the command ---------------------------------------------------------------------------------

def chosen(names: list[str] | None) -> list[Fault]:
    """The faults named (all without names); an unknown name is an error listing the known."""
    if not names:
        return list(FAULTS)
    known = {fault.name: fault for fault in FAULTS}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise FaultError(f"unknown fault {', '.join(unknown)}; the faults are: "
                         + ", ".join(known))
    return [known[name] for name in dict.fromkeys(names)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT,
                        help="the checkout to plant the faults in (default: this one)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these faults only")
    parser.add_argument("--list", action="store_true", help="list the faults and run nothing")
    parser.add_argument("--full", action="store_true",
                        help="run the whole suite for every fault, not the named tests first")
    args = parser.parse_args(argv)
    try:
        faults = chosen(args.only)
        if args.list:
            width = max(len(fault.name) for fault in faults)
            for fault in faults:
                print(f"{fault.name:<{width}}  {fault.where}: {fault.what}")
            return 0
        repo = args.repo.resolve()
        check_faults(faults, repo)
        with tempfile.TemporaryDirectory(prefix="planted-faults-") as folder:
            copy = Path(folder) / "repo"
            files = copy_checkout(repo, copy)
            print(f"{files} files of {repo} copied; {len(faults)} faults", flush=True)
            faults, missing = with_tests_found(copy, faults)
            if missing:
                print(f"{len(missing)} of the tests the faults name are not in this checkout: "
                      f"{', '.join(missing)}", flush=True)
            seconds = sanity_run(copy, faults)
            print(f"the faults' tests pass on the clean copy ({seconds:.0f} s)", flush=True)
            started, missed = time.perf_counter(), []
            width = max(len(fault.name) for fault in faults)
            for stamp, fault in enumerate(faults, start=1):
                began = time.perf_counter()
                found, said = try_fault(copy, fault, stamp, args.full)
                if not found:
                    missed.append(fault.name)
                print(f"{fault.name:<{width}}  {time.perf_counter() - began:6.1f} s  {said}",
                      flush=True)
            total = time.perf_counter() - started
    except FaultError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(faults) - len(missed)} of {len(faults)} faults caught in {total:.0f} s"
          + (f"; missed: {', '.join(missed)}" if missed else ""))
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
