"""Tests of minitfm.plot: every picture is a non-empty PNG; attention maps are the softmax weights
of the forward pass (rows sum to one, masked keys get zero); a missing matplotlib is a clear
error."""

import importlib.util
import json
import sys

import numpy as np
import pytest

from minitfm import checkpoint, plotting
from minitfm.cli import plot
from minitfm.models import translator

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TEXT = ["a man is riding a bike", "two dogs play in the grass", "a woman sings on a stage",
        "ein mann fährt fahrrad", "zwei hunde spielen im gras"]

needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                      reason="matplotlib is not installed (pip install -e '.[plot]')")


def assert_png(path):
    data = open(path, "rb").read()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000


def test_attention_maps_are_softmax_weights():
    cfg = translator.Config.preset("tiny", pre_ln=True)
    params = translator.init_params(cfg, seed=0, dtype=np.float64)
    src = np.array([[4, 5, 6, 3], [7, 3, 0, 0]])                       # second one padded
    tgt_in = np.array([[2, 8, 9], [2, 10, 4]])
    maps = plotting.attention_maps(params, cfg, src, tgt_in)
    shapes = {"encoder": (2, 2, 4, 4), "decoder_self": (2, 2, 3, 3), "cross": (2, 2, 3, 4)}
    for kind, shape in shapes.items():
        assert len(maps[kind]) == cfg.n_layers
        for p in maps[kind]:
            assert p.shape == shape
            np.testing.assert_allclose(p.sum(axis=-1), 1.0, atol=1e-12)
            if kind != "decoder_self":
                assert (p[1, :, :, 2:] == 0).all()                    # padded source keys
    for p in maps["decoder_self"]:
        assert (np.triu(np.ones((3, 3)), k=1)[None, None] * p == 0).all()  # no future keys


@needs_matplotlib
def test_positional_png(tmp_path):
    assert_png(plotting.plot_positional(tmp_path / "pe.png", d_model=64, length=50))


@needs_matplotlib
def test_lr_png_via_command_line(tmp_path, capsys):
    out = tmp_path / "lr.png"
    assert plot.main(["lr", "--d-model", "256", "512", "--warmup", "4000", "--steps", "20000",
                      "--out", str(out)]) == 0
    assert_png(out)
    assert str(out) in capsys.readouterr().out


@needs_matplotlib
def test_curves_png_tolerates_missing_keys_and_names_the_lines_it_skips(tmp_path, capsys):
    log = tmp_path / "run" / "log.jsonl"
    log.parent.mkdir()
    lines = [json.dumps({"step": s, "loss": 5.0 / s, "lr": 1e-4 * s}) for s in range(1, 30)]
    lines += [json.dumps({"step": 10, "valid_loss": 1.2, "valid_bleu": 3.5}),
              json.dumps({"step": 20, "valid_loss": 1.0}),                  # no BLEU this time
              json.dumps({"loss": 1.0}), "not json", ""]
    log.write_bytes(("\n".join(lines) + "\n").encode() + b'{"step": 30, "lo\xff"\n'
                    + b'{"step": 30, "loss": 0.1')                          # cut by a crash
    read = plotting.read_log(log)
    assert len(read.records) == 31
    assert read.skipped == [(32, 'no numeric "step"'), (33, "not JSON"), (35, "not UTF-8"),
                            (36, "cut short: no line end")]
    out = tmp_path / "curves.png"
    assert plot.main(["curves", str(log), "--out", str(out)]) == 0
    assert_png(out)
    assert capsys.readouterr().err == (
        f'warning: {log}: skipped 4 lines that could not be read: line 32 (no numeric "step"), '
        f"line 33 (not JSON), line 35 (not UTF-8), line 36 (cut short: no line end); the curves "
        f"are drawn without them\n")
    log.write_text("\n".join(lines[:31]) + "\n")
    assert plot.main(["curves", str(log), "--out", str(out)]) == 0
    assert capsys.readouterr().err == ""                       # nothing skipped, nothing said


def test_training_minutes_of_steps_and_of_the_validations_after_them():
    records = [{"step": 1, "loss": 3.0, "elapsed": 30.0}, {"step": 2, "loss": 2.0, "elapsed": 90.0},
               {"step": 2, "valid_bleu": 5.0}, {"step": 3, "valid_bleu_beam4": 6.0},
               {"step": 3, "loss": 1.0, "elapsed": 120.0}]
    assert plotting.training_minutes(records) == {1: 0.5, 2: 1.5, 3: 2.0}
    minutes = plotting.training_minutes(records)
    assert plotting._series(records, "valid_bleu", minutes) == ([1.5], [5.0])
    assert plotting._series(records, "valid_bleu_beam4", minutes) == ([2.0], [6.0])
    assert plotting._series(records, "loss") == ([1, 2, 3], [3.0, 2.0, 1.0])
    assert plotting._metric_panels({"run": records}) == [("valid_bleu", ["valid_bleu",
                                                                         "valid_bleu_beam4"])]


@needs_matplotlib
def test_curves_against_training_minutes(tmp_path):
    log = tmp_path / "run" / "log.jsonl"
    log.parent.mkdir()
    lines = [json.dumps({"step": s, "loss": 5.0 / s, "elapsed": 6.0 * s}) for s in range(1, 30)]
    lines += [json.dumps({"step": 10, "valid_loss": 1.2, "valid_bleu": 3.5}),
              json.dumps({"step": 20, "valid_bleu_beam4": 4.5})]
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "curves.png"
    assert plot.main(["curves", str(log), "--x", "minutes", "--out", str(out)]) == 0
    assert_png(out)


def test_curves_without_losses_is_an_error(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"step": 1, "lr": 0.1}) + "\n")
    assert plot.main(["curves", str(log), "--out", str(tmp_path / "c.png")]) == 2
    assert "no \"loss\"" in capsys.readouterr().err


@needs_matplotlib
def test_attention_pngs_from_a_checkpoint(tmp_path):
    from minitfm.data.vocab import train_vocab
    vocab = train_vocab(TEXT * 4, 40, hard_vocab_limit=False, num_threads=1)
    cfg = translator.Config.preset("tiny", src_vocab=vocab.size, tgt_vocab=vocab.size, max_len=24)
    path = tmp_path / "tiny.npz"
    checkpoint.save(path, translator.init_params(cfg, seed=0), step=1, config=cfg.to_dict(),
                    vocab_id=vocab.identifier, vocab_model=vocab.serialized_model())
    args = ["attention", "--checkpoint", str(path), "--source", "a man sings",
            "--out-dir", str(tmp_path / "out")]
    assert plot.main(args + ["--target", "ein mann", "--layer", "0"]) == 0
    assert plot.main(args + ["--beam", "2"]) == 0                   # the model's own translation
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == sorted(f"attention_{kind}_layer{i}.png"
                           for kind in plotting.ATTENTION_KINDS for i in (0, 1))
    for png in (tmp_path / "out").iterdir():
        assert_png(png)
    assert plot.main(args + ["--layer", "5"]) == 2


def test_missing_matplotlib_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)               # import now fails
    with pytest.raises(plotting.PlotError, match=r"pip install -e '\.\[plot\]'"):
        plotting.plot_positional(tmp_path / "pe.png")
