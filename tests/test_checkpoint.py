"""Tests of minitfm.checkpoint: round trips, atomic writes, damaged files, compatibility checks,
format versions and rotation."""

import dataclasses
import errno
import json
import os
import re
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minitfm import backend, checkpoint, flat, usable
from minitfm.checkpoint import CheckpointError


@dataclasses.dataclass(frozen=True)
class TinyConfig:
    """A stand-in for the model config: a frozen dataclass with to_dict / from_dict."""

    d_model: int = 8
    n_layers: int = 2
    dropout: float = 0.1
    shape: tuple = (2, 3)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TinyConfig":
        return cls(**{**d, "shape": tuple(d["shape"])})


def tiny_params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"enc.0.attn.w_qkv": rng.standard_normal((8, 24)).astype(np.float32),
            "enc.0.ln.gain": np.ones(8, dtype=np.float32),
            "emb": rng.standard_normal((5, 8))}                     # float64 too


def tiny_optimizer_state(params: dict, step: int = 7) -> dict:
    return {"step": step,
            "m": {n: np.full_like(a, 0.5) for n, a in params.items()},
            "v": {n: np.full_like(a, 0.25) for n, a in params.items()}}


def save_tiny(path, step=100, seed=0, **overrides):
    params = tiny_params(seed)
    kwargs = dict(optimizer_state=tiny_optimizer_state(params), step=step,
                  config=TinyConfig().to_dict(), vocab_id="spm-37k-abc123",
                  vocab_model=b"\x00sentencepiece\xff", extra={"seed": 1234})
    kwargs.update(overrides)
    checkpoint.save(path, params, **kwargs)
    return params


def test_round_trip(tmp_path):
    path = tmp_path / "run" / "checkpoint_00000100.npz"               # parents are created
    params = save_tiny(path)
    ckpt = checkpoint.load(path)
    assert ckpt.path == str(path) and ckpt.step == 100
    assert list(ckpt.params) == list(params)                            # order kept
    for name, array in params.items():
        assert ckpt.params[name].dtype == array.dtype
        np.testing.assert_array_equal(ckpt.params[name], array)
    assert ckpt.optimizer_state["step"] == 7
    np.testing.assert_array_equal(ckpt.optimizer_state["v"]["emb"], np.full((5, 8), 0.25))
    assert TinyConfig.from_dict(ckpt.config) == TinyConfig()
    assert ckpt.vocab_id == "spm-37k-abc123"
    assert ckpt.vocab_model == b"\x00sentencepiece\xff"
    assert ckpt.extra == {"seed": 1234}
    assert os.listdir(path.parent) == ["checkpoint_00000100.npz"]       # no temporary left


