"""How much memory new arrays can still take: the active backend's (a GPU's free memory, or the
host's) and the host's. The commands check their sizes against it before any work
(:mod:`minitfm.cli.limits`); :func:`minitfm.backend.memory_in_words` names the memory that a
message says ran out.
"""

from __future__ import annotations

import os

from minitfm import backend

__all__ = ["available_memory", "host_available_memory"]


def available_memory() -> tuple[int, str] | None:
    """``(bytes, where the number comes from)`` that new arrays of the active backend can still
    take: on CuPy the current device's free memory (``cudaMemGetInfo``), on NumPy the host's
    (:func:`host_available_memory`); None where the system does not say."""
    if backend.is_gpu():
        cupy = backend.xp
        free, _total = cupy.cuda.runtime.memGetInfo()
        return int(free), "free on the GPU"
    return host_available_memory()


def host_available_memory() -> tuple[int, str] | None:
    """``(bytes, source)`` the host can give new allocations without swapping: ``MemAvailable``
    of ``/proc/meminfo`` (Linux), else the free pages ``sysconf`` counts; None where neither
    exists."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, ValueError, IndexError):
        pass
    try:
        pages, page = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return (pages * page, "free physical memory") if pages > 0 and page > 0 else None
