"""What the GPU check measures with: the device and the versions at hand, the card's dense peak
for each precision, the memory a run held, and the kernels one update launches.

Peaks: NVIDIA's data-sheet figures for dense products (no structured sparsity; the sheets' TF32
and FP16 figures with sparsity are twice these), at boost clock, for the cards named in
``PEAKS``; any other card falls back to the best of large square products measured in the run
(``measured_peaks``), and the report says which was used.

Kernel launches: on the CuPy double, its count (every operation that writes device memory,
tests/cupy_double/RULES.md); on a real device, the kernels and memsets that PyTorch's profiler
(CUPTI, which sees every kernel of the process, CuPy's included) records in one update; without
PyTorch, none is counted.
"""

from __future__ import annotations

import gc
import platform
import re
import time

import numpy

from minitfm import backend
from minitfm.backend import products

# TFLOP/s, dense: (pattern of the CUDA device name, fp32, tf32, fp16 tensor cores with float32
# sums); the first match wins
PEAKS = (
    (r"H100 NVL", 60.0, 417.5, 835.5),
    (r"H100.*PCIe", 51.2, 378.0, 756.0),
    (r"H100", 67.0, 494.7, 989.4),          # SXM5 ("NVIDIA H100 80GB HBM3")
    (r"H200 NVL", 60.0, 417.5, 835.5),
    (r"H200", 67.0, 494.7, 989.4),          # SXM
    (r"A100", 19.5, 156.0, 312.0),
    (r"L40S", 91.6, 183.0, 362.1),
    (r"\bL4\b", 30.3, 60.0, 121.0),
)
PEAK_PRECISIONS = ("fp32", "tf32", "fp16")


def cupy_module():
    """The active CuPy module (the backend must be ``cupy``)."""
    if not backend.is_gpu():
        raise RuntimeError("the GPU check runs on the cupy backend")
    return backend.xp


def on_double() -> bool:
    """Whether ``cupy`` is the test double (figures are then meaningless, counts are not)."""
    return hasattr(cupy_module(), "_double")


def cuda_version(number: int) -> str:
    """CUDA's ``1000 * major + 10 * minor`` as ``major.minor``."""
    return f"{number // 1000}.{number % 1000 // 10}"


def import_torch() -> tuple[object | None, str]:
    """``(torch, its version)``, or ``(None, why not)``: not installed, or failing to import."""
    try:
        import torch
    except ImportError:
        return None, "not installed"
    except Exception as exc:            # a broken install (CUDA libraries): say so, go on
        return None, f"not importable ({type(exc).__name__}: {exc})"
    return torch, torch.__version__


def device_info() -> dict:
    """The GPU's name, memory and compute capability; the driver, CUDA runtime, CuPy, NumPy,
    PyTorch and Python versions."""
    cupy = cupy_module()
    runtime = cupy.cuda.runtime
    device = cupy.cuda.Device()
    name = runtime.getDeviceProperties(device.id)["name"]
    free, total = runtime.memGetInfo()
    capability = int(device.compute_capability)
    torch, torch_version = import_torch()
    info = {"gpu": name.decode() if isinstance(name, bytes) else str(name),
            "memory_bytes": int(total), "memory_gib": round(total / 2 ** 30, 1),
            "free_gib": round(free / 2 ** 30, 1),
            "compute_capability": f"{capability // 10}.{capability % 10}",
            "driver_cuda": cuda_version(runtime.driverGetVersion()),
            "runtime_cuda": cuda_version(runtime.runtimeGetVersion()),
            "cupy": cupy.__version__, "numpy": numpy.__version__,
            "pytorch": torch_version,
            "python": platform.python_version(), "cupy_double": on_double()}
    if torch:
        info["pytorch_cuda"] = (f"{torch.version.cuda}, {torch.cuda.device_count()} device(s)"
                                if torch.cuda.is_available() else "no CUDA device")
    return info


def table_peaks(gpu: str) -> dict | None:
    """The data sheet's dense TFLOP/s for ``gpu`` by precision, or None for a card not listed."""
    for pattern, *figures in PEAKS:
        if re.search(pattern, gpu):
            return dict(zip(PEAK_PRECISIONS, figures))
    return None


def sync() -> None:
    cupy_module().cuda.Device().synchronize()


def measured_peaks(n: int, repeats: int = 3) -> dict:
    """TFLOP/s of the best of ``repeats`` (n x n) @ (n x n) products through CuPy: float32 in
    plain float32 and on TF32 (when the card has it), and float16 (tensor cores)."""
    cupy = cupy_module()
    a32 = cupy.ones((n, n), dtype=cupy.float32)
    result = {}
    for precision, dtype in (("fp32", cupy.float32), ("tf32", cupy.float32),
                             ("fp16", cupy.float16)):
        if precision == "tf32" and (int(cupy.cuda.Device().compute_capability)
                                   < products.TF32_CAPABILITY):
            continue
        if precision != "fp16":
            products.set_precision(precision)
        a = a32.astype(dtype)
        best = float("inf")
        for _ in range(repeats + 1):                 # the first one compiles, warms up
            sync()
            start = time.perf_counter()
            a @ a
            sync()
            best = min(best, time.perf_counter() - start)
        result[precision] = 2 * n ** 3 / best / 1e12
    products.set_precision(None)
    return result


def peaks(gpu: str, n: int) -> dict:
    """The dense peaks the fractions use: the table's for a listed card, else measured."""
    listed = table_peaks(gpu)
    if listed is not None:
        return {"source": "data sheet (dense)", "tflops": listed}
    return {"source": f"measured here: best {n}x{n} product (no data-sheet figure for {gpu})",
            "tflops": measured_peaks(n)}


# ---- memory ------------------------------------------------------------------------------------

def release_cupy_memory() -> None:
    """Free what nothing refers to, and hand CuPy's cached blocks back to the device."""
    gc.collect()
    cupy_module().get_default_memory_pool().free_all_blocks()


def cupy_pool_bytes() -> int:
    """The bytes CuPy's memory pool holds: after steps that started from an emptied pool, their
    peak (the pool keeps what it once took)."""
    return int(cupy_module().get_default_memory_pool().total_bytes())


# ---- kernel launches -----------------------------------------------------------------------------

def count_launches(run) -> tuple[int | None, str]:
    """``(launches, how counted)`` of ``run()``, one update of minitfm on CuPy: the double's
    count, or PyTorch's profiler on a device; (None, why) where nothing counts them."""
    cupy = cupy_module()
    if on_double():
        with cupy._double.counting() as counted:
            run()
        return counted.launches, "the CuPy double's count (one per CuPy call: RULES.md)"
    launches, how = profiled_launches(run)
    if launches == 0:                     # CUPTI saw none of CuPy's kernels: nothing measured
        return None, "not counted: PyTorch's profiler saw no kernel of CuPy's"
    return launches, how


def profiled_launches(run) -> tuple[int | None, str]:
    """The kernels and memsets PyTorch's profiler sees on the device while ``run()`` runs."""
    torch, _ = import_torch()
    if torch is None or not torch.cuda.is_available():
        return None, "not counted: PyTorch's profiler (CUPTI) counts them, and it is missing"
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        if backend.is_gpu():
            sync()
        torch.cuda.synchronize()
    on_device = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    launched = [e for e in on_device if not e.name.startswith("Memcpy")]
    return len(launched), "PyTorch's profiler: kernels and memsets seen on the device"
