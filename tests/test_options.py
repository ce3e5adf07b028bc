"""One vocabulary for the three trainers (minitfm/cli/options.py): an option two trainers share
reads the same in both, old names still work and say the new one, the time limit has one unit, and
the parsed options become the one object the training loop is told."""

import argparse
import itertools
import re

import pytest

from minitfm.cli import options
from minitfm.commands import train_lm, train_toy, train_wmt
from minitfm.training.state import TrainOptions

TRAINERS = {"train_toy.py": train_toy, "train_wmt.py": train_wmt, "train_lm.py": train_lm}
ARGS = {"train_toy.py": [], "train_wmt.py": ["--trainpref", "x"], "train_lm.py": ["--data", "x"]}
RENAMED = {"--steps": "--max-steps", "--eval-every": "--valid-every"}


def visible_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's options by name, as its --help shows them (old names are hidden)."""
    return {flag: action for action in parser._actions if action.help != argparse.SUPPRESS
            for flag in action.option_strings}


def without_default(help: str) -> str:
    """A help text without the trainer's default, the last "(default ...)" of it."""
    return re.sub(r" \(default[^()]*(\([^()]*\)[^()]*)*\)$", "", help)


PARSERS = {name: visible_options(module.build_parser()) for name, module in TRAINERS.items()}


@pytest.mark.parametrize("a, b", list(itertools.combinations(PARSERS, 2)))
def test_an_option_two_trainers_share_reads_the_same_in_both(a, b):
    shared = sorted(set(PARSERS[a]) & set(PARSERS[b]) - {"-h", "--help"})
    assert len(shared) >= 25, shared
    for flag in shared:
        x, y = PARSERS[a][flag], PARSERS[b][flag]
        assert (x.type, x.metavar, x.nargs, x.const, x.dest) == \
            (y.type, y.metavar, y.nargs, y.const, y.dest), f"{flag}: {a} and {b} differ"
        assert without_default(x.help) == without_default(y.help), f"{flag}: {a} and {b} differ"
        assert x.help.endswith(")") or x.const is True, f"{flag} of {a} shows no default"


def test_every_trainer_has_the_shared_core_and_no_old_name_in_its_help():
    core = {"--layers", "--d-model", "--heads", "--d-ff", "--max-steps", "--time-limit",
            "--valid-every", "--log-every", "--save-every", "--keep-last", "--seed",
            "--precision", "--backend", "--threads", "--out", "--resume", "--best-metric"}
    for name, module in TRAINERS.items():
        assert core <= set(PARSERS[name]), f"{name} lacks {sorted(core - set(PARSERS[name]))}"
        text = module.build_parser().format_help()
        assert not [old for old in RENAMED if re.search(rf"{old}\b", text)], name


@pytest.mark.parametrize("name", TRAINERS)
@pytest.mark.parametrize("old, new, value", [("--steps", "max_steps", 700),
                                             ("--eval-every", "valid_every", 5)])
def test_old_names_work_and_say_the_new_one_in_one_line(name, old, new, value, capsys):
    args = TRAINERS[name].parse_args([*ARGS[name], old, str(value)])
    assert getattr(args, new) == value
    err = capsys.readouterr().err
    assert err == f"note: {old} is now {RENAMED[old]} (the old name works in this release)\n"


@pytest.mark.parametrize("name", TRAINERS)
@pytest.mark.parametrize("text, seconds", [("90s", 90.0), ("60m", 3600.0), ("1.5h", 5400.0),
                                           (" 2.5M ", 150.0)])
def test_the_time_limit_reads_the_same_in_every_trainer(name, text, seconds):
    assert TRAINERS[name].parse_args([*ARGS[name], "--time-limit", text]).time_limit == seconds


@pytest.mark.parametrize("name", TRAINERS)
@pytest.mark.parametrize("text", ["60", "0s", "1d", "m", "-5m", "nanm"])
def test_a_time_limit_without_its_unit_or_above_zero_is_refused(name, text, capsys):
    with pytest.raises(SystemExit) as stopped:
        TRAINERS[name].parse_args([*ARGS[name], f"--time-limit={text}"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "argument --time-limit: must be a time" in err
    assert ("60s or 60m?" in err) == (text == "60")


def test_the_parsed_options_become_one_train_options():
    args = train_wmt.parse_args(["--trainpref", "x", "--preset", "base", "--time-limit", "2h",
                                 "--best-metric", "bleu", "--validpref", "y", "--out", "r"])
    built = options.train_options(args, train_wmt.TRAINER)
    assert isinstance(built, TrainOptions)
    assert (built.max_steps, built.update_freq, built.warmup, built.valid_every) == \
        (100_000, 6, 4000, 2000)                                     # the base preset's row
    assert (built.time_limit, built.best_metric, built.out_dir, built.keep_last) == \
        (7200.0, "valid_bleu", "r", 5)
    assert built.command["preset"] == "base" and "preset" in built.defining
    toy = options.train_options(train_toy.parse_args(["--task", "sort"]), train_toy.TRAINER)
    assert (toy.max_steps, toy.log_every, toy.keep_last, toy.lr_factor) == (500, 10, 2, 0.05)
    lm = options.train_options(train_lm.parse_args(["--data", "x"]), train_lm.TRAINER)
    assert (lm.max_steps, lm.schedule, lm.lr, lm.weight_decay, lm.keep_last) == \
        (1000, "cosine", 6e-3, 0.1, 2)


@pytest.mark.parametrize("name, argv, message", [
    ("train_toy.py", ["--keep-best", "2"], "--keep-best ranks validations by --best-metric"),
    ("train_lm.py", ["--best-metric", "loss", "--patience", "2"], "--patience counts"),
    ("train_wmt.py", ["--lr", "1e-3"], "--lr is the peak of --schedule linear or cosine"),
    ("train_lm.py", ["--schedule", "paper", "--warmup", "0"], "needs --warmup >= 1"),
    ("train_wmt.py", ["--schedule", "cosine", "--max-steps", "900"], "--warmup 1000 must be"),
    ("train_lm.py", ["--min-lr", "1", "--lr", "0.5"], "--min-lr 1 is above --lr 0.5"),
])
def test_rules_between_shared_options_are_checked_before_any_work(name, argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        TRAINERS[name].parse_args([*ARGS[name], *argv])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_the_vocabulary_declares_each_option_once_with_its_help():
    flags = [option.flag for option in options.VOCABULARY.values()]
    assert len(flags) == len(set(flags))
    for option in options.VOCABULARY.values():
        assert option.help and "(default" not in option.help, option.flag
        assert all(alias not in flags for alias in option.aliases)
