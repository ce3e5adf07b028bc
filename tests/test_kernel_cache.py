"""The cache of the kernels compiled for the CPU (``MINITFM_CACHE``), through the real command
line, ``python -m minitfm.kernelcheck --host``: two processes fill one cache together; an entry
that does not load (truncated, or another entry's), the kernels' runtime library's too, is
compiled again, said once, and the cache is whole after; a full disk names the cache's folder
and how to move it, with status 1 (and does not matter where every kernel is already kept); a
compiler that fails is named with the variable that chose it. And through the workshop's kernel
check, ``python -m minitfm.learn check``: a compiler that is not there or does not work is a
setting, status 2; a file where the cache's folder should be moves the cache to the system's
temporary folder, said once.

Each command runs the cases ``dropout`` and ``loss`` alone: three small kernels to compile.

And the project's other caches, the same way: Numba's cache of the row passes' compiled loops,
through ``train_toy.py``, and ``train_wmt.py``'s token cache: an entry that does not load is
made again, said once.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minitfm.data import EncodedCorpus
from minitfm.learn.exercises import by_name
from tests.learn.conftest import write_exercise
from tests.conftest import default_kernels
from tests.test_train_wmt import TINY, corpus, corpus_args  # noqa: F401  (a fixture)
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
ENV = {k: v for k, v in os.environ.items() if k not in ("MINITFM_CXX", "CXX")}
ENV["PYTHONPATH"] = str(ROOT)
CHECK = ["-m", "minitfm.kernelcheck", "--host", "--case", "dropout", "--case", "loss"]
ENTRIES = 3         # dropout_forward, dropout_backward, smoothed_loss: one library each
LIBRARIES = ENTRIES + 1     # and the runtime library they are linked to


def check(cache: Path, *wrapper, env=None) -> subprocess.Popen:
    """The kernel check on the cache ``cache``, started (``wrapper``: a script run first)."""
    return forkserver.Popen([sys.executable, *map(str, wrapper), *CHECK], cwd=ROOT, text=True,
                            env={**ENV, **(env or {}), "MINITFM_CACHE": str(cache)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


def contents(cache: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((cache / "cudahost").iterdir())}


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> tuple[Path, list]:
    """A cache that two kernel checks started at once filled, and what each of them did."""
    cache = tmp_path_factory.mktemp("kernels") / "cache"
    started = [check(cache), check(cache)]
    return cache, [finish(p) for p in started]


def test_two_processes_fill_one_cache_together(filled):
    cache, done = filled
    for status, out, err in done:
        assert status == 0 and err == "" and f"{ENTRIES + 2} passed, 0 failed" in out, out + err
    names = sorted(contents(cache))
    assert [n for n in names if n.endswith(".so")] == sorted(
        n.replace(".lock", ".so") for n in names if n.endswith(".lock"))
    assert len(names) == 2 * LIBRARIES, names       # each library and its lock, no temporaries
    assert len([n for n in names if n.startswith("runtime-") and n.endswith(".so")]) == 1


def test_an_entry_that_does_not_load_is_compiled_again_and_said_once(filled, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(filled[0], cache)
    [runtime] = (cache / "cudahost").glob("runtime-*.so")
    first, second, third = sorted(set((cache / "cudahost").glob("*.so")) - {runtime})
    first.write_bytes(first.read_bytes()[:-4000])                   # truncated
    swapped = second.read_bytes()
    second.write_bytes(third.read_bytes())                          # another entry's library
    third.write_bytes(swapped)
    runtime.write_bytes(runtime.read_bytes()[:-4000])
    status, out, err = finish(check(cache))
    assert status == 0 and "0 failed" in out, out + err
    lines = err.splitlines()
    assert lines[0] == (f"warning: the compiled host runtime of the kernels {runtime} does not "
                        f"load (it is not this kernel's library whole: truncated, damaged, or "
                        f"another kernel's): compiling it again"), err
    assert sorted(lines[1:]) == sorted(
        f"warning: the compiled kernel {path} does not load (it is not this kernel's library "
        f"whole: truncated, damaged, or another kernel's): compiling it again"
        for path in (first, second, third)), err
    assert contents(cache).keys() == contents(filled[0]).keys()     # no temporaries left
    status, out, err = finish(check(cache))
    assert (status, err) == (0, ""), out + err                      # said once


def test_a_full_disk_names_the_cache_and_how_to_move_it(filled, tmp_path):
    """Nothing kept yet: status 1, the folder named; every kernel kept: no write is needed."""
    cache = tmp_path / "cache"
    status, out, err = finish(check(cache, ROOT / "tests" / "failing_disk.py", "--full", cache,
                                    "--"))
    assert status == 1, out + err
    assert err.startswith(f"error: {cache / 'cudahost'}: the compiled kernels cannot be kept "
                          f"there: No space left on device") and err.count("\n") == 1, err
    assert "make room there, or move the cache elsewhere with MINITFM_CACHE=DIR" in err
    assert not cache.exists()
    shutil.copytree(filled[0], cache)
    status, out, err = finish(check(cache, ROOT / "tests" / "failing_disk.py", "--full", cache,
                                    "--"))
    assert (status, err) == (0, ""), out + err


LINKER_FULL = "#!/bin/sh\necho '/usr/bin/ld: final link failed: No space left on device' >&2\n" \
              "exit 1\n"


@pytest.mark.parametrize("variable, compiler, status, said", [
    ("MINITFM_CXX", "false", 2, "error: the C++ compiler false (named by MINITFM_CXX) does "
     "not work: it failed with status 1 and printed nothing, naming no line of the kernel's "
     "source; set MINITFM_CXX to a C++ compiler that works (g++, clang++, or `python -m ziglang "
     "c++`), or unset it to use CXX or the machine's\n"),
    ("CXX", "false", 2, "error: the C++ compiler false (named by CXX) does not work: it failed "
     "with status 1 and printed nothing, naming no line of the kernel's source; set CXX, or "
     "MINITFM_CXX (which comes first), to a C++ compiler that works"),
    ("MINITFM_CXX", LINKER_FULL, 1, "error: {cache}: the compiled kernels cannot be kept there: "
     "No space left on device ("),
], ids=["MINITFM_CXX", "CXX", "a linker finding the disk full"])
def test_a_compiler_that_fails_is_named_with_the_variable_that_chose_it(variable, compiler,
                                                                        status, said, tmp_path):
    if "\n" in compiler:                    # a compiler whose linker finds the disk full
        script = tmp_path / "c++"
        script.write_text(compiler)
        script.chmod(0o755)
        compiler = str(script)
    cache = tmp_path / "cache"
    done, out, err = finish(check(cache, env={variable: compiler}))
    assert done == status and err.count("\n") == 1, out + err
    assert err.startswith(said.format(cache=cache / "cudahost")), err
    assert "Traceback" not in err and not list((cache / "cudahost").glob("*.so"))


def learn_check(tmp_path: Path, env: dict) -> tuple[int, str, str]:
    """The workshop's check of kernel_dropout, written as the library writes it, under ``env``."""
    folder = tmp_path / "workshop"
    write_exercise(folder, by_name("kernel_dropout"))
    done = forkserver.run([sys.executable, "-m", "minitfm.learn", "--dir", str(folder), "check",
                           "kernel_dropout"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**ENV, **env})
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("env, said", [
    ({"MINITFM_CXX": "nosuchcxx"}, "error: the C++ compiler nosuchcxx (named by MINITFM_CXX) "
     "cannot run: there is no program nosuchcxx on the PATH; set MINITFM_CXX to a C++ compiler "
     "that works (g++, clang++, or `python -m ziglang c++`), or unset it to use CXX or the "
     "machine's\n"),
    ({"CXX": "false"}, "error: the C++ compiler false (named by CXX) does not work: it failed "
     "with status 1 and printed nothing, naming no line of the kernel's source; set CXX, or "
     "MINITFM_CXX (which comes first), to a C++ compiler that works"),
    ({"MINITFM_CXX": 'g++ "'}, "error: MINITFM_CXX='g++ \"' is not a command line (No closing "
     "quotation): set MINITFM_CXX to a C++ compiler that works"),
], ids=["not there", "does not work", "not a command line"])
def test_a_compiler_at_fault_is_a_setting_in_the_workshop(env, said, tmp_path):
    """Status 2, one error line, as kernelcheck gives: never a verdict on the learner's kernel
    (the program not found is said before the kernel's process starts; a compiler that fails
    there, by that process)."""
    status, out, err = learn_check(tmp_path, {**env, "MINITFM_CACHE": str(tmp_path / "cache")})
    assert status == 2 and err.startswith(said) and err.count("\n") == 1, out + err
    assert "kernel_dropout" not in out and "Traceback" not in err