def test_the_model_kind_round_trips_and_old_files_hold_a_transformer(tmp_path):
    save_tiny(tmp_path / "lm.npz", kind="lm")
    ckpt = checkpoint.load(tmp_path / "lm.npz")
    assert ckpt.kind == "lm"
    array, what = usable.problem(ckpt, "transformer")
    assert array is None
    assert re.fullmatch(r"it holds a decoder-only language model .*, but this needs an "
                        r"encoder-decoder Transformer .*", what)
    save_tiny(tmp_path / "default.npz")
    assert checkpoint.load(tmp_path / "default.npz").kind == "transformer"
    # a file written before kinds were recorded: its meta has no "kind"
    with np.load(tmp_path / "default.npz", allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    meta = json.loads(arrays["meta"].tobytes())
    del meta["kind"]
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(tmp_path / "old.npz", **arrays)
    assert checkpoint.load(tmp_path / "old.npz").kind == "transformer"
    with pytest.raises(ValueError, match="unknown model kind"):
        save_tiny(tmp_path / "bad.npz", kind="gpt")
    assert not (tmp_path / "bad.npz").exists()


def test_file_layout_is_plain_npz(tmp_path):
    save_tiny(tmp_path / "c.npz")
    with np.load(tmp_path / "c.npz", allow_pickle=False) as archive:
        assert set(archive.files) == {
            "meta", "vocab_model", "param/enc.0.attn.w_qkv", "param/enc.0.ln.gain", "param/emb",
            "adam_m/enc.0.attn.w_qkv", "adam_m/enc.0.ln.gain", "adam_m/emb",
            "adam_v/enc.0.attn.w_qkv", "adam_v/enc.0.ln.gain", "adam_v/emb"}
        assert archive["meta"].dtype == np.uint8
        meta = json.loads(archive["meta"].tobytes())
    assert meta["format"] == "minitfm-checkpoint" and meta["version"] == checkpoint.FORMAT_VERSION
    assert meta["optimizer_step"] == 7


def test_without_optimizer_state_or_vocab(tmp_path):
    checkpoint.save(tmp_path / "c.npz", tiny_params(), step=3, config={}, vocab_id=None)
    ckpt = checkpoint.load(tmp_path / "c.npz")
    assert ckpt.optimizer_state is None and ckpt.vocab_model is None and ckpt.vocab_id is None
    assert ckpt.extra == {}


def test_load_can_skip_optimizer_state(tmp_path):
    save_tiny(tmp_path / "c.npz")
    assert checkpoint.load(tmp_path / "c.npz", with_optimizer=False).optimizer_state is None


@settings(max_examples=15, deadline=None)
@given(params=st.dictionaries(
    st.text("abcxyz.0123_", min_size=1, max_size=12),
    hnp.arrays(st.sampled_from([np.float32, np.float64, np.int64]),
               hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
               elements={"allow_nan": False, "allow_infinity": False}),
    max_size=4),
    step=st.integers(0, 10**9))
def test_round_trip_any_params(params, step):
    with tempfile.TemporaryDirectory() as directory:
        path = checkpoint.checkpoint_path(directory, step)
        checkpoint.save(path, params, step=step, config={"n": 1}, vocab_id="v")
        ckpt = checkpoint.load(path)
    assert ckpt.step == step and list(ckpt.params) == list(params)
    for name, array in params.items():
        assert ckpt.params[name].dtype == array.dtype and ckpt.params[name].shape == array.shape
        np.testing.assert_array_equal(ckpt.params[name], array)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["param", "m", "v"])
def test_non_finite_values_are_never_written(tmp_path, bad, where):
    params = flat.flatten(tiny_params())
    state = {"step": 3, "m": flat.zeros_like(params), "v": flat.zeros_like(params)}
    target = params if where == "param" else state[where]
    target["emb"][1, 2] = bad
    path = tmp_path / "c.npz"
    with pytest.raises(checkpoint.NonFiniteError, match="'emb' holds NaN or Inf") as raised:
        checkpoint.save(path, params, optimizer_state=state, step=3, config={}, vocab_id=None)
    assert ("parameter" in raised.value.what) == (where == "param")
    assert not os.path.exists(path) and os.listdir(tmp_path) == []


def test_params_to_device_keeps_dtypes():
    params = tiny_params()
    moved = checkpoint.params_to_device(params)
    for name, array in moved.items():
        assert isinstance(array, backend.xp.ndarray) and array.dtype == params[name].dtype


# --- atomic writes -----------------------------------------------------------------------------

def test_failed_save_keeps_previous_checkpoint_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint_00000100.npz"
    save_tiny(path, step=100)
    before = path.read_bytes()

    def savez_then_disk_full(file, **arrays):      # half the archive is written, then ENOSPC
        file.write(b"PK\x03\x04" + b"\x00" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.numpy, "savez", savez_then_disk_full)
    with pytest.raises(OSError, match="No space left"):
        save_tiny(path, step=200, seed=1)
    assert path.read_bytes() == before
    assert checkpoint.load(path).step == 100
    assert os.listdir(tmp_path) == ["checkpoint_00000100.npz"]


