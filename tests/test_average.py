"""Tests of minitfm.average on tiny checkpoints of a 1-layer language model whose parameters are
filled with constants: the mean, dtypes, refusals, and the CLI."""

import os
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitfm import checkpoint, models
from minitfm.averaging import average, average_checkpoints
from minitfm.cli.average import main
from minitfm.checkpoint import CheckpointError
from minitfm.models import lm, translator
from minitfm.usable import UnusableCheckpoint
from tests import forkserver

CONFIG = lm.LMConfig(vocab=5, n_layers=1, d_model=4, n_heads=2, d_ff=8, max_len=8).to_dict()
W, B = "layers.0.ff.w1", "layers.0.ff.b1"      # two of its parameters: (4, 8) and (8,)


def fake_params(value: float, config: dict = CONFIG, dtype=np.float32, kind: str = lm.KIND
                ) -> dict:
    """Every parameter of the model ``config`` describes, filled with ``value`` (biases with
    twice that)."""
    model = models.get(kind)
    shapes = model.parameter_shapes(model.Config.from_dict(config))
    return {name: np.full(shape, 2 * value if len(shape) == 1 else value, dtype)
            for name, shape in shapes.items()}


def write(directory, step, value, *, config=CONFIG, vocab_id="vocab-a", params=None,
          dtype=np.float32, kind=lm.KIND):
    path = checkpoint.checkpoint_path(directory, step)
    params = fake_params(value, config, dtype, kind) if params is None else params
    checkpoint.save(path, params, step=step, config=config, vocab_id=vocab_id,
                    vocab_model=b"model-bytes", extra={"seed": 7}, kind=kind,
                    optimizer_state={"step": step, "m": params, "v": params})
    return path


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_average_is_the_mean_in_stored_dtypes(tmp_path, dtype):
    paths = [write(tmp_path, step, value, dtype=dtype)
             for step, value in [(1, 1.0), (2, 2.0), (3, 6.0)]]
    params = average(paths)
    assert params[W].dtype == dtype and params[B].dtype == dtype
    np.testing.assert_array_equal(params[W], np.full((4, 8), 3.0, dtype=dtype))
    np.testing.assert_array_equal(params[B], np.full(8, 6.0, dtype=dtype))


@settings(max_examples=20, deadline=None)
@given(values=st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False,
                                  min_value=-2.0 ** 126, max_value=2.0 ** 126),
                       min_size=1, max_size=6))
def test_average_accumulates_in_float64(values):
    # near float32's maximum a float32 sum would overflow to inf; the float64 one does not
    with tempfile.TemporaryDirectory() as directory:
        paths = [write(directory, i, v) for i, v in enumerate(values)]
        params = average(paths)
    expected = np.float32(np.mean(np.array(values, dtype=np.float64)))
    assert params[W].dtype == np.float32
    np.testing.assert_allclose(params[W], np.full((4, 8), expected), rtol=1e-6, atol=1e-38)


def test_average_of_one_copy_is_exact(tmp_path):
    rng = np.random.default_rng(0)
    params = {name: rng.standard_normal(a.shape).astype(np.float32)
              for name, a in fake_params(0.0).items()}
    paths = [write(tmp_path, step, 0.0, params=params) for step in (1, 2, 3)]
    averaged = average(paths)
    for name, value in params.items():
        np.testing.assert_array_equal(averaged[name], value)


def test_average_checkpoints_returns_the_last_for_metadata(tmp_path):
    paths = [write(tmp_path, step, 1.0) for step in (10, 20)]
    _, last = average_checkpoints(paths)
    assert last.step == 20 and last.optimizer_state is None


def test_refuses_different_configs(tmp_path):
    a = write(tmp_path, 1, 1.0)
    b = write(tmp_path, 2, 1.0, config={**CONFIG, "d_ff": 6})
    with pytest.raises(CheckpointError, match=r"(?s)different models.*'d_ff': 8 vs 6"):
        average([a, b])


def test_refuses_different_model_kinds_and_keeps_the_kind(tmp_path):
    a = write(tmp_path, 1, 1.0)
    b = write(tmp_path, 2, 1.0, kind=translator.KIND,
              config=translator.Config.preset("tiny", src_vocab=5, tgt_vocab=5).to_dict())
    with pytest.raises(CheckpointError, match=r"(?s)different models.*model kind: "
                                              r"'lm' vs 'transformer'"):
        average([a, b])
    _, last = average_checkpoints([b, b])
    assert last.kind == "transformer"


def test_refuses_different_vocabularies(tmp_path):
    a = write(tmp_path, 1, 1.0)
    b = write(tmp_path, 2, 1.0, vocab_id="vocab-b")
    with pytest.raises(CheckpointError, match="vocabulary: 'vocab-a' vs 'vocab-b'"):
        average([a, b])


def test_refuses_renamed_reshaped_and_integer_parameters(tmp_path):
    """Each input passes the check of minitfm.usable: every parameter of its config, by name,
    with its shape, in float32 or float64."""
    a = write(tmp_path, 1, 1.0)
    params = fake_params(1.0)
    renamed = {("layers.0.ff.w_in" if name == W else name): value for name, value in params.items()}
    b = write(tmp_path, 2, 1.0, params=renamed)
    with pytest.raises(UnusableCheckpoint, match=rf"{b}.*parameter '{W}' is missing \(it has "
                                                 r"'layers.0.ff.w_in' instead"):
        average([a, b])
    c = write(tmp_path, 3, 1.0, params={**params, W: np.zeros((8, 4), np.float32)})
    with pytest.raises(UnusableCheckpoint, match=rf"parameter '{W}' has shape \(8, 4\), its "
                                                 r"config needs \(4, 8\)"):
        average([a, c])
    d = write(tmp_path, 4, 0.0, params={**params, B: np.arange(8)})
    with pytest.raises(UnusableCheckpoint, match=rf"parameter '{B}' is int64; parameters are "
                                                 r"float32 or float64"):
        average([d])


def test_refuses_nothing(tmp_path):
    with pytest.raises(ValueError, match="no checkpoints"):
        average([])


def test_refuses_different_dtypes(tmp_path):
    a, b = write(tmp_path, 1, 1.0), write(tmp_path, 2, 1.0, dtype=np.float64)
    with pytest.raises(CheckpointError, match=rf"parameter '{W}': \(4, 8\) float32 vs "
                                              r"\(4, 8\) float64"):
        average([a, b])


def test_cli_averages_the_last_k_of_a_directory(tmp_path, capsys):
    for step, value in [(100, 100.0), (200, 1.0), (300, 2.0), (400, 3.0)]:
        write(tmp_path, step, value)
    out = tmp_path / "averaged.npz"
    assert main(["--inputs", str(tmp_path), "--last", "3", "--output", str(out)]) == 0
    assert "averaged 3 checkpoint(s)" in capsys.readouterr().out
    ckpt = checkpoint.load(out)
    np.testing.assert_array_equal(ckpt.params[W], np.full((4, 8), 2.0, dtype=np.float32))
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
    np.testing.assert_array_equal(ckpt.params[B], np.full(8, 4.0, dtype=np.float32))


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
    result = forkserver.run(
        [sys.executable, "-m", "minitfm.average", "--inputs", str(tmp_path), "--output", str(out)],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert checkpoint.load(out).step == 1
