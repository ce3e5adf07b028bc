"""Tests of train_lm.py through main(argv), on a small generated text: a short run learns, a
resumed run is bit-identical, sampling is reproducible from its seed, bad options are usage
errors."""

import json
import os
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from minitfm import checkpoint
from minitfm.commands import train_lm as commands_train_lm
from minitfm.training.rundir import LOG_NAME
from minitfm.models import lm, translator

SCRIPT = Path(__file__).resolve().parents[1] / "train_lm.py"
SMALL = ["--layers", "1", "--d-model", "32", "--heads", "2", "--d-ff", "64", "--block-size", "16",
         "--batch-size", "8", "--warmup", "5", "--lr", "1e-2", "--min-lr", "1e-3",
         "--eval-blocks", "20", "--quiet", "--max-new-tokens", "20"]


@pytest.fixture(scope="module")
def train_lm():
    """The command's module (a placement sets BLAS thread variables: restore the environment)."""
    with mock.patch.dict(os.environ):
        yield commands_train_lm


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """About 12,000 characters of simple sentences: a pattern a tiny model learns in seconds."""
    rng = np.random.default_rng(0)
    names, verbs, things = ["anna", "bob", "the cat", "a dog"], ["sees", "likes", "has"], \
        ["the ball", "a hat", "the sun", "an apple"]
    lines = [f"{rng.choice(names)} {rng.choice(verbs)} {rng.choice(things)}." for _ in range(600)]
    path = tmp_path_factory.mktemp("text") / "story.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read_log(directory):
    with open(os.path.join(directory, LOG_NAME)) as f:
        return [json.loads(line) for line in f]


def test_a_short_run_learns_and_prints_samples(train_lm, text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_lm.main(["--data", str(text_file), *SMALL, "--max-steps", "60", "--out", str(out),
                          "--samples", "2", "--cache-dir", str(tmp_path / "cache")]) == 0
    assert len(list((tmp_path / "cache").glob("story.txt.char-*.tokens.npy"))) == 1
    log = read_log(out)
    losses = [r["loss"] for r in log if "loss" in r]
    assert losses[-1] < 0.6 * losses[0]
    valid = [r for r in log if "valid_loss" in r]
    assert [r["step"] for r in valid] == [60] and valid[0]["valid_loss"] < 2.0   # chance: 3.0
    printed = capsys.readouterr().out
    assert f"validation loss {valid[0]['valid_loss']:.4f} nats per token" in printed
    assert printed.count("--- sample") == 2
    ckpt = checkpoint.load(checkpoint.latest(out))
    assert ckpt.kind == lm.KIND and ckpt.vocab_id.startswith("char:")
    assert lm.LMConfig.from_dict(ckpt.config).vocab == len(set(text_file.read_text()))


def test_resume_after_ctrl_c_is_bit_identical(train_lm, text_file, tmp_path, monkeypatch, capsys):
    run = ["--data", str(text_file), *SMALL, "--max-steps", "20", "--samples", "0",
           "--learned-positions", "--dropout", "0.1"]
    assert train_lm.main(run + ["--out", str(tmp_path / "straight")]) == 0

    original, calls = train_lm.textdata.random_blocks, []

    def interrupted(*args, **kwargs):               # Ctrl-C while reading the 13th batch
        calls.append(1)
        if len(calls) == 13:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(train_lm.textdata, "random_blocks", interrupted)
    stopped = tmp_path / "stopped"
    assert train_lm.main(run + ["--out", str(stopped)]) == 130
    assert "interrupted at step 12" in capsys.readouterr().out
    monkeypatch.setattr(train_lm.textdata, "random_blocks", original)
    assert train_lm.main(run + ["--out", str(stopped), "--resume"]) == 0

    a = checkpoint.load(checkpoint.latest(tmp_path / "straight"))
    b = checkpoint.load(checkpoint.latest(stopped))
    assert a.step == b.step == 20
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])
        np.testing.assert_array_equal(a.optimizer_state["v"][name], b.optimizer_state["v"][name])
    capsys.readouterr()

    assert train_lm.main(run + ["--out", str(stopped)]) == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    assert train_lm.main(run + ["--out", str(stopped), "--resume", "--lr", "2e-2"]) == 2
    assert "--lr: the run has 0.01, now 0.02" in capsys.readouterr().err


