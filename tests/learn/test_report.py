"""What a failing check prints fits on a screen: a diagnosis shared by many gradients is said once
with their count, a case wrong as one above takes a line, and so does a right one."""

from pathlib import Path

from minitfm.learn import report
from minitfm.learn.exercises import by_name
from minitfm.learn.report import ArrayResult, CaseResult, Report

ZERO = "all zero: nothing was written into it"


def model_case(name: str, wrong_prefix: str) -> CaseResult:
    """A case of the model's check whose gradients under ``wrong_prefix`` are all zero."""
    case = CaseResult(name, {"batch": 6})
    for part in ("enc", "dec"):
        for layer in range(3):
            for param in ("attn.w_qkv", "attn.b_qkv", "attn.w_o", "attn.b_o", "ln1.gamma",
                          "ln1.beta", "ff.w1", "ff.b1"):
                wrong = f"{part}.".startswith(wrong_prefix)
                case.arrays.append(ArrayResult(f"{part}.{layer}.{param}", 1.0 if wrong else 0.0,
                                               not wrong, ((0,), 0.0, 1.0) if wrong else None,
                                               ZERO if wrong else None))
    case.arrays.append(ArrayResult("emb", 0.0, True))
    return case


def test_a_diagnosis_shared_by_many_gradients_is_said_once_with_their_count():
    cases = [model_case(f"model ({kind})", "enc.") for kind in ("post-LN", "pre-LN", "shared")]
    text = report.describe(Report(by_name("model"), Path("17_model.py"), "fail", cases))
    assert text.count(ZERO) == 1, text
    assert "all 24 d(enc.*): WRONG, relative error 1.0e+00" in text, text
    assert text.count("all 24 d(enc.*) wrong, as above") == 2, text
    assert len(text.splitlines()) <= 10, text


def test_a_case_wrong_in_another_way_past_a_screen_takes_one_line():
    ex = by_name("attention")
    cases = []
    for i in range(7):
        case = CaseResult(f"case {i}", {"b": 3})
        for name in ("x", "w_qkv", "b_qkv", "w_o", "b_o"):
            case.arrays.append(ArrayResult(name, 0.5, False, ((0, 0, 0), 1.0, 2.0), f"{name}: "
                                           f"diagnosis number {i}, " + "words " * 30))
        cases.append(case)
    cases.append(CaseResult("a right case", {"b": 3}, [ArrayResult("x", 0.0, True)]))
    text = report.describe(Report(ex, Path("09_attention.py"), "fail", cases))
    assert len(text.splitlines()) <= report.LINES, text
    assert "(diagnosed once the cases above pass)" in text, text
    assert "  a right case: all 1 right" in text, text


def test_a_passing_report_shows_every_gradient():
    ex = by_name("layernorm")
    case = CaseResult("layernorm", {"b": 3}, [ArrayResult(n, 1e-11, True)
                                              for n in ("x", "gamma", "beta")],
                      confirmed="finite differences agree")
    text = report.describe(Report(ex, Path("06_layernorm.py"), "pass", [case]))
    assert all(f"d{n}  " in text for n in ("x", "gamma", "beta")), text
    assert "finite differences agree" in text
