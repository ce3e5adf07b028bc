"""benchmarks/gpu_check.py: its parts in the default run (in-process, no device), and the whole
check end to end on the CuPy double under CuPy 14's and 13's rules (``-m slow``: about half a
minute each), where every section runs at ``--smoke`` sizes and both report files are read back."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import cupy_double_env
from tests.test_train_wmt import corpus  # noqa: F401  (a fixture: a tiny en-de corpus)

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture
def modules(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_check_device
    import gpu_check_pytest
    import gpu_check_steps
    return gpu_check_device, gpu_check_pytest, gpu_check_steps


def test_pytest_outcomes_are_summarised_with_what_the_budget_left_out(modules):
    _, plugin, _ = modules
    events = [{"collected": ["a", "b", "c", "d", "e", "f"]},
              {"test": "tests/x.py", "outcome": "error", "when": "collect", "message": "no module"},
              {"started": "a"}, {"test": "a", "outcome": "passed", "message": ""},
              {"started": "b"}, {"test": "b", "outcome": "failed", "message": "assert 1 == 2"},
              {"started": "c"}, {"test": "c", "outcome": "skipped", "message": "no MPI"},
              {"started": "d"}, {"test": "d", "outcome": "passed", "message": ""},
              {"test": "d", "outcome": "error", "when": "teardown", "message": "leak"},
              {"started": "e"}]
    summary = plugin.summarise(events)
    assert (summary["collected"], summary["passed"], summary["failed"], summary["skipped"],
            summary["errors"]) == (6, 1, 1, 1, 2)
    assert [f["test"] for f in summary["failures"]] == ["b", "d", "tests/x.py"]
    assert summary["interrupted"] == ["e"] and summary["left_out_for_time"] == ["f"]


def test_the_largest_fit_is_found_within_an_eighth(modules):
    *_, steps = modules
    tried = []

    def fits(tokens):
        tried.append(tokens)
        return tokens <= 5000
    found = steps.largest_fit(fits, 512, 1 << 16, time.time() + 60)
    assert tried[:5] == [512, 1024, 2048, 4096, 8192]
    assert 5000 - 5000 // 8 <= found["largest_fit"] <= 5000 < found["smallest_failure"]
    assert found["smallest_failure"] - found["largest_fit"] <= found["largest_fit"] // 8
    assert [p["fits"] for p in found["probes"]] == [t <= 5000 for t in tried]
    capped = steps.largest_fit(lambda tokens: True, 512, 2048, time.time() + 60)
    assert (capped["largest_fit"], capped["stopped_for"]) == (2048, "the cap")
    late = steps.largest_fit(fits, 512, 1 << 16, time.time() - 1)
    assert (late["largest_fit"], late["probes"], late["stopped_for"]) == (None, [], "time")


@pytest.mark.parametrize("name, tf32", [("NVIDIA H100 80GB HBM3", 494.7),
                                        ("NVIDIA H100 PCIe", 378.0), ("NVIDIA H200", 494.7),
                                        ("NVIDIA A100-SXM4-80GB", 156.0), ("NVIDIA L4", 60.0),
                                        ("NVIDIA L40S", 183.0), ("NVIDIA L40", None),
                                        ("Tesla T4", None)])
def test_dense_peaks_by_card_name(modules, name, tf32):
    device, *_ = modules
    peaks = device.table_peaks(name)
    assert (peaks and peaks["tf32"]) == tf32
    if peaks:
        assert peaks["fp32"] < peaks["tf32"] < peaks["fp16"]


# ---- the whole check, on the double --------------------------------------------------------------

def check_report(report: dict, markdown: str) -> None:
    sections = report["sections"]
    assert list(sections) == ["device", "kernels", "pytest", "base", "big", "multi30k"]
    assert all(s["status"] == "ok" for s in sections.values()), sections
    device = sections["device"]
    assert device["cupy_double"] and device["compute_capability"] == "9.0"
    assert device["default_precision"].startswith("tf32")
    assert device["memory_bytes"] == 4 << 20
    for key in ("gpu", "driver_cuda", "runtime_cuda", "cupy", "numpy", "pytorch", "python"):
        assert device[key], key
    kernels = sections["kernels"]
    assert kernels["all_equal"] and {r["kernel"] for r in kernels["rows"] if "kernel" in r}
    tests = sections["pytest"]
    assert tests["collected"] >= 3 and tests["failed"] == tests["errors"] == 0, tests
    assert tests["passed"] + tests["skipped"] + len(tests["interrupted"]) + \
        len(tests["left_out_for_time"]) == tests["collected"]
    base = sections["base"]
    rows = {(r["contender"], r["precision"]): r for r in base["rows"]}
    assert len(rows) == 7 and 0 < base["batched_fp32_share"] < 1
    for who, precision in (("minitfm", "fp32"), ("minitfm", "tf32"), ("minitfm fused", "tf32"),
                           ("minitfm fused", "fp16")):
        row = rows[who, precision]
        assert row["step_s"] > 0 and row["target_tokens_per_s"] > 0, row
        assert row["launches_per_update"] > 20 and "double" in row["launches_counted_by"]
    assert rows["minitfm fused", "tf32"]["launches_per_update"] < \
        rows["minitfm", "tf32"]["launches_per_update"] / 2
    torch_rows = [r for (who, _), r in rows.items() if who != "minitfm"]
    assert all(r["status"] in ("ok", "skipped") for r in torch_rows), torch_rows
    big = sections["big"]
    assert big["largest_fit"] and big["smallest_failure"] > big["largest_fit"], big
    assert any(not p["fits"] for p in big["probes"])                 # the memory ran out once
    m30k = sections["multi30k"]
    assert m30k["valid_bleu"] >= 0 and m30k["tokens_per_s"] > 0 and m30k["steps"] == 3, m30k
    assert "precision tf32" in m30k["first_line"]
    for title in ("## Device", "## Fused kernels against their plain twins", "## pytest -m gpu", "## The base update", "| minitfm | tf32 |",
                  "## The big preset's largest batch", "Greedy validation BLEU"):
        assert title in markdown, title


@pytest.mark.slow
@pytest.mark.parametrize("rules", ["14", "13"])
def test_the_check_runs_end_to_end_on_the_double(rules, corpus, tmp_path):  # noqa: F811
    env = cupy_double_env(rules)
    env["CUPY_DOUBLE_MEMORY"] = str(4 << 20)    # 4 MiB: the big search runs out of memory
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--data", str(corpus),
                           "--out", str(out), "--smoke", "--pytest-budget", "4"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    markdown = (out / "gpu_check.md").read_text()
    check_report(json.loads((out / "gpu_check.json").read_text()), markdown)
    assert markdown in done.stdout
