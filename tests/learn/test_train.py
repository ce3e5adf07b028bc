"""Training on the learner's code: the library's own code gives the library's losses bit for
bit; a passing exercise that computes something else in the model is caught on the same
parameters."""

from minitfm.cli import exits
from minitfm.learn import __main__ as learn
from minitfm.learn import train
from minitfm.learn.exercises import EXERCISES, by_name
from minitfm.learn.workshop import Workshop
from minitfm.learn.kinds import KERNEL
from tests.learn.conftest import write_exercise


def test_the_library_code_trains_as_the_library(folder, capsys):
    workshop = Workshop(folder)
    for ex in EXERCISES:
        if ex.kind is not KERNEL:
            write_exercise(folder, ex)
            workshop.record_pass(ex)
    with train.plain_numpy():
        library = train.train(12, 3)
        code = train.LearnerCode({e.name: workshop.file(e) for e in EXERCISES
                                  if e.kind is not KERNEL})
        with code.on():
            from minitfm.layers import layernorm
            assert layernorm.backward.__module__ == "minitfm_workshop_layernorm"
            yours = train.train(12, 3)
    assert yours["losses"] == library["losses"]
    assert learn.main(["--dir", str(folder), "train", "--steps", "3"]) == exits.DONE
    out = capsys.readouterr().out
    assert "17 of 17" in out and "the library's bit for bit" in out


def test_the_gradient_rule_is_kept_for_code_that_returns_new_arrays(folder, capsys):
    """A backward pass may leave ``out`` alone: what it returns is written there (and added,
    for the embedding's table)."""
    workshop = Workshop(folder)
    for name in ("linear", "embedding"):
        ex = by_name(name)
        path = write_exercise(folder, ex, {"backward": [(
            'out=None if out is None else out["w"]', "out=None")] if name == "linear" else [(
                'if out is None else out["table"]', 'if True else None')]})
        workshop.record_pass(ex)
        assert "out=None)" in path.read_text() or "else None" in path.read_text()
    assert learn.main(["--dir", str(folder), "train", "--steps", "3"]) == exits.DONE
    assert "within float32 rounding" in capsys.readouterr().out


def test_code_that_parts_from_the_library_is_caught(folder, capsys):
    workshop = Workshop(folder)
    ex = by_name("dropout")           # dropout is off in the toy model: wrong, and passing
    write_exercise(folder, ex, {"backward": [("apply(dy, cache.keep, cache.scale)", "dy")]})
    workshop.record_pass(ex)
    write_exercise(folder, by_name("loss"), {"backward": [("return dz, {}", "return 2 * dz, {}")]})
    workshop.record_pass(by_name("loss"))
    assert learn.main(["--dir", str(folder), "train", "--steps", "2"]) == exits.FAILED
    out = capsys.readouterr().out
    assert "parts from the library's on the same parameters" in out


def test_train_on_nothing_written_says_so_and_fails(folder, capsys):
    assert learn.main(["--dir", str(folder), "train", "--steps", "3"]) == exits.FAILED
    out = capsys.readouterr().out
    assert "none of your code passes its check yet" in out and "start" in out
    assert "%" not in out and "your code computes" not in out


def test_train_says_whose_code_ran(folder, capsys):
    """One exercise passing, one written but failing: the claim is about the passing one alone,
    and the failing one is said to run the library's code."""
    workshop = Workshop(folder)
    write_exercise(folder, by_name("linear"))
    workshop.record_pass(by_name("linear"))
    write_exercise(folder, by_name("layernorm"), {"backward": [("g -= mean_g ", "g += mean_g ")]})
    assert learn.main(["--dir", str(folder), "train", "--steps", "3"]) == exits.DONE
    out = capsys.readouterr().out
    assert "your code: linear (1 of 17)" in out
    assert "the library's code: embedding," in out and "layernorm" in out.split(
        "the library's code:")[1].splitlines()[0]
    assert "your code (linear) computes the library's losses" in out
    assert "the library's code ran for embedding" in out


def test_the_exercise_that_parts_is_named(folder, capsys):
    workshop = Workshop(folder)
    for name in ("linear", "layernorm"):
        write_exercise(folder, by_name(name))
        workshop.record_pass(by_name(name))
    write_exercise(folder, by_name("loss"), {"backward": [("return dz, {}", "return 2 * dz, {}")]})
    workshop.record_pass(by_name("loss"))
    assert learn.main(["--dir", str(folder), "train", "--steps", "2"]) == exits.FAILED
    out = capsys.readouterr().out
    parting = out.split("each of your passing exercises alone on that update:")[1]
    assert "loss (14_loss.py) parts" in parting
    assert "linear" not in parting and "layernorm (" not in parting


def test_the_copy_task_is_train_toys():
    """The workshop's copy task has train_toy.py's settings (its own copy: the workshop imports
    no front end)."""
    from minitfm.commands.train_toy import TASK_DEFAULTS
    assert train.COPY == TASK_DEFAULTS["copy"]