@pytest.fixture(scope="module")
def trained(train_lm, text_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("trained")
    with mock.patch("sys.stdout"):
        assert train_lm.main(["--data", str(text_file), *SMALL, "--max-steps", "30", "--samples",
                              "0", "--out", str(out)]) == 0
    return checkpoint.latest(out)


def sample(train_lm, capsys, ckpt, *options):
    code = train_lm.main(["--sample", "--checkpoint", ckpt, "--prompt", "anna ",
                          "--max-new-tokens", "40", *options])
    return code, capsys.readouterr()


def test_sampling_is_reproducible_from_the_seed(train_lm, trained, capsys):
    code, first = sample(train_lm, capsys, trained, "--seed", "1", "--top-k", "5", "--top-p", "0.9")
    assert code == 0 and first.out.startswith("anna ") and first.err == ""
    assert len(first.out) == len("anna ") + 40 + 1             # characters, and a newline
    _, again = sample(train_lm, capsys, trained, "--seed", "1", "--top-k", "5", "--top-p", "0.9")
    _, other = sample(train_lm, capsys, trained, "--seed", "2", "--temperature", "2")
    assert again.out == first.out and other.out != first.out
    _, greedy = sample(train_lm, capsys, trained, "--greedy")
    _, greedy_again = sample(train_lm, capsys, trained, "--greedy", "--seed", "5")
    assert greedy.out == greedy_again.out


def test_sampling_errors(train_lm, trained, tmp_path, capsys):
    code, printed = sample(train_lm, capsys, trained, "--prompt", "ZZZ")
    assert code == 2 and "characters 'Z' are not in the vocabulary" in printed.err
    cfg = translator.Config.preset("tiny")
    other = tmp_path / "translation.npz"
    checkpoint.save(other, translator.init_params(cfg), step=1, config=cfg.to_dict(), vocab_id=None)
    code, printed = sample(train_lm, capsys, str(other))
    assert code == 2 and "holds an encoder-decoder Transformer" in printed.err
    code, printed = sample(train_lm, capsys, str(tmp_path / "missing.npz"))
    assert code == 2 and "missing.npz" in printed.err


def test_a_bad_prompt_is_refused_before_training(train_lm, text_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_lm.main(["--data", str(text_file), *SMALL, "--prompt", "ZZ", "--out",
                          str(out)]) == 2
    assert "characters 'Z' are not in the vocabulary" in capsys.readouterr().err
    assert not out.exists()


def test_defaults_are_the_cpu_preset(train_lm, text_file):
    args = train_lm.parse_args(["--data", str(text_file)])
    cfg = train_lm.model_config(args, 65)
    assert cfg == lm.LMConfig.preset("cpu")


@pytest.mark.parametrize("schedule, expected", [
    ("cosine", 1e-3),                                   # the last step reaches --min-lr
    ("linear", 1e-3),
    ("paper", 1e-2 * 32 ** -0.5 * min(10 ** -0.5, 10 * 5 ** -1.5)),    # eq. 3 x --lr-factor
])
def test_schedules(train_lm, text_file, tmp_path, schedule, expected):
    out = tmp_path / schedule
    rate = ["--lr-factor", "1e-2"] if schedule == "paper" else ["--lr", "1e-2"]
    at = SMALL.index("--lr")
    small = SMALL[:at] + SMALL[at + 2:]                 # the rate of each schedule: given below
    assert train_lm.main(["--data", str(text_file), *small, *rate, "--max-steps", "10",
                          "--samples", "0", "--schedule", schedule, "--out", str(out)]) == 0
    (logged,) = [r for r in read_log(out) if "lr" in r]
    assert logged["step"] == 10 and logged["lr"] == pytest.approx(expected, rel=1e-12)


def test_bpe_tokenizer_run(train_lm, text_file, tmp_path, capsys):
    out = tmp_path / "bpe"
    assert train_lm.main(["--data", str(text_file), *SMALL, "--tokenizer", "bpe",
                          "--vocab-size", "40", "--max-steps", "8", "--samples", "1",
                          "--out", str(out)]) == 0
    assert checkpoint.load(checkpoint.latest(out)).vocab_id.startswith("bpe:")
    assert "--- sample 1" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--max-steps", "0"], "argument --max-steps: must be an integer >= 1"),
    (["--schedule", "paper", "--lr", "1e-3"], "--lr is the peak of --schedule linear or cosine"),
    (["--lr", "nan"], "argument --lr: must be a finite number > 0"),
    (["--top-p", "0"], "argument --top-p: must be a finite number in (0, 1]"),
    (["--block-size", "-3"], "argument --block-size"),
    (["--tokenizer", "word"], "argument --tokenizer: invalid choice"),
    (["--warmup", "50", "--max-steps", "50"], "--warmup 50 must be below --max-steps 50"),
    (["--min-lr", "1", "--lr", "0.1"], "--min-lr 1 is above --lr 0.1"),
    (["--checkpoint", "x.npz"], "--checkpoint is for --sample"),
])
def test_bad_options_are_usage_errors(train_lm, text_file, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        train_lm.main(["--data", str(text_file), *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    ([], "--data PATH is required"),
    (["--sample"], "--sample needs --checkpoint"),
    (["--sample", "--checkpoint", "c.npz", "--data", "t.txt"], "--sample reads only --checkpoint"),
])
def test_missing_options_are_usage_errors(train_lm, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        train_lm.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_data_and_model_options_are_errors(train_lm, text_file, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    out = tmp_path / "run"
    assert train_lm.main(["--data", str(empty), "--out", str(out)]) == 2
    assert "holds no text" in capsys.readouterr().err
    assert train_lm.main(["--data", str(tmp_path / "none.txt"), "--out", str(out)]) == 2
    assert "none.txt: file not found" in capsys.readouterr().err
    assert train_lm.main(["--data", str(text_file), *SMALL, "--heads", "3", "--out",
                          str(out)]) == 2
    assert "must be divisible by n_heads=3" in capsys.readouterr().err
    assert train_lm.main(["--data", str(text_file), *SMALL, "--block-size", "13000",
                          "--batch-size", "1", "--out", str(out)]) == 2    # fits in memory
    assert "fewer than block_size + 1" in capsys.readouterr().err
    assert not out.exists()                     # nothing written for a refused run
