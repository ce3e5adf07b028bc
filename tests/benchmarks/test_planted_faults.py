"""The fault list of benchmarks/planted_faults.py still fits the code: each fault's snippet is
found once in its file, its edit changes something, and the tests it names exist. (Running the
faults takes the whole suite once per fault: that is the script's work, not this test's.)"""

import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


planted = load("planted_faults")
FAULTS = planted.FAULTS


def test_there_are_enough_faults_with_unique_names():
    names = [fault.name for fault in FAULTS]
    assert len(FAULTS) >= 30
    assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize("fault", FAULTS, ids=lambda fault: fault.name)
def test_each_fault_can_be_planted(fault):
    text = (ROOT / fault.where).read_text(encoding="utf-8")
    assert text.count(fault.old) == 1, f"{fault.name}: its snippet is not found once"
    assert fault.new != fault.old
    assert fault.tests and fault.what
    for test in fault.tests:
        assert (ROOT / test.split("::")[0]).is_file(), f"{fault.name}: {test} does not exist"


def test_the_script_checks_its_list_as_this_test_does():
    planted.check_faults(FAULTS, ROOT)
    wrong = FAULTS[0]._replace(old="a snippet found nowhere")
    with pytest.raises(planted.FaultError, match="occurs 0 times"):
        planted.check_faults([wrong], ROOT)


def test_a_planted_fault_is_undone_byte_for_byte(tmp_path):
    fault = FAULTS[0]
    copy = tmp_path / fault.where
    copy.parent.mkdir(parents=True)
    copy.write_bytes((ROOT / fault.where).read_bytes())
    before, times = copy.read_bytes(), copy.stat()
    with planted.Planted(tmp_path, fault, 1):
        assert fault.new in copy.read_text(encoding="utf-8")
        assert copy.stat().st_mtime_ns != times.st_mtime_ns
    assert copy.read_bytes() == before and copy.stat().st_mtime_ns == times.st_mtime_ns


def test_the_summary_line_names_the_failing_test():
    output = ("..F\n=== short test summary info ===\n"
              "FAILED tests/a.py::test_b[case one] - AssertionError: x - y\nFAILED tests/c.py::d\n")
    assert planted.FAILURE_LINE.search(output).group(1) == "tests/a.py::test_b[case one]"
    assert planted.FAILURE_LINE.search("ERROR tests/e.py\n").group(1) == "tests/e.py"


def test_tests_a_checkout_does_not_have_are_left_out(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_here():\n    pass\n")
    fault = FAULTS[0]._replace(tests=("tests/test_a.py::test_here[1]", "tests/test_a.py::test_gone",
                                      "tests/test_moved.py"))
    [left], missing = planted.with_tests_found(tmp_path, [fault])
    assert left.tests == ("tests/test_a.py::test_here[1]",)
    assert missing == ["tests/test_a.py::test_gone", "tests/test_moved.py"]


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(planted.FaultError, match=FAULTS[0].name):
        planted.chosen(["no-such-fault"])