@pytest.mark.parametrize("where", ["MINITFM_CACHE", "MINITFM_CACHE/cudahost"])
def test_a_file_in_place_of_the_cache_folder_moves_the_cache_said_once(where, tmp_path):
    if where == "MINITFM_CACHE":
        cache = blocker = tmp_path / "afile"
    else:
        cache, blocker = tmp_path / "cache", tmp_path / "cache" / "cudahost"
        cache.mkdir()
    blocker.write_text("mine\n")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    moved = temporary / f"minitfm-cudahost-{os.getuid()}"
    status, out, err = learn_check(tmp_path, {"MINITFM_CACHE": str(cache),
                                              "TMPDIR": str(temporary)})
    assert status == 0 and "kernel_dropout passes" in out, out + err
    assert err == (f"warning: the compiled kernels cannot be kept in {cache / 'cudahost'}: "
                   f"{blocker} is a file, not a folder; they are kept in {moved} for now (move "
                   f"it away, or set MINITFM_CACHE to a folder)\n"), err
    assert list(moved.glob("*.so")) and blocker.read_text() == "mine\n"


# ---- Numba's cache of the row passes' compiled loops ---------------------------------------------

TOY = ["--task", "copy", "--length", "5", "--vocab", "5", "--batch-size", "8", "--preset", "tiny",
       "--eval-size", "10", "--examples", "0", "--quiet", "--max-steps", "2"]


