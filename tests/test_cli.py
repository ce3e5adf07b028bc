"""minitfm.cli's process settings: keeping freed memory saves a step its page faults."""

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
from minitfm import cli
if sys.argv[1] == "reuse":
    assert cli.reuse_freed_memory() is True
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
