import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from threadpoolctl import ThreadpoolController

from minitfm import backend
from minitfm.backend import products
from minitfm.cli import placing

settings.register_profile("default", deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
# CI draws the same examples on every run (derived from each test's name), so that a submission
# is judged on the code, not on the draw; a developer's runs draw new examples every time.
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")

# The tests' models are tiny: a second BLAS thread costs more than it brings, and on a machine
# whose cores are busy its waiting spins cost many times the work (a 300-update training, 2 s of
# CPU on one thread, took 30 s on two). Each test, and the fixtures it sets up, start with one,
# whatever an earlier test's placement set; commands the tests start choose their own threads.
BLAS = ThreadpoolController()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    BLAS.limit(limits=1, user_api="blas")


# The tests start some 400 commands, most forked from a server that imported the package once
# (tests/forkserver.py), some as Python processes of their own, each importing it anew. Where
# PYTHONDONTWRITEBYTECODE is set (container images often set it), each of those compiled every
# module from its source: 0.25 s of the 0.7 s a command took to start on a 2-core Zen 3.
# So the commands a test starts (and the server) keep their compiled modules in a folder of
# this session's own (PYTHONPYCACHEPREFIX; made by the first, read by the others), removed at
# the end: nothing is written beside the sources or the installed packages, as the setting
# asks. The test processes themselves import once and are left as they are.
PYCACHE, SESSION_PYCACHE = "PYTHONPYCACHEPREFIX", "MINITFM_TESTS_PYCACHE"


# The commands the tests start, and those they run in this process, take the plain kernels
# (MINITFM_KERNELS, the default of --kernels) unless a test chooses them: on the CPU the default,
# the row passes' compiled loops, costs each process about a second of CPU before its first
# update (importing Numba and loading its machine code), more than a test's few tiny updates
# take, and some 150 processes train. The compiled loops and the row passes are the subject of
# their own tests (tests/layers/test_compiled_rows.py, tests/test_rows.py, ...), and the tests
# of the default choice start their commands without the variable (see ``default_kernels``).
KERNELS = placing.KERNELS_VARIABLE


def default_kernels(env=None) -> dict:
    """``env`` (default: this process's environment) without MINITFM_KERNELS: a command started
    with it chooses its kernels as a user's does."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k != KERNELS}


def pytest_configure(config):
    os.environ.setdefault(KERNELS, "plain")
    worker = hasattr(config, "workerinput")
    if not worker:
        if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get(PYCACHE):
            return
        config._pycache = os.environ[SESSION_PYCACHE] = tempfile.mkdtemp(prefix="minitfm-pycache-")
    # for the commands this process starts (not for the workers it starts: each sets its own)
    if os.environ.get(SESSION_PYCACHE) and (worker or not getattr(config.option, "numprocesses",
                                                                   None)):
        os.environ[PYCACHE] = os.environ[SESSION_PYCACHE]
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_unconfigure(config):
    if getattr(config, "_pycache", None):
        shutil.rmtree(config._pycache, ignore_errors=True)


# Both cores of a 2-core machine: a plain `pytest` runs its files on as many pytest-xdist workers
# as there are cores, up to 4, a file's tests on one worker (its module fixtures made once).
# Not where `-n` was given, in a worker, for collection or --pdb, nor with `-m gpu` (one device,
# and the GPU check times the run itself); without pytest-xdist the tests run in one process.
MAX_WORKERS = 4


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    option = config.option
    if (not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput")
            or getattr(option, "numprocesses", None) is not None or option.collectonly
            or option.usepdb or real_gpu_run(config)):
        return
    workers = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                  else os.cpu_count() or 1, MAX_WORKERS)
    if workers > 1:
        option.numprocesses, option.dist = workers, "loadfile"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Every test that starts MPI workers is slow too: out of the default run (mpiexec's start and
    its workers' waits, some 40 s in all, for code a commit rarely touches), in ``-m slow`` and
    ``-m mpi``, which CI runs. Before the marker expression selects (tryfirst)."""
    for item in items:
        if item.get_closest_marker("mpi") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


def cupy_device_available() -> bool:
    try:
        import cupy
        return bool(cupy.is_available())
    except Exception:
        return False


@pytest.fixture(autouse=True)
def process_choices_restored():
    """The precision, the kernels and the row passes a test chooses are the process's (as a
    command's are): put back afterwards, so that no other test runs in fp16 or with fused kernels
    by chance."""
    from minitfm.speed import fused, rows
    precision, kernels, on_host = products.precision(), fused.choice(), fused.on_host()
    row_passes = rows.state()
    yield
    products._precision, fused._choice, fused._on_host = precision, kernels, on_host
    rows.use(*row_passes)


@pytest.fixture
def numpy_backend():
    """Run a test on the NumPy backend, whatever the environment selects."""
    previous = backend.name
    backend.use("numpy")
    yield
    backend.use(previous)


# ---- the CuPy path: on the strict CuPy double by default, on a real device with -m gpu --------

ROOT = Path(__file__).resolve().parents[1]
CUPY_DOUBLE = Path(__file__).resolve().parent / "cupy_double"   # importable as `cupy`
CUPY_RULES = ("14", "13")        # the CuPy releases whose rules the double follows


def real_gpu_run(config) -> bool:
    """Whether pytest was asked for the real device: ``-m gpu`` (a marker expression selecting
    gpu tests, not deselecting them)."""
    expression = (config.getoption("markexpr", "") or "").replace(" ", "")
    return "gpu" in expression and "notgpu" not in expression


def _cupy_modules() -> dict:
    return {k: v for k, v in sys.modules.items() if k == "cupy" or k.startswith("cupy.")
            or k == "cupyx" or k.startswith("cupyx.")}


_DOUBLES: dict = {}      # (rules, devices) -> the double's modules, imported once


@contextlib.contextmanager
def cupy_double(rules: str = "14", devices: int = 1):
    """Import the double as ``cupy`` (with CuPy ``rules`` and ``devices`` emulated devices, its
    counts reset, device 0 current); afterwards put back whatever ``cupy`` was imported before (the real
    package, if installed) and the environment."""
    saved_modules = _cupy_modules()
    saved_env = {k: os.environ.get(k) for k in ("CUPY_DOUBLE_RULES", "CUPY_DOUBLE_DEVICES")}
    for name in saved_modules:
        del sys.modules[name]
    os.environ["CUPY_DOUBLE_RULES"], os.environ["CUPY_DOUBLE_DEVICES"] = str(rules), str(devices)
    sys.path.insert(0, str(CUPY_DOUBLE))
    try:
        # one import per (rules, devices), reused: constants the library keeps between calls
        # (positional tables, causal masks) stay arrays of the same `cupy` module, as in a real
        # process, which imports CuPy once
        key = (str(rules), int(devices))
        if key in _DOUBLES:
            sys.modules.update(_DOUBLES[key])
        import cupy
        _DOUBLES.setdefault(key, _cupy_modules())
        assert cupy.__file__.startswith(str(CUPY_DOUBLE)), cupy.__file__
        cupy.cuda.Device(0).use()
        cupy._double.reset()
        yield cupy
    finally:
        sys.path.remove(str(CUPY_DOUBLE))
        for name in _cupy_modules():
            del sys.modules[name]
        sys.modules.update(saved_modules)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cupy_double_env(rules: str = "14", devices: int = 1, report: str | os.PathLike | None = None,
                    base: dict | None = None) -> dict:
    """The environment of a subprocess running on the double: PYTHONPATH with the double first,
    then the project; ``report``: where the double writes its counts at exit (``{pid}`` in the
    path is replaced by the process id, so that MPI workers write one file each)."""
    env = dict(os.environ if base is None else base)
    paths = [str(CUPY_DOUBLE), str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["CUPY_DOUBLE_RULES"], env["CUPY_DOUBLE_DEVICES"] = str(rules), str(devices)
    if report is not None:
        env["CUPY_DOUBLE_REPORT"] = str(report)
    return env


@pytest.fixture
def cupy_backend(request):
    """Run a test on the CuPy backend: on the double (CuPy 14 rules; parametrise indirectly
    with "13" for CuPy 13's), or with ``-m gpu`` on the real CuPy and device (skipped where
    none is usable). Yields the ``cupy`` module in use."""
    previous = backend.name
    if real_gpu_run(request.config):
        if not cupy_device_available():
            pytest.skip("-m gpu: needs CuPy and a CUDA device")
        import cupy
        backend.use("cupy")
        try:
            yield cupy
        finally:
            backend.use(previous)
        return
    with cupy_double(getattr(request, "param", "14")) as cupy:
        backend.use("cupy")
        try:
            yield cupy
        finally:
            backend.use(previous)


# A command started on the double once per CuPy release's rules: CuPy 14's (the release the gpu
# extras install) in every run, CuPy 13's behind the slow marker (CI runs both).
COMMAND_RULES = [pytest.param(r, id=f"cupy{r}",
                              marks=() if r == CUPY_RULES[0] else pytest.mark.slow)
                 for r in CUPY_RULES]


@pytest.fixture(params=COMMAND_RULES)
def cupy_env(request):
    """The environment for a subprocess on the CuPy path, once per CuPy release's rules (see
    COMMAND_RULES): the double on PYTHONPATH; with ``-m gpu``, the real CuPy (only once: no
    extra path)."""
    if real_gpu_run(request.config):
        if request.param != CUPY_RULES[0]:
            pytest.skip("-m gpu runs the installed CuPy once")
        if not cupy_device_available():
            pytest.skip("-m gpu: needs CuPy and a CUDA device")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        return env
    return cupy_double_env(request.param)
