"""Tests of minitfm.average on tiny fake checkpoints: the mean, dtypes, refusals, and the CLI."""

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitfm import checkpoint
from minitfm.average import average, average_checkpoints, main
from minitfm.checkpoint import CheckpointError

CONFIG = {"d_model": 4, "n_layers": 1}


def fake_params(value: float) -> dict:
    return {"w": np.full((2, 3), value, dtype=np.float32), "b": np.full(3, 2 * value)}


def write(directory, step, value, *, config=CONFIG, vocab_id="vocab-a", params=None):
    path = checkpoint.checkpoint_path(directory, step)
    params = fake_params(value) if params is None else params
    checkpoint.save(path, params, step=step, config=config, vocab_id=vocab_id,
                    vocab_model=b"model-bytes", extra={"seed": 7},
                    optimizer_state={"step": step, "m": params, "v": params})
    return path


def test_average_is_the_mean_in_stored_dtypes(tmp_path):
    paths = [write(tmp_path, step, value) for step, value in [(1, 1.0), (2, 2.0), (3, 6.0)]]
    params = average(paths)
    assert params["w"].dtype == np.float32 and params["b"].dtype == np.float64
    np.testing.assert_array_equal(params["w"], np.full((2, 3), 3.0, dtype=np.float32))
    np.testing.assert_array_equal(params["b"], np.full(3, 6.0))


@settings(max_examples=20, deadline=None)
@given(values=st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False),
                       min_size=1, max_size=6))
def test_average_accumulates_in_float64(values):
    # near float32's maximum a float32 sum would overflow to inf; the float64 one does not
    with tempfile.TemporaryDirectory() as directory:
        paths = [write(directory, i, v) for i, v in enumerate(values)]
        params = average(paths)
    expected = np.float32(np.mean(np.array(values, dtype=np.float64)))
    assert params["w"].dtype == np.float32
    np.testing.assert_allclose(params["w"], np.full((2, 3), expected), rtol=1e-6, atol=1e-38)


def test_average_of_one_copy_is_exact(tmp_path):
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((4, 4)).astype(np.float32)}
    paths = [write(tmp_path, step, 0.0, params=params) for step in (1, 2, 3)]
    np.testing.assert_array_equal(average(paths)["w"], params["w"])


def test_average_checkpoints_returns_the_last_for_metadata(tmp_path):
    paths = [write(tmp_path, step, 1.0) for step in (10, 20)]
    _, last = average_checkpoints(paths)
    assert last.step == 20 and last.optimizer_state is None


def test_refuses_different_configs(tmp_path):
    a = write(tmp_path, 1, 1.0)
    b = write(tmp_path, 2, 1.0, config={**CONFIG, "d_model": 8})
    with pytest.raises(CheckpointError, match=r"(?s)different models.*'d_model': 4 vs 8"):
        average([a, b])


def test_refuses_different_model_kinds_and_keeps_the_kind(tmp_path):
    a = write(tmp_path, 1, 1.0)
    b = checkpoint.checkpoint_path(tmp_path, 2)
    checkpoint.save(b, fake_params(1.0), step=2, config=CONFIG, vocab_id="vocab-a",
                    vocab_model=b"model-bytes", kind="lm")
    with pytest.raises(CheckpointError, match=r"(?s)different models.*model kind: "
                                              r"'transformer' vs 'lm'"):
        average([a, b])
    _, last = average_checkpoints([b, b])
    assert last.kind == "lm"


def test_refuses_different_vocabularies(tmp_path):
    a = write(tmp_path, 1, 1.0)
    b = write(tmp_path, 2, 1.0, vocab_id="vocab-b")
    with pytest.raises(CheckpointError, match="vocabulary: 'vocab-a' vs 'vocab-b'"):
        average([a, b])


def test_refuses_different_parameter_names_and_shapes(tmp_path):
    a = write(tmp_path, 1, 1.0)
    b = write(tmp_path, 2, 1.0, params={"w": np.zeros((2, 3), np.float32), "c": np.zeros(3)})
    with pytest.raises(CheckpointError,
                       match=r"\['b'\] only in the first, \['c'\] only in the other"):
        average([a, b])
    c = write(tmp_path, 3, 1.0, params={"w": np.zeros((3, 2), np.float32), "b": np.zeros(3)})
    with pytest.raises(CheckpointError,
                       match=r"parameter 'w': \(2, 3\) float32 vs \(3, 2\) float32"):
        average([a, c])


def test_refuses_nothing_and_integers(tmp_path):
    with pytest.raises(ValueError, match="no checkpoints"):
        average([])
    path = write(tmp_path, 1, 0.0, params={"ids": np.arange(3)})
    with pytest.raises(CheckpointError, match="not floating point"):
        average([path])


def test_cli_averages_the_last_k_of_a_directory(tmp_path, capsys):
    for step, value in [(100, 100.0), (200, 1.0), (300, 2.0), (400, 3.0)]:
        write(tmp_path, step, value)
    out = tmp_path / "averaged.npz"
    assert main(["--inputs", str(tmp_path), "--last", "3", "--output", str(out)]) == 0
    assert "averaged 3 checkpoint(s)" in capsys.readouterr().out
    ckpt = checkpoint.load(out)
    np.testing.assert_array_equal(ckpt.params["w"], np.full((2, 3), 2.0, dtype=np.float32))
    assert ckpt.step == 400 and ckpt.config == CONFIG and ckpt.optimizer_state is None
    assert ckpt.vocab_id == "vocab-a" and ckpt.vocab_model == b"model-bytes"
    assert ckpt.extra == {"seed": 7, "averaged_from": [
        "checkpoint_00000200.npz", "checkpoint_00000300.npz", "checkpoint_00000400.npz"]}
    assert checkpoint.latest(tmp_path).endswith("checkpoint_00000400.npz")   # output not rotated


def test_cli_takes_files_in_order_given_and_notes_fewer_than_last(tmp_path, capsys):
    a, b = write(tmp_path, 1, 1.0), write(tmp_path, 2, 3.0)
    out = tmp_path / "avg.npz"
    assert main(["--inputs", b, a, "--output", str(out)]) == 0
    assert "only 2 checkpoint(s)" in capsys.readouterr().err
    ckpt = checkpoint.load(out)
    assert ckpt.step == 1                                 # metadata of the last input given
    np.testing.assert_array_equal(ckpt.params["b"], np.full(3, 4.0))


def test_cli_errors(tmp_path, capsys):
    write(tmp_path, 1, 1.0)
    assert main(["--inputs", str(tmp_path / "missing"), "--output", str(tmp_path / "o.npz")]) == 2
    assert "neither a checkpoint file nor a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["--inputs", str(tmp_path / "empty"), "--output", str(tmp_path / "o.npz")]) == 2
    assert "no checkpoint_*.npz" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--inputs", str(tmp_path), "--output", str(tmp_path / "checkpoint_00000009.npz")])
    assert "choose another name" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--inputs", str(tmp_path), "--last", "0", "--output", str(tmp_path / "o.npz")])
    assert not os.path.exists(tmp_path / "o.npz")


def test_cli_runs_as_a_module(tmp_path):
    write(tmp_path, 1, 1.0)
    out = tmp_path / "avg.npz"
    result = subprocess.run(
        [sys.executable, "-m", "minitfm.average", "--inputs", str(tmp_path), "--output", str(out)],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert checkpoint.load(out).step == 1
