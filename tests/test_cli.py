"""minitfm.cli.placing's process settings: keeping freed memory saves a step its page faults. And the
commands: the installed ones point at each command's main, the scripts at the top of the
repository run the same commands, and so does ``python -m minitfm.X`` for the commands whose code
lives in minitfm/cli/."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A few steps' worth of temporaries (as a small model's step allocates and frees them), counting
# the page faults they cost. Run in a fresh process: the setting lasts for the process.
STEPS = """
import resource, sys
import numpy as np
from minitfm.cli import placing
if sys.argv[1] == "reuse":
    assert placing.reuse_freed_memory() is True
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
before = faults()
for _ in range(50):
    a = np.ones((1024, 512), np.float32)      # 2 MiB
    b = np.ones((16, 4, 64, 64), np.float32)  # 1 MiB
    c = a * 2.0
    del a, c
    d = np.ones((64, 1024, 128), np.float32)  # 32 MiB
    del b, d
print(faults() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_reused_memory_costs_no_page_faults():
    def faults(mode):
        done = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True,
                              text=True, cwd=ROOT, check=True)
        return int(done.stdout)

    default, reused = faults("default"), faults("reuse")
    assert default > 20_000            # fresh pages every time: over 60,000 faults here
    assert reused < default / 10


COMMANDS = {"minitfm-train-toy", "minitfm-train-wmt", "minitfm-train-lm", "minitfm-translate",
            "minitfm-average", "minitfm-plot", "minitfm-gradcheck", "minitfm-kernelcheck",
            "minitfm-export", "minitfm-launch", "minitfm-learn"}


def project_scripts() -> dict[str, str]:
    """pyproject.toml's [project.scripts] (read plainly: tomllib is Python 3.11's)."""
    text = (ROOT / "pyproject.toml").read_text()
    table = text.split("[project.scripts]\n", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+) = "([\w.:]+)"$', table, flags=re.M))


def test_every_installed_command_is_a_commands_main():
    scripts = project_scripts()
    assert set(scripts) == COMMANDS
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        assert function == "main", name
        assert callable(getattr(importlib.import_module(module), function)), name


@pytest.mark.parametrize("script", ["train_toy.py", "train_wmt.py", "train_lm.py"])
def test_the_scripts_at_the_top_run_the_commands(script):
    done = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script} ") and "--max-steps" in done.stdout


@pytest.mark.parametrize("command", ["translate", "average", "plot", "launch"])
def test_python_m_runs_the_commands_of_the_cli_package(command):
    done = subprocess.run([sys.executable, "-m", f"minitfm.{command}", "--help"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m minitfm.{command}")
