import os

import pytest
from hypothesis import HealthCheck, settings

from minitfm import backend

settings.register_profile("default", deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
# CI draws the same examples on every run (derived from each test's name), so that a submission
# is judged on the code, not on the draw; a developer's runs draw new examples every time.
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


def cupy_device_available() -> bool:
    try:
        import cupy
        return bool(cupy.is_available())
    except Exception:
        return False


@pytest.fixture
def numpy_backend():
    """Run a test on the NumPy backend, whatever the environment selects."""
    previous = backend.name
    backend.use("numpy")
    yield
    backend.use(previous)


@pytest.fixture
def cupy_backend():
    """Run a test on the CuPy backend; skip where no CUDA device is usable."""
    if not cupy_device_available():
        pytest.skip("needs CuPy and a CUDA device")
    previous = backend.name
    backend.use("cupy")
    yield
    backend.use(previous)
