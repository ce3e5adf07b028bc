"""The one check every checkpoint passes before a command uses it (minitfm.usable), through the
real command lines: resuming (train_toy.py, train_lm.py, train_wmt.py), translating, sampling,
averaging, exporting and scoring (train_wmt.py --eval-only).

The bad checkpoints are good ones rewritten: a NaN in a parameter, a float16 parameter that
overflowed to Inf, a renamed parameter, the kind of another model. Every command refuses each of
them with its bad-input status, one ``error:`` line naming the file, the first offending array
and the newest checkpoint of its directory that passes the check, no traceback, and every file
byte-for-byte as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minitfm import checkpoint, usable
from minitfm.models import lm, translator
from minitfm.usable import UnusableCheckpoint
from tests.test_train_wmt import sentence_pairs, write_split
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}
BAD_INPUT = 2                 # the exit status of bad input (a checkpoint that fails the check)
TOY = ["--task", "copy", "--length", "5", "--vocab", "5", "--batch-size", "8", "--preset",
       "tiny", "--eval-size", "10", "--quiet"]
LM = ["--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--block-size", "16",
      "--batch-size", "4", "--warmup", "2", "--quiet", "--samples", "0", "--eval-blocks", "4"]
WMT = ["--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--vocab-size", "64",
       "--max-tokens", "256", "--warmup", "10", "--backend", "numpy", "--quiet",
       "--source-lang", "en", "--target-lang", "de"]


# ---- bad checkpoints, rewritten from good ones ------------------------------------------------

def rewrite(good: Path, out: Path, fault: str, name: str | None = None) -> str | None:
    """Write ``good`` with ``fault`` to ``out`` (bypassing checkpoint.save, which refuses to write
    non-finite values); return the offending array's name as the message gives it."""
    with np.load(good, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    meta = json.loads(arrays["meta"].tobytes().decode("utf-8"))
    name = name or meta["param_names"][-1]
    key = f"param/{name}"
    if fault == "nan":
        value = arrays[key].copy()
        value.flat[0] = np.nan
        arrays[key] = value
    elif fault == "float16":                      # a value past float16's 65504: Inf
        value = arrays[key].astype(np.float64)
        value.flat[0] = 1e5
        with np.errstate(over="ignore"):
            arrays[key] = value.astype(np.float16)
    elif fault == "renamed":
        names = meta["param_names"]
        names[names.index(name)] = name + "_renamed"
        for group in ("param", "adam_m", "adam_v"):
            if f"{group}/{name}" in arrays:
                arrays[f"{group}/{name}_renamed"] = arrays.pop(f"{group}/{name}")
    elif fault == "kind":
        meta["kind"] = lm.KIND if meta.get("kind", translator.KIND) == translator.KIND \
            else translator.KIND
        name = None
    elif fault == "adam":                         # the optimizer state only
        value = arrays[f"adam_v/{name}"].copy()
        value.flat[0] = np.inf
        arrays[f"adam_v/{name}"] = value
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    with open(out, "wb") as f:
        np.savez(f, **arrays)
    if fault == "adam":
        return f"Adam's second moment of {name!r}"
    return f"parameter {name!r}" if name else None     # the kind: no array to name


FAULTS = ["nan", "float16", "renamed", "kind"]
WHAT = {"nan": ["holds NaN or Inf"], "float16": ["is float16"], "renamed": ["is missing"],
        "adam": ["holds NaN or Inf"],
        # a command that needs one kind names it; one that takes any (average, export) finds
        # that the config is not one of the kind the file claims
        "kind": ["but this needs", "is not a valid config of"]}


def snapshot(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def command(*argv, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, *map(str, argv)], input=stdin, capture_output=True,
                          env=ENV, cwd=ROOT, timeout=300)


def assert_refused(done: subprocess.CompletedProcess, bad: Path, array: str | None, fault: str,
                   good: Path | None, status: int = BAD_INPUT) -> str:
    err = done.stderr.decode()
    assert done.returncode == status, err
    assert "Traceback" not in err and err.count("error:") == 1, err
    assert f"checkpoint {bad} cannot be used" in err and (array is None or array in err)
    assert any(what in err for what in WHAT[fault]), err
    if good is None:
        assert f"No checkpoint of {bad.parent} passes the check" in err
    else:
        assert f"passes the check is {good}" in err
    return err


# ---- the check itself ---------------------------------------------------------------------------

@pytest.mark.parametrize("fault", FAULTS + ["adam"])
def test_the_check_names_the_first_offending_array(tmp_path, fault):
    good = tmp_path / "checkpoint_00000003.npz"
    shutil.copy(FIXTURES / "translator_step3.npz", good)
    bad = tmp_path / "checkpoint_00000006.npz"
    array = rewrite(good, bad, fault, "dec.0.ff.w1")
    with pytest.raises(UnusableCheckpoint) as caught:
        usable.load(bad, translator.KIND)
    error = caught.value
    assert isinstance(error, checkpoint.CheckpointError)
    assert error.path == str(bad) and error.last_good == str(good)
    assert error.array == array and str(bad) in str(error)
    usable.load(good, translator.KIND)                               # the good one passes
    if fault == "adam":                                              # moments: only when read
        usable.load(bad, translator.KIND, with_optimizer=False)


def test_a_finite_float16_model_is_refused_too(tmp_path):
    ckpt = checkpoint.load(FIXTURES / "lm_step3.npz", with_optimizer=False)
    ckpt.params = {name: a.astype(np.float16) for name, a in ckpt.params.items()}
    assert all(np.isfinite(a).all() for a in ckpt.params.values())
    with pytest.raises(UnusableCheckpoint, match="'emb' is float16; parameters are float32 or "
                                                 "float64"):
        usable.check(ckpt)


def test_mixed_dtypes_and_a_config_the_model_refuses(tmp_path):
    ckpt = checkpoint.load(FIXTURES / "lm_step3.npz", with_optimizer=False)
    ckpt.params["pos_emb"] = ckpt.params["pos_emb"].astype(np.float64)
    with pytest.raises(UnusableCheckpoint, match="'pos_emb' is float64 but the parameters before "
                                                 "it are float32"):
        usable.check(ckpt)
    ckpt.config = {**ckpt.config, "n_heads": 3}
    with pytest.raises(UnusableCheckpoint, match="its config is not a valid config of a "
                                                 "decoder-only language model"):
        usable.check(ckpt)


def test_the_newest_good_one_is_found_past_damaged_and_newer_bad_ones(tmp_path):
    shutil.copy(FIXTURES / "translator_step3.npz", tmp_path / "checkpoint_00000003.npz")
    rewrite(tmp_path / "checkpoint_00000003.npz", tmp_path / "checkpoint_00000004.npz", "nan")
    (tmp_path / "checkpoint_00000005.npz").write_bytes(b"cut short")
    shutil.copy(FIXTURES / "lm_step3.npz", tmp_path / "checkpoint_00000006.npz")   # other kind
    assert usable.newest_usable(str(tmp_path), translator.KIND) \
        == str(tmp_path / "checkpoint_00000003.npz")
    assert usable.newest_usable(str(tmp_path)) == str(tmp_path / "checkpoint_00000006.npz")
    with pytest.raises(UnusableCheckpoint, match="damaged.*passes the check is "
                                                 ".*checkpoint_00000003.npz"):
        usable.load(tmp_path / "checkpoint_00000005.npz", translator.KIND)


# ---- reading commands -------------------------------------------------------------------------

@pytest.fixture
def translator_dir(tmp_path) -> Path:
    """A directory with a good translator checkpoint (step 3) with its vocabulary."""
    directory = tmp_path / "run"
    directory.mkdir()
    shutil.copy(FIXTURES / "translator_step3.npz", directory / "checkpoint_00000003.npz")
    return directory


@pytest.mark.parametrize("fault", FAULTS)
def test_translate_refuses(translator_dir, fault):
    good, bad = translator_dir / "checkpoint_00000003.npz", translator_dir / "checkpoint_00000009.npz"
    array = rewrite(good, bad, fault)
    before = snapshot(translator_dir)
    done = command("-m", "minitfm.translate", "--checkpoint", bad, stdin=b"a man sings\n")
    assert_refused(done, bad, array, fault, good)
    assert done.stdout == b"" and snapshot(translator_dir) == before


@pytest.mark.parametrize("fault", FAULTS)
def test_export_refuses(translator_dir, fault, tmp_path):
    good, bad = translator_dir / "checkpoint_00000003.npz", translator_dir / "checkpoint_00000009.npz"
    array = rewrite(good, bad, fault)
    before = snapshot(translator_dir)
    out = tmp_path / "model.safetensors"
    done = command("-m", "minitfm.export", bad, "--to", "safetensors", "--out", out)
    assert_refused(done, bad, array, fault, good)
    assert not out.exists() and snapshot(translator_dir) == before


@pytest.mark.parametrize("fault", FAULTS)
def test_average_checks_every_input_and_writes_nothing(translator_dir, fault):
    good, bad = translator_dir / "checkpoint_00000003.npz", translator_dir / "checkpoint_00000009.npz"
    array = rewrite(good, bad, fault)
    output = translator_dir / "averaged.npz"
    output.write_bytes(b"an earlier average")
    before = snapshot(translator_dir)
    done = command("-m", "minitfm.average", "--inputs", translator_dir, "--output", output)
    err = assert_refused(done, bad, array, fault, good)
    assert "averaged" not in done.stdout.decode() and "averaged.npz" not in err
    assert snapshot(translator_dir) == before


def test_average_of_only_bad_inputs_says_none_passes(translator_dir):
    good = translator_dir / "checkpoint_00000003.npz"
    bad = translator_dir / "checkpoint_00000009.npz"
    array = rewrite(good, bad, "nan")
    os.remove(good)
    done = command("-m", "minitfm.average", "--inputs", translator_dir, "--output",
                   translator_dir / "averaged.npz")
    assert_refused(done, bad, array, "nan", None)
    assert sorted(os.listdir(translator_dir)) == [bad.name]


@pytest.mark.parametrize("fault", FAULTS)
def test_eval_only_refuses(translator_dir, fault, tmp_path):
    good, bad = translator_dir / "checkpoint_00000003.npz", translator_dir / "checkpoint_00000009.npz"
    array = rewrite(good, bad, fault)
    write_split(tmp_path / "test", *sentence_pairs(5, 2))
    before = snapshot(translator_dir)
    done = command("train_wmt.py", "--eval-only", "--checkpoint", bad, "--testpref",
                   tmp_path / "test", *WMT)
    assert_refused(done, bad, array, fault, good)
    assert snapshot(translator_dir) == before


# ---- the trainers: a run to resume --------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, list]]:
    """One short run of each trainer (checkpoints at steps 2 and 4), and the arguments that
    resume it to step 8."""
    base = tmp_path_factory.mktemp("runs")
    text = base / "story.txt"
    rng = np.random.default_rng(0)
    text.write_text("".join(f"{rng.choice(['anna', 'bob'])} sees {rng.choice(['a', 'the'])} "
                            f"cat.\n" for _ in range(200)), encoding="utf-8")
    for split, n, seed in (("train", 300, 0), ("val", 30, 1)):
        write_split(base / split, *sentence_pairs(n, seed))
    made = {
        "train_toy": ["train_toy.py", *TOY, "--max-steps", "{steps}", "--save-every", "2"],
        "train_lm": ["train_lm.py", "--data", text, *LM, "--max-steps", "{steps}",
                     "--save-every", "2"],
        "train_wmt": ["train_wmt.py", *WMT, "--trainpref", base / "train", "--validpref",
                      base / "val", "--max-steps", "{steps}", "--save-every", "2"],
    }
    found = {}
    for trainer, argv in made.items():
        out = base / trainer
        first = [str(a).format(steps=4) for a in argv] + ["--out", out]
        done = command(*first)
        assert done.returncode == 0, done.stderr.decode()
        assert [s for s, _ in checkpoint.list_checkpoints(out)] == [2, 4]
        found[trainer] = (out, [str(a).format(steps=8) for a in argv] + ["--out", "{out}",
                                                                          "--resume"])
    return found


RESUMES = [("train_toy", fault) for fault in FAULTS] + \
    [(trainer, fault) for trainer in ("train_lm", "train_wmt") for fault in ("nan", "renamed",
                                                                              "kind")] + \
    [("train_toy", "adam")]


@pytest.mark.parametrize("trainer, fault", RESUMES)
def test_resume_refuses_and_names_the_last_good_checkpoint(runs, trainer, fault, tmp_path):
    made, argv = runs[trainer]
    out = tmp_path / "run"
    shutil.copytree(made, out)
    good, bad = out / "checkpoint_00000002.npz", out / "checkpoint_00000004.npz"
    array = rewrite(bad, bad, fault)
    before = snapshot(out)
    done = command(*[str(a).format(out=out) for a in argv])
    err = assert_refused(done, bad, array, fault, good, BAD_INPUT)
    assert "is intact" not in err and "training loss" not in err
    assert snapshot(out) == before


def test_a_divergence_after_resuming_names_a_checkpoint_that_passes(runs, tmp_path):
    """The checkpoint a divergence message calls good is one the check passes: the resumed one
    (checked when read) or one saved since (saving refuses non-finite values)."""
    made, argv = runs["train_toy"]
    out = tmp_path / "run"
    shutil.copytree(made, out)
    done = command(*[str(a).format(out=out) for a in argv], "--max-steps", "20",
                   "--lr-factor", "1e6", "--warmup", "2")
    err = done.stderr.decode()
    assert done.returncode != 0 and "Traceback" not in err, err
    named = err.split("the last good checkpoint, ")[1].split(", is intact")[0]
    assert named == str(out / "checkpoint_00000004.npz")
    usable.load(named, translator.KIND)
