"""Tests of minitfm.cli.limits: size options checked against the libraries' limits and the memory
there is, before any work. Through the real command lines: absurd sizes end at once with status
2 and one ``error:`` line giving the estimate, the memory available and what fits. Directly: the
estimates of known small configs, byte for byte, and the largest value that fits."""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import os
import re
import sys
from pathlib import Path

import pytest

from minitfm import backend
from minitfm.backend import memory
from minitfm.cli import argtypes, limits
from minitfm.models import lm, translator
from tests.test_translate import write_checkpoint
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}
LINES = ["the cat sat on the mat", "a dog ran far away", "the house by the tree"] * 100


@pytest.fixture(autouse=True)
def numpy_only(numpy_backend):
    """Every test here runs on NumPy unless it asks for the CuPy double."""


def command(*args, stdin: str = "") -> tuple[int, str, str]:
    """``python ARGS``: its status, output and errors. That a refusal comes before the work is
    shown by what the command did not do (no run directory, nothing read or printed), never
    by a clock."""
    done = forkserver.run([sys.executable, *map(str, args)], input=stdin, capture_output=True,
                          text=True, env=ENV, timeout=60)
    return done.returncode, done.stdout, done.stderr


def assert_one_error(err: str) -> str:
    """The one ``error:`` line of a clean failure."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    return errors[0]


@pytest.fixture
def text(tmp_path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


# ---- the known cases, through the command lines -----------------------------------------------

def test_a_vocabulary_above_sentencepieces_int32_is_a_usage_error(text, tmp_path):
    code, _, err = command(ROOT / "train_lm.py", "--data", text, "--tokenizer", "bpe",
                                    "--vocab-size", 10**12, "--out", tmp_path / "run", "--quiet")
    assert code == 2
    line = assert_one_error(err)
    assert "--vocab-size: must be at most 2147483647" in line and "32-bit" in line
    assert not (tmp_path / "run").exists()


def test_a_vocabulary_the_text_cannot_make_is_refused_before_it_is_read(text, tmp_path):
    code, _, err = command(ROOT / "train_lm.py", "--data", text, "--tokenizer", "bpe",
                              "--vocab-size", 100_000, "--out", tmp_path / "run", "--quiet")
    assert code == 2
    size = text.stat().st_size
    assert f"error: --vocab-size 100000 is more pieces than {text} can make: {size:,} bytes" \
        in assert_one_error(err)
    assert f"use --vocab-size {size + 4} or less" in err
    assert "training a" not in err                   # no vocabulary training started


def test_a_batch_that_cannot_fit_is_refused_before_the_data_is_read(text, tmp_path):
    code, out, err = command(ROOT / "train_lm.py", "--data", text, "--batch-size",
                                      10**9, "--out", tmp_path / "run", "--quiet")
    assert code == 2
    line = assert_one_error(err)
    assert line.startswith("error: training needs about ") and " TiB of memory (" in line
    assert re.search(r"more than the [\d.]+ [KMGT]iB available \(", line), line
    fit = int(re.search(r"fits, the other sizes unchanged: --batch-size (\d+)", line)[1])
    assert 1 <= fit < 10**9
    assert "tokens" not in out and not (tmp_path / "run").exists()      # nothing read, nothing made


def test_a_beam_that_cannot_fit_is_refused_before_the_input_is_read(tmp_path):
    from minitfm.data.vocab import train_vocab
    from tests.test_translate import TEXT
    ckpt = write_checkpoint(tmp_path / "tiny.npz", train_vocab(TEXT * 4, 40,
                                                               hard_vocab_limit=False,
                                                               num_threads=1))
    code, out, err = command("-m", "minitfm.translate", "--checkpoint", ckpt,
                                      "--beam", 10**6, stdin="a man\n")
    assert code == 2 and out == ""
    line = assert_one_error(err)
    assert line.startswith("error: beam search needs about ") and "key/value cache" in line
    assert re.search(r"unchanged: .*--beam \d+", line), line


# ---- the estimates ----------------------------------------------------------------------------

def test_the_parameter_count_is_the_models_own():
    # the tiny LM by hand: embedding 11 x 8; per layer attention 4 d^2 + 4 d = 288, two
    # LayerNorms 2 x 16, feed-forward 2 d d_ff + d_ff + d = 212; the final LayerNorm 16
    assert limits.parameter_count(lm.PRESETS["tiny"]) == 88 + 2 * (288 + 32 + 212) + 16 == 1168
    for cfg in (lm.PRESETS["tiny"], translator.PRESETS["tiny"], translator.PRESETS["toy"]):
        params = lm.init_params(cfg) if isinstance(cfg, lm.LMConfig) else \
            translator.init_params(cfg)
        assert limits.parameter_count(cfg) == sum(a.size for a in params.values())
    assert limits.parameter_count(translator.Config.preset("base", n_heads=1)) == \
        limits.parameter_count(translator.PRESETS["base"])


def test_training_estimate_of_the_tiny_language_model():
    cfg = lm.PRESETS["tiny"]                         # V 11, L 2, d 8, d_ff 12, H 2, f = 4 bytes
    estimate = limits.training_estimate(cfg, rows=2, src_len=0, tgt_len=16)
    n = 2 * 16
    assert estimate.device == {
        "model and Adam": 4 * 1168 * 4,                                    # 18,688
        "one batch": 4 * (2 * (6 * n * 8 + 2 * n * 12 + 2 * 2 * 16 ** 2) + 2 * n * 11)}   # 29,440
    assert estimate.host == {"host batches": 20 * n}
    assert estimate.total == 18_688 + 29_440 + 640
    no_attention = limits.training_estimate(cfg, rows=2, src_len=0, tgt_len=16,
                                            attention=False)
    assert estimate.device["one batch"] - no_attention.device["one batch"] == 4 * 2 * 1024
    accumulating = limits.training_estimate(cfg, rows=2, src_len=0, tgt_len=16, update_freq=2)
    assert accumulating.device["model and Adam"] == 5 * 1168 * 4


def test_training_estimate_of_the_translator_counts_both_stacks():
    cfg = translator.PRESETS["tiny"]
    p = limits.parameter_count(cfg)
    b, s, t, d, d_ff, heads, v = 3, 5, 7, 8, 12, 2, 11
    expected = 4 * (2 * (6 * b * s * d + 2 * b * s * d_ff + b * heads * s * s)
                    + 2 * (10 * b * t * d + 2 * b * t * d_ff + b * heads * (t * t + t * s))
                    + 2 * b * t * v)
    estimate = limits.training_estimate(cfg, rows=b, src_len=s, tgt_len=t)
    assert estimate.device == {"model and Adam": 16 * p, "one batch": expected}
    assert estimate.host == {}


def test_decoding_and_sampling_estimates():
    tiny = translator.PRESETS["tiny"]               # L 2, d 8, V 11, max_len 64
    beam = limits.decoding_estimate(tiny, rows=3, params=False)
    assert beam.device == {"key/value cache": 2 * 4 * 2 * 3 * (52 + 2) * 8,    # C = 2 + 50
                           "step scores": 3 * 4 * 3 * 11}
    assert beam.total == 20_736 + 396
    capped = limits.decoding_estimate(tiny, rows=3, out_len=10)
    assert capped.device["key/value cache"] == 2 * 4 * 2 * 3 * 12 * 8
    assert capped.device["parameters"] == 4 * limits.parameter_count(tiny)
    sample = limits.sampling_estimate(lm.PRESETS["tiny"], new_tokens=100, params=False)
    assert sample.device == {"key/value cache": 2 * 4 * 2 * 16 * 8, "sampling step": 6 * 8 * 11}
    assert sample.host == {"sampled tokens": 48 * 100}


def test_float64_doubles_the_device_bytes():
    cfg = lm.PRESETS["tiny"]
    single = limits.training_estimate(cfg, rows=2, src_len=0, tgt_len=16)
    backend.set_float_dtype("float64")
    try:
        double = limits.training_estimate(cfg, rows=2, src_len=0, tgt_len=16)
    finally:
        backend.set_float_dtype("float32")
    assert double.device == {k: 2 * n for k, n in single.device.items()}


# ---- the check ---------------------------------------------------------------------------------

def linear(values: dict) -> limits.Estimate:
    return limits.Estimate({"work": 1000 * values["--rows"] * values["--width"]})


def test_the_largest_value_that_fits_is_exact():
    memory = (123_456, "test memory")
    sizes = {"--rows": (10**6, range(1, 10**6 + 1)), "--width": (4, range(1, 5))}
    with pytest.raises(limits.TooLarge) as error:
        limits.check_fits("work", sizes, linear, device=memory, measure=False)
    message = str(error.value)
    assert message.startswith("work needs about 3.7 GiB of memory (work 3.7 GiB), more than "
                              "the 120.6 KiB available (test memory)")
    assert message.endswith("the largest that fits, the other sizes unchanged: --rows 30")
    assert linear({"--rows": 30, "--width": 4}).total <= 123_456 \
        < linear({"--rows": 31, "--width": 4}).total
    assert isinstance(error.value, limits.UsageError)          # status 2, a usage error
    fits = limits.check_fits("work", {"--rows": (30, range(1, 31)),
                                      "--width": (4, range(1, 5))}, linear, device=memory,
                             measure=False)
    assert fits.total == 120_000


def test_two_options_that_could_fit_are_both_named_furthest_first():
    sizes = {"--rows": (100, range(1, 101)), "--width": (50, range(1, 51))}
    with pytest.raises(limits.TooLarge, match=r"unchanged: --width 2 or --rows 5$"):
        limits.check_fits("work", sizes, linear, device=(250_000, "m"), measure=False)


def test_nothing_fits_says_to_lower_several():
    sizes = {"--rows": (100, range(1, 101)), "--width": (50, range(1, 51))}
    with pytest.raises(limits.TooLarge, match="even with any one of --rows, --width at its "
                                              "smallest: lower several of them"):
        limits.check_fits("work", sizes, linear, device=(10_000, "m"), measure=False)


def test_one_option_that_fits_at_no_value_says_to_lower_what_it_is_counted_with():
    sizes = {"--rows": (100, range(1, 101))}
    with pytest.raises(limits.TooLarge, match="even with --rows 1, its smallest: lower the sizes "
                                              "it is counted with$"):
        limits.check_fits("work", sizes, lambda v: linear({**v, "--width": 4}), device=(10, "m"),
                          measure=False)


MAX_LEN_CONFIGS = [translator.Config.preset("tiny"), lm.LMConfig.preset("tiny"),
                   translator.Config.preset("tiny", d_model=512, n_heads=8)]


@pytest.mark.parametrize("cfg", MAX_LEN_CONFIGS)
@pytest.mark.parametrize("available", [10_000, 123_456_789, 3 * 2**30 + 17])
def test_the_largest_max_len_named_is_the_one_whose_position_table_fits(cfg, available):
    """A --max-len whose position table cannot be held names the largest that fits: that value
    passes the same check, one more does not (the memory a given figure, so on every machine)."""
    memory = (available, "a given figure")

    def check(max_len: int) -> None:
        limits.check_positions(dataclasses.replace(cfg, max_len=max_len), "the table",
                               "--max-len", device=memory, measure=False)
    with pytest.raises(limits.TooLarge) as refused:
        check(10**30)
    largest = refused.value.largest["--max-len"]
    assert str(refused.value).endswith(
        f"the largest that fits, the other sizes unchanged: --max-len {largest}")
    check(largest)
    with pytest.raises(limits.TooLarge, match=f"--max-len {largest}$"):
        check(largest + 1)
    per_position = (8 + 4) * cfg.d_model                # float64 computed, float32 kept
    assert largest == available // per_position


def test_export_names_the_largest_max_len_that_fits(monkeypatch):
    """The export's refusal of a model's max_len says what to do, with the value: a model
    trained with a --max-len of at most the largest whose table fits."""
    from minitfm.export import __main__ as export
    from minitfm.export.source import ExportError
    monkeypatch.setattr(memory, "available_memory", lambda: (10**6, "a given figure"))
    monkeypatch.setattr(memory, "host_available_memory", lambda: (10**6, "a given figure"))
    cfg = translator.Config.preset("tiny", max_len=10**9)
    with pytest.raises(ExportError) as refused:
        export.check_positions(argparse.Namespace(config=cfg))
    largest = 10**6 // ((8 + 4) * cfg.d_model)
    assert f"the largest that fits, the other sizes unchanged: max_len {largest}." \
        in str(refused.value)
    assert str(refused.value).endswith(f"export a model trained with a smaller --max-len, "
                                       f"{largest} at most here (train_wmt.py; 1024 by default)")
    export.check_positions(argparse.Namespace(config=dataclasses.replace(cfg, max_len=largest)))


def test_unknown_memory_is_not_checked():
    sizes = {"--rows": (10**9, range(1, 10**9 + 1)), "--width": (1, range(1, 2))}
    assert limits.check_fits("work", sizes, linear, measure=False).total == 10**12


def test_the_model_options_keep_the_config_valid():
    cfg = lm.LMConfig(vocab=100, n_layers=2, d_model=96, d_ff=64, n_heads=6, max_len=8)
    sizes = limits.model_sizes(cfg)
    assert all(d % 6 == 0 for d in sizes["--d-model"][1])
    assert sizes["--heads"][1] == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96]
    changed = limits.with_model_sizes(cfg, {"--d-model": 12, "--heads": 6}, max_len=4)
    assert (changed.d_model, changed.n_heads, changed.max_len) == (12, 6, 4)


def test_vocab_size_option_and_the_corpus_bound(tmp_path):
    parse = argtypes.vocab_size
    assert parse(str(2**31 - 1)) == 2**31 - 1
    for bad in (str(2**31), "7", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)
    plain = tmp_path / "a.txt"
    plain.write_text("abc\n")
    limits.check_vocab_for_corpus(8, [plain])                       # 4 bytes + 4 specials
    with pytest.raises(limits.TooLarge, match="use --vocab-size 8 or less"):
        limits.check_vocab_for_corpus(9, [plain])
    packed = tmp_path / "a.txt.gz"
    packed.write_bytes(gzip.compress(b"abc\n" * 1000))
    limits.check_vocab_for_corpus(2000, [packed])                   # gzip: left to training


# ---- available memory ----------------------------------------------------------------------------

def test_host_memory_is_memavailable_or_the_free_pages(monkeypatch):
    found = memory.host_available_memory()
    if Path("/proc/meminfo").exists():
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemAvailable:"))
        assert found[1] == "MemAvailable in /proc/meminfo"
        assert abs(found[0] - kib * 1024) < 2**30       # the same figure, a moment later

    def no_meminfo(*args, **kwargs):
        raise FileNotFoundError("/proc/meminfo")
    monkeypatch.setattr(memory, "open", no_meminfo, raising=False)
    fallback = memory.host_available_memory()
    assert fallback is None or (fallback[0] > 0 and fallback[1] == "free physical memory")
    monkeypatch.setattr(memory.os, "sysconf", lambda name: (_ for _ in ()).throw(ValueError()))
    assert memory.host_available_memory() is None
    assert memory.available_memory() is None                        # NumPy: the host's


def test_device_memory_on_cupy_is_the_free_memory_of_the_device(cupy_backend):
    free, where = memory.available_memory()
    assert where == "free on the GPU" and free == cupy_backend.cuda.runtime.memGetInfo()[0]
    array = cupy_backend.zeros(1 << 20, dtype=cupy_backend.float32)   # 4 MiB
    assert memory.available_memory()[0] == free - array.nbytes
    # on the GPU the device parts are held against the device, the host parts against the host
    estimate = limits.Estimate({"work": 10}, {"kept": 10**6})
    assert limits.check_fits("work", {}, lambda v: estimate, device=(100, "gpu"),
                             host=(10**6, "host"), measure=False) is estimate
    with pytest.raises(limits.TooLarge, match=r"more than the 100 B available \(gpu\)"):
        limits.check_fits("work", {}, lambda v: limits.Estimate({"work": 101}),
                          device=(100, "gpu"), host=(10**6, "host"), measure=False)
