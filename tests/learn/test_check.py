"""Checking exercises: the library's own code passes every exercise; an untouched exercise is not
written; a syntax error or an exception is shown at its line of the learner's file. (Typical
mistakes planted in it, each with the diagnosis that names it: test_mistakes.py.)"""

import pytest

from minitfm.learn import check, report
from minitfm.learn.exercises import EXERCISES, by_name
from minitfm.learn.exercises import make
from minitfm.learn.workshop import Workshop
from tests.learn.conftest import filled, write_exercise


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.name)
def test_the_library_code_passes_every_exercise(ex, folder):
    path = write_exercise(folder, ex)
    result = check.run_check(ex, path)
    assert result.status == "pass", report.describe(result)
    assert result.cases and all(case.ok for case in result.cases)


def test_an_untouched_exercise_is_not_written(folder):
    workshop = Workshop(folder)
    for ex in (by_name("layernorm"), by_name("attention"), by_name("kernel_softmax")):
        result = check.run_check(ex, workshop.start(ex))
        assert result.status == "not written"
        assert "not written yet" in report.describe(result)


def test_one_function_left_of_several_is_named(folder):
    ex = by_name("attention")
    path = Workshop(folder).start(ex)
    path.write_text(filled(make(ex), ex.module, ("sdpa_backward", "self_backward")))
    result = check.run_check(ex, path)
    assert result.status == "fail"
    problems = [c.problem for c in result.cases if c.problem]
    assert len(problems) == 2 and all("not written yet: cross_backward" in p for p in problems)
    assert all(c.ok for c in result.cases if "cross" not in c.name)


def test_a_syntax_error_is_shown_at_its_line(folder):
    ex = by_name("linear")
    path = write_exercise(folder, ex)
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "dx = (dy2 @ cache.w.T)" in line)
    lines[at] = lines[at].replace("dx = (dy2", "dx = ((dy2")
    path.write_text("\n".join(lines) + "\n")
    result = check.run_check(ex, path)
    assert result.status == "error"
    assert f"{path.name}, line " in result.message
    assert "minitfm/" not in result.message


def test_an_exception_is_shown_at_the_learners_line(folder):
    ex = by_name("layernorm")
    path = write_exercise(folder, ex, {"backward": [("g *= rstd ", "g *= cache.rstdd ")]})
    result = check.run_check(ex, path)
    text = report.describe(result)
    line = next(n for n, s in enumerate(path.read_text().splitlines(), 1) if "cache.rstdd" in s)
    assert result.status == "fail"
    assert f"{path.name}, line {line}, in backward" in text
    assert "AttributeError" in text and "rstdd" in text
    assert "Traceback" not in text and "minitfm/layers" not in text


def test_an_exception_inside_the_library_is_shown_at_the_learners_call(folder):
    ex = by_name("feedforward")           # linear.backward gets an array of the wrong width
    path = write_exercise(folder, ex, {"backward": [("dx, g1 = linear.backward(da,",
                                                     "dx, g1 = linear.backward(da[..., 1:],")]})
    result = check.run_check(ex, path)
    text = report.describe(result)
    assert f"{path.name}, line " in text and "linear.backward(da[..., 1:]" in text
    assert "ValueError" in text and "minitfm/layers" not in text


def test_a_changed_forward_pass_is_said(folder):
    ex = by_name("linear")
    path = write_exercise(folder, ex)
    path.write_text(path.read_text().replace("y += b\n", "y += 2 * b\n"))
    result = check.run_check(ex, path)
    notes = [case.note for case in result.cases if case.note]
    assert notes and "your forward pass gives other outputs" in notes[0]


def test_the_first_wrong_element_is_reported(folder):
    ex = by_name("layernorm")
    path = write_exercise(folder, ex, {"backward": [("g -= mean_g ", "g -= 0.0 * mean_g ")]})
    result = check.run_check(ex, path)
    (dx,) = [a for a in result.cases[0].arrays if not a.ok]
    index, yours, numeric = dx.first
    assert dx.name == "x" and len(index) == 3 and yours != pytest.approx(numeric)
    assert "first wrong element" in report.describe(result)