@pytest.mark.slow
def test_a_compiled_loop_that_does_not_load_is_compiled_again_and_said_once(tmp_path):
    """train_toy.py with its default kernels (the row passes' compiled loops, kept by Numba in
    NUMBA_CACHE_DIR): two loops' entries swapped, a truncated entry and a truncated index are
    compiled again, each said once; the next run finds them whole."""
    env = {**default_kernels(ENV), "MINITFM_BACKEND": "numpy",
           "NUMBA_CACHE_DIR": str(tmp_path / "numba")}

    def train(run: str) -> str:
        done = forkserver.run([sys.executable, "train_toy.py", *TOY, "--out", tmp_path / run],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stderr

    assert train("first") == ""
    (folder,) = (tmp_path / "numba").iterdir()
    loops = ["layernorm.forward_loop", "softmax.normalize_loop", "loss.finish_loop",
             "residual.add_dropped_loop"]
    first, second, third = (next(folder.glob(f"{loop}-*.1.nbc")) for loop in loops[:3])
    index = next(folder.glob(f"{loops[3]}-*.nbi"))
    swapped = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(swapped)
    for truncated in (third, index):
        truncated.write_bytes(truncated.read_bytes()[:30])
    said = train("second").splitlines()
    assert sorted(said) == sorted(
        f"warning: the compiled loop minitfm.speed.{loop} kept in {folder} does not load ("
        + why + "): compiling it again" for loop, why in zip(loops, [
            "it holds another loop's code, minitfm.speed.softmax.normalize_loop's",
            "it holds another loop's code, minitfm.speed.layernorm.forward_loop's",
            "UnpicklingError: pickle data was truncated",
            "UnpicklingError: pickle data was truncated"])), said
    assert train("third") == ""


# ---- train_wmt.py's token cache -----------------------------------------------------------------

def test_a_token_array_that_does_not_load_is_encoded_again(corpus, tmp_path):  # noqa: F811
    """A cached token array cut short, its manifest whole: the next run encodes the corpus
    again, saying so on one line, and leaves the cache whole."""
    data = tmp_path / "data"

    def train(run: str) -> str:
        done = forkserver.run([sys.executable, "train_wmt.py", *corpus_args(corpus), *TINY,
                               "--max-steps", "1", "--data-dir", data, "--out", tmp_path / run],
                              cwd=ROOT, env={**ENV, "MINITFM_BACKEND": "numpy"},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stderr

    assert train("first") == ""
    [tokens] = data.glob("encoded-*/train/train.en-de.en.tokens.npy")
    tokens.write_bytes(tokens.read_bytes()[:200])
    said = train("second")
    assert said.startswith(f"warning: the token cache train.en-de in {tokens.parent} is "
                           f"incomplete: {tokens}: cannot load cached array (") and said.endswith(
        "); encoding it again\n") and said.count("\n") == 1, said
    assert len(EncodedCorpus.load(tokens.parent, "train.en-de")) == 300     # whole again


def test_a_text_token_array_cut_short_or_of_another_text_is_encoded_again(tmp_path):
    """train_lm.py's token cache (--cache-dir): an array cut short, or another text's array of
    another length under a whole manifest, is encoded again, said on one line; the run goes on
    with the text's own tokens."""
    text, cache = tmp_path / "input.txt", tmp_path / "cache"
    text.write_text("the quick brown fox jumps over the lazy dog.\n" * 60, encoding="utf-8")

    def train(run: str) -> str:
        done = forkserver.run([sys.executable, "train_lm.py", "--data", text, "--cache-dir", cache,
                               "--max-steps", "2", "--warmup", "1", "--out", tmp_path / run],
                              cwd=ROOT, env={**ENV, "MINITFM_BACKEND": "numpy"},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return [line for line in done.stderr.splitlines() if "token cache" in line]

    assert train("first") == []
    [tokens] = cache.glob("*.tokens.npy")
    whole = tokens.read_bytes()
    ids = np.load(io.BytesIO(whole))
    for damage in ("cut", "shorter"):
        if damage == "cut":                             # cut short inside the .npy header
            tokens.write_bytes(whole[:100])
        else:                                           # a whole array of another length
            np.save(tokens, ids[:-32])
        [said] = train(damage)
        assert said.startswith(f"warning: the token cache {tokens} is incomplete: ") \
            and said.endswith(f"; encoding {text} again"), said
        assert tokens.read_bytes() == whole