def test_interrupted_save_before_rename_keeps_previous(tmp_path, monkeypatch):
    path = tmp_path / "c.npz"
    save_tiny(path, step=1)

    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.os, "fsync", crash)
    with pytest.raises(KeyboardInterrupt):
        save_tiny(path, step=2)
    monkeypatch.undo()
    assert checkpoint.load(path).step == 1
    assert os.listdir(tmp_path) == ["c.npz"]


def test_unserialisable_metadata_is_refused_before_writing(tmp_path):
    with pytest.raises(TypeError, match="config.to_dict"):
        checkpoint.save(tmp_path / "c.npz", tiny_params(), step=1, config=TinyConfig(),
                        vocab_id=None)
    with pytest.raises(TypeError, match="plain JSON values"):
        checkpoint.save(tmp_path / "c.npz", tiny_params(), step=1, config={}, vocab_id=None,
                        extra={"rng": np.random.default_rng(0)})
    assert os.listdir(tmp_path) == []


def test_optimizer_state_for_other_params_is_refused(tmp_path):
    state = tiny_optimizer_state({"other": np.zeros(2)})
    with pytest.raises(ValueError, match="different parameter dict"):
        checkpoint.save(tmp_path / "c.npz", tiny_params(), step=1, config={}, vocab_id=None,
                        optimizer_state=state)


# --- damaged and foreign files -----------------------------------------------------------------

def truncate(path, fraction):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.5, 0.99])
def test_truncated_file_is_reported_as_damaged(tmp_path, fraction):
    path = tmp_path / "checkpoint_00000100.npz"
    save_tiny(path)
    truncate(path, fraction)
    with pytest.raises(CheckpointError, match="damaged") as info:
        checkpoint.load(path)
    assert str(path) in str(info.value)


def test_flipped_bytes_are_reported_as_damaged(tmp_path):
    path = tmp_path / "c.npz"
    save_tiny(path)
    data = bytearray(path.read_bytes())
    start = data.index(b"param/enc.0.attn.w_qkv") + 200        # inside that array's data
    data[start:start + 8] = bytes(b ^ 0xFF for b in data[start:start + 8])
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{path}.*damaged"):
        checkpoint.load(path)


def test_garbage_file_is_reported_as_damaged(tmp_path):
    path = tmp_path / "c.npz"
    path.write_bytes(b"this is not a zip archive" * 10)
    with pytest.raises(CheckpointError, match="damaged"):
        checkpoint.load(path)


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        checkpoint.load(tmp_path / "nope.npz")


def test_other_npz_is_not_a_checkpoint(tmp_path):
    np.savez(tmp_path / "other.npz", w=np.zeros(3))
    with pytest.raises(CheckpointError, match="not a minitfm checkpoint"):
        checkpoint.load(tmp_path / "other.npz")


def write_with_meta(path, meta, **arrays):
    text = json.dumps(meta).encode()
    np.savez(path, meta=np.frombuffer(text, dtype=np.uint8), **arrays)


def test_unknown_format_version_is_refused(tmp_path):
    path = tmp_path / "future.npz"
    save_tiny(path)
    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files if k != "meta"}
        meta = json.loads(archive["meta"].tobytes())
    meta["version"] = 99
    write_with_meta(path, meta, **arrays)
    with pytest.raises(CheckpointError, match=r"format version 99.*reads only version 1"):
        checkpoint.load(path)


def test_missing_listed_array_is_reported(tmp_path):
    path = tmp_path / "c.npz"
    save_tiny(path)
    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files if k not in ("meta", "param/emb")}
        meta = json.loads(archive["meta"].tobytes())
    write_with_meta(path, meta, **arrays)
    with pytest.raises(CheckpointError, match="missing.*param/emb"):
        checkpoint.load(path)


# --- compatibility -----------------------------------------------------------------------------

