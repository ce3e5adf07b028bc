"""End-to-end tests of train_wmt.py on a tiny synthetic corpus, with a tiny model.

The corpus is English-like sentences over 20 words, "translated" word by word through a fixed
dictionary, so it is a real (learnable) parallel corpus; the target side of every split is
gzipped. A few steps of training cannot translate anything, so these tests check the plumbing:
files written, resuming, the time limit, evaluation only, and the errors a user can cause.
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path

import pytest

from minitfm import checkpoint, optim
from minitfm.cli import exits
from minitfm.bleu import corpus_bleu
from minitfm.commands import train_wmt
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the a cat dog sees big small red house tree runs under over green blue man woman eats "
         "apple bird").split()
DICTIONARY = {word: word[::-1] + "en" for word in WORDS}
TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--vocab-size", "64",
        "--max-tokens", "256", "--warmup", "10", "--valid-bleu-sentences", "8",
        "--backend", "numpy", "--quiet"]




def sentence_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))) for _ in range(n)]
    return src, [" ".join(DICTIONARY[word] for word in line.split()) for line in src]


def write_split(prefix: Path, src: list[str], tgt: list[str]) -> None:
    Path(f"{prefix}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    Path(f"{prefix}.de.gz").write_bytes(gzip.compress(("\n".join(tgt) + "\n").encode()))


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """DIR with train (300 pairs), val (30) and test (20), the German side gzipped."""
    data = tmp_path / "corpus"
    data.mkdir()
    for split, n, seed in (("train", 300, 0), ("val", 30, 1), ("test", 20, 2)):
        write_split(data / split, *sentence_pairs(n, seed))
    return data


def corpus_args(data: Path) -> list[str]:
    return ["--trainpref", str(data / "train"), "--validpref", str(data / "val"),
            "--testpref", str(data / "test"), "--source-lang", "en", "--target-lang", "de"]


def run(*args: str) -> int:
    return train_wmt.main([str(a) for a in args])


@pytest.fixture(autouse=True)
def numpy_only(numpy_backend):
    """train_wmt selects the backend globally: restore it after each test."""


def steps_on_disk(out: Path) -> list[int]:
    return [step for step, _ in checkpoint.list_checkpoints(out)]


def test_end_to_end_writes_checkpoints_log_average_and_bleu(corpus, tmp_path):
    out = tmp_path / "run"
    assert run(*corpus_args(corpus), *TINY, "--max-steps", 6, "--save-every", 2,
               "--valid-every", 3, "--keep-last", 3, "--average-last", 3, "--out", out) == 0
    assert steps_on_disk(out) == [2, 4, 6]
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    valid = [r for r in records if "valid_ppl" in r]
    assert [r["step"] for r in valid] == [3, 6] and all("valid_bleu" in r for r in valid)
    averaged = checkpoint.load(out / "averaged.npz", with_optimizer=False)
    assert averaged.extra["averaged_from"] == [
        "checkpoint_00000002.npz", "checkpoint_00000004.npz", "checkpoint_00000006.npz"]
    assert averaged.vocab_model is not None
    scores = json.loads((out / "averaged.test.bleu.json").read_text())
    assert scores["signature"].startswith("nrefs:1|case:mixed") and "tok:13a" in scores["signature"]
    assert 0.0 <= scores["bleu"] <= 100.0 and scores["sentences"] == 20 and scores["step"] == 6
    assert (scores["beam"], scores["lenpen"]) == (4, 0.6)
    assert len((out / "averaged.test.hyp.de").read_text(encoding="utf-8").splitlines()) == 20
    assert list((out / "data").glob("spm.en-de.64.model"))


def test_attention_relu_and_word_dropout_reach_the_model(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(*corpus_args(corpus), *TINY, "--max-steps", 2, "--attention-dropout", 0.1,
               "--relu-dropout", 0.2, "--dropout", 0.3, "--word-dropout", 0.15,
               "--out", out) == 0
    assert "dropout 0.3 (attention 0.1, ReLU 0.2), word dropout 0.15" in capsys.readouterr().out
    cfg = checkpoint.load(checkpoint.latest(out), with_optimizer=False).config
    assert (cfg["dropout"], cfg["attention_dropout"], cfg["relu_dropout"],
            cfg["word_dropout"]) == (0.3, 0.1, 0.2, 0.15)
    with pytest.raises(SystemExit):                                # a fraction in [0, 1)
        run(*corpus_args(corpus), *TINY, "--relu-dropout", 1.0, "--out", tmp_path / "other")
    assert "--relu-dropout" in capsys.readouterr().err


def test_pre_ln_reaches_the_model_and_defines_the_run(corpus, tmp_path, capsys):
    """--pre-ln trains the pre-LN model (a LayerNorm after each stack, which post-LN lacks),
    its checkpoint decodes in --eval-only, and a resume without it is refused."""
    out = tmp_path / "run"
    common = [*corpus_args(corpus), *TINY, "--out", out]
    assert run(*common, "--max-steps", 2, "--pre-ln") == 0
    assert "pre-LN, dropout" in capsys.readouterr().out
    saved = checkpoint.load(checkpoint.latest(out), with_optimizer=False)
    assert saved.config["pre_ln"] is True
    assert run(*corpus_args(corpus), *TINY, "--max-steps", 2, "--out", tmp_path / "post") == 0
    post = checkpoint.load(checkpoint.latest(tmp_path / "post"), with_optimizer=False)
    assert post.config["pre_ln"] is False
    assert set(saved.params) > set(post.params)          # the stacks' final LayerNorms
    capsys.readouterr()
    assert run(*common, "--max-steps", 4, "--resume") == exits.BAD_INPUT
    assert "'pre_ln': checkpoint has True, current run has False" in capsys.readouterr().err
    assert run(*common, "--max-steps", 4, "--resume", "--pre-ln") == 0
    assert run("--eval-only", "--checkpoint", checkpoint.latest(out), "--testpref",
               corpus / "test", "--beam", 2, "--backend", "numpy", "--quiet") == 0


def test_subword_dropout_reaches_the_batches_and_the_run_record(corpus, tmp_path, capsys):
    """BPE-dropout from the start: every update reads other pieces than a run without it (same
    seed, so the same pairs), so every loss differs; the rate is part of the run."""
    common = [*corpus_args(corpus), *TINY, "--max-steps", 12, "--log-every", 1]
    assert run(*common, "--subword-dropout", 0.3, "--out", tmp_path / "bpe") == 0
    assert "BPE-dropout 0.3" in capsys.readouterr().out
    assert run(*common, "--out", tmp_path / "plain") == 0
    losses = {name: [r["loss"] for r in map(json.loads, (tmp_path / name / "log.jsonl")
                                           .read_text().splitlines()) if "loss" in r]
              for name in ("bpe", "plain")}
    assert len(losses["bpe"]) == len(losses["plain"]) == 12
    assert all(a != b for a, b in zip(losses["bpe"], losses["plain"]))
    run_json = json.loads((tmp_path / "bpe" / "run.json").read_text())
    assert run_json["args"]["subword_dropout"] == 0.3
    capsys.readouterr()
    assert run(*common, "--max-steps", 14, "--resume", "--out", tmp_path / "bpe") == \
        exits.BAD_INPUT
    assert "--subword-dropout: the run has 0.3, now 0.0" in capsys.readouterr().err


def test_resume_continues_and_refuses_a_run_that_does_not_fit(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    common = [*corpus_args(corpus), *TINY, "--save-every", 2, "--out", out]
    assert run(*common, "--max-steps", 4) == 0
    assert run(*common, "--max-steps", 6) == exits.BAD_INPUT
    assert "--resume" in capsys.readouterr().err
    assert run(*common, "--max-steps", 6, "--resume") == 0
    assert steps_on_disk(out) == [2, 4, 6]
    logged = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert logged == sorted(logged) and logged[-1] == 6
    capsys.readouterr()
    assert run(*common, "--max-steps", 8, "--resume", "--d-model", 32) == exits.BAD_INPUT
    assert "--d-model: the run has 16, now 32" in capsys.readouterr().err
    assert run(*common, "--max-steps", 8, "--resume", "--dropout-start", 0.5) == \
        exits.BAD_INPUT
    assert "--dropout-start: the run has 0.0, now 0.5" in capsys.readouterr().err
    assert run(*common, "--max-steps", 8, "--resume", "--attention-dropout", 0.1) == \
        exits.BAD_INPUT
    assert "--attention-dropout: the run has 0.0 (its preset's), now 0.1" in capsys.readouterr().err


def test_vocabulary_is_reused_and_a_changed_one_is_refused_on_resume(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    common = [*corpus_args(corpus), *TINY, "--out", out, "--data-dir", tmp_path / "data"]
    assert run(*common, "--max-steps", 2) == 0
    model_file = next((tmp_path / "data").glob("spm.*.model"))
    stamp = model_file.stat().st_mtime_ns
    assert run(*common, "--max-steps", 3, "--resume") == 0
    assert model_file.stat().st_mtime_ns == stamp
    capsys.readouterr()
    assert run(*common, "--max-steps", 4, "--resume", "--vocab-size", 48) == exits.BAD_INPUT
    assert "vocab" in capsys.readouterr().err


def test_time_limit_stops_early_with_a_checkpoint(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(*corpus_args(corpus), *TINY, "--max-steps", 1000, "--time-limit", "0.0006s",
               "--out", out) == 0
    steps = steps_on_disk(out)
    assert len(steps) == 1 and 1 <= steps[0] < 1000
    assert "time limit" in capsys.readouterr().out
    assert (out / f"checkpoint_{steps[0]:08d}.test.bleu.json").is_file()
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == steps[0] and "valid_ppl" in records[-1]


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_decay_schedules_peak_after_the_warmup_and_end_at_min_lr(corpus, tmp_path, schedule):
    out = tmp_path / schedule
    assert run(*corpus_args(corpus), *TINY, "--max-steps", 6, "--warmup", 2, "--schedule",
               schedule, "--lr", 0.004, "--min-lr", 0.001, "--log-every", 1,
               "--average-last", 1, "--out", out) == 0
    lrs = [r["lr"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())
           if "lr" in r]
    assert lrs[:2] == pytest.approx([0.002, 0.004]) and lrs[-1] == pytest.approx(0.001)
    assert all(a > b for a, b in zip(lrs[1:], lrs[2:]))          # decaying after the warmup


def test_decay_schedule_peaks_at_the_papers_rate_by_default(corpus, tmp_path):
    out = tmp_path / "run"
    assert run(*corpus_args(corpus), *TINY, "--max-steps", 4, "--warmup", 2, "--lr-factor", 2,
               "--schedule", "linear", "--log-every", 1, "--average-last", 1, "--out", out) == 0
    lrs = [r["lr"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())
           if "lr" in r]
    d_model = json.loads((out / "run.json").read_text())["config"]["d_model"]
    assert lrs[1] == pytest.approx(2 * (d_model * 2) ** -0.5) and lrs[-1] == 0.0


def test_cooldown_ends_the_papers_schedule_near_zero(corpus, tmp_path):
    out = tmp_path / "run"
    assert run(*corpus_args(corpus), *TINY, "--max-steps", 10, "--warmup", 2, "--cooldown", 0.5,
               "--log-every", 1, "--average-last", 1, "--out", out) == 0
    lrs = [r["lr"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())
           if "lr" in r]
    paper = optim.LRSchedule(json.loads((out / "run.json").read_text())["config"]["d_model"], 2)
    assert lrs[:6] == pytest.approx([paper(k) for k in range(1, 7)])
    assert lrs[6:] == pytest.approx([paper(k) * (10 - k + 1) / 5 for k in range(7, 11)])


@pytest.mark.parametrize("options, message", [
    (["--schedule", "paper", "--lr", "0.001"], "--lr-factor"),
    (["--schedule", "linear", "--warmup", "6", "--max-steps", "6"], "below --max-steps"),
    (["--schedule", "cosine", "--lr", "0.001", "--min-lr", "0.01"], "above --lr"),
])
def test_schedule_options_that_do_not_fit_are_usage_errors(corpus, tmp_path, capsys, options,
                                                           message):
    with pytest.raises(SystemExit):
        run(*corpus_args(corpus), *TINY, *options, "--out", tmp_path / "run")
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def sgml(path: Path, kind: str, lang: str, lines: list[str]) -> Path:
    segs = "\n".join(f'<seg id="{i}">{line}</seg>' for i, line in enumerate(lines, start=1))
    path.write_text(f'<{kind} setid="t" srclang="en" trglang="de">\n<doc docid="d1" '
                    f'genre="news" origlang="en">\n{segs}\n</doc>\n</{kind}>\n', encoding="utf-8")
    return path


def test_eval_only_scores_a_checkpoint_on_an_sgml_test_set(corpus, tmp_path):
    out = tmp_path / "run"
    assert run(*corpus_args(corpus), *TINY, "--max-steps", 2, "--out", out) == 0
    src, ref = sentence_pairs(12, seed=3)
    test_src = sgml(tmp_path / "test-src.en.sgm", "srcset", "en", src)
    test_ref = sgml(tmp_path / "test-ref.de.sgm", "refset", "de", ref)
    ckpt = out / "checkpoint_00000002.npz"
    assert run("--eval-only", "--checkpoint", ckpt, "--test-src", test_src, "--test-ref",
               test_ref, "--beam", 2, "--backend", "numpy", "--quiet") == 0
    scores = json.loads((out / "checkpoint_00000002.test.bleu.json").read_text())
    assert scores["sentences"] == 12 and scores["test_ref"] == str(test_ref)
    assert scores["beam"] == 2 and scores["signature"].startswith("nrefs:1")


def test_mismatched_line_counts_are_one_clear_error(corpus, tmp_path):
    src, tgt = sentence_pairs(300, seed=0)
    write_split(corpus / "train", src, tgt[:-1])
    done = forkserver.run([sys.executable, str(ROOT / "train_wmt.py"), *corpus_args(corpus),
                           *TINY, "--max-steps", "2", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == exits.BAD_INPUT
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "misaligned corpus" in errors[0] and "300" in errors[0]
    assert "Traceback" not in done.stderr


def test_missing_files_and_bad_options_are_errors(corpus, tmp_path, capsys):
    assert run("--trainpref", tmp_path / "nowhere", *TINY, "--out", tmp_path / "run") == \
        exits.BAD_INPUT
    assert "no 'en' side found" in capsys.readouterr().err
    assert run(*corpus_args(corpus), *TINY, "--d-model", 15, "--out", tmp_path / "run") == \
        exits.BAD_INPUT
    assert "divisible" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run(*corpus_args(corpus), "--keep-last", 2)


def test_corpus_bleu_scores_and_signs():
    refs = ["ein Hund läuft .", "die Katze schläft auf dem Sofa ."]
    perfect = corpus_bleu(refs, refs)
    assert perfect.bleu == pytest.approx(100.0) and perfect.sentences == 2
    assert "tok:13a" in perfect.signature and perfect.signature in str(perfect)
    assert corpus_bleu(["x", "y"], refs).bleu < 1.0
    with pytest.raises(ValueError, match="2 references"):
        corpus_bleu(["only one"], refs)
