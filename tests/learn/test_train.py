"""Training on the learner's code: the library's own code gives the library's losses bit for
bit; a passing exercise that computes something else in the model is caught on the same
parameters."""

from minitfm import exits
from minitfm.learn import __main__ as learn
from minitfm.learn import train
from minitfm.learn.exercises import EXERCISES, by_name
from minitfm.learn.workshop import Workshop
from tests.learn.conftest import write_exercise


def test_the_library_code_trains_as_the_library(folder, capsys):
    workshop = Workshop(folder)
    for ex in EXERCISES:
        if ex.kind != "kernel":
            write_exercise(folder, ex)
            workshop.passed(ex)
    with train.plain_numpy():
        library = train.train(12, 3)
        code = train.LearnerCode({e.name: workshop.file(e) for e in EXERCISES
                                  if e.kind != "kernel"})
        with code.on():
            from minitfm.layers import layernorm
            assert layernorm.backward.__module__ == "minitfm_workshop_layernorm"
            yours = train.train(12, 3, code.schedule)
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
        workshop.passed(ex)
        assert "out=None)" in path.read_text() or "else None" in path.read_text()
    assert learn.main(["--dir", str(folder), "train", "--steps", "3"]) == exits.DONE
    assert "within float32 rounding" in capsys.readouterr().out


def test_code_that_parts_from_the_library_is_caught(folder, capsys):
    workshop = Workshop(folder)
    ex = by_name("dropout")           # dropout is off in the toy model: wrong, and passing
    write_exercise(folder, ex, {"backward": [("apply(dy, cache.keep, cache.scale)", "dy")]})
    workshop.passed(ex)
    write_exercise(folder, by_name("loss"), {"backward": [("return dz, {}", "return 2 * dz, {}")]})
    workshop.passed(by_name("loss"))
    assert learn.main(["--dir", str(folder), "train", "--steps", "2"]) == exits.FAILED
    out = capsys.readouterr().out
    assert "parts from the library's on the same parameters" in out