def test_check_compatible_accepts_same_config_and_vocab(tmp_path):
    save_tiny(tmp_path / "c.npz")
    ckpt = checkpoint.load(tmp_path / "c.npz")
    checkpoint.check_compatible(ckpt, TinyConfig().to_dict(), "spm-37k-abc123")   # tuple vs list


def test_check_compatible_names_each_differing_field(tmp_path):
    save_tiny(tmp_path / "c.npz")
    ckpt = checkpoint.load(tmp_path / "c.npz")
    current = {**TinyConfig(d_model=16, dropout=0.3).to_dict(), "new_field": 1}
    with pytest.raises(CheckpointError) as info:
        checkpoint.check_compatible(ckpt, current, "spm-37k-abc123")
    message = str(info.value)
    assert "'d_model': checkpoint has 8, current run has 16" in message
    assert "'dropout': checkpoint has 0.1, current run has 0.3" in message
    assert "'new_field': checkpoint has no such field, current run has 1" in message
    assert "n_layers" not in message and "vocabulary differs" not in message
    checkpoint.check_compatible(ckpt, TinyConfig(dropout=0.0).to_dict(), "spm-37k-abc123",
                                ignore=("dropout",))


def test_check_compatible_reports_other_vocabulary(tmp_path):
    save_tiny(tmp_path / "c.npz")
    ckpt = checkpoint.load(tmp_path / "c.npz")
    with pytest.raises(CheckpointError, match="vocabulary differs.*'spm-37k-abc123'.*'bpe-32k'"):
        checkpoint.check_compatible(ckpt, TinyConfig().to_dict(), "bpe-32k")


# --- rotation ----------------------------------------------------------------------------------

def test_latest_and_keep_last(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    assert checkpoint.latest(tmp_path / "absent") is None
    for step in (500, 100, 2000, 1500):
        checkpoint.save(checkpoint.checkpoint_path(tmp_path, step), {"w": np.zeros(1)},
                        step=step, config={}, vocab_id=None)
    (tmp_path / "averaged.npz").write_bytes(b"x")
    (tmp_path / ".checkpoint_00009999.npz.abc.tmp").write_bytes(b"x")
    assert checkpoint.checkpoint_path(tmp_path, 100).endswith("checkpoint_00000100.npz")
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [100, 500, 1500, 2000]
    assert checkpoint.latest(tmp_path) == checkpoint.checkpoint_path(tmp_path, 2000)

    removed = checkpoint.keep_last(tmp_path, 2)
    assert removed == [checkpoint.checkpoint_path(tmp_path, s) for s in (100, 500)]
    assert sorted(os.listdir(tmp_path)) == [
        ".checkpoint_00009999.npz.abc.tmp", "averaged.npz",
        "checkpoint_00001500.npz", "checkpoint_00002000.npz"]
    assert checkpoint.keep_last(tmp_path, 5) == []
    with pytest.raises(ValueError, match="k >= 1"):
        checkpoint.keep_last(tmp_path, 0)


def test_steps_beyond_eight_digits_still_sort(tmp_path):
    for step in (99_999_999, 123_456_789):
        checkpoint.save(checkpoint.checkpoint_path(tmp_path, step), {"w": np.zeros(1)},
                        step=step, config={}, vocab_id=None)
    assert checkpoint.latest(tmp_path).endswith("checkpoint_123456789.npz")


@pytest.mark.gpu
def test_device_arrays_round_trip(tmp_path, cupy_backend):
    params = checkpoint.params_to_device(tiny_params())
    checkpoint.save(tmp_path / "c.npz", params, step=1, config={}, vocab_id=None)
    ckpt = checkpoint.load(tmp_path / "c.npz")
    assert all(isinstance(a, np.ndarray) for a in ckpt.params.values())
    moved = checkpoint.params_to_device(ckpt.params)
    assert all(isinstance(a, backend.xp.ndarray) for a in moved.values())
    np.testing.assert_array_equal(backend.to_host(moved["emb"]), tiny_params()["emb"])
