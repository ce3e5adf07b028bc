"""The CuPy double's launch count and compute type of products (tests/cupy_double/RULES.md:
"Kernel launches, counted", "Compute type of products"), exercised under CuPy 14's and 13's
rules."""

from __future__ import annotations

import numpy as np
import pytest

from .test_cupy_double import cp  # noqa: F401  (a fixture: the double under each release's rules)


# ---- kernel launches, counted -----------------------------------------------------------------

def test_launches_are_counted_once_per_device_operation(cp):  # noqa: F811
    x = cp.arange(12.0).reshape(3, 4)
    with cp._double.counting() as launched:
        cp.empty((2, 3))                           # allocation only: 0
        y = x + 1.0                                # 1
        y += x                                     # 1 (into y)
        y[1:], y[0], y[0, 0], y.T                  # views: 0
        y[cp.asarray([0, 2])]                      # a host-to-device copy (0), a gather (1)
        y[0] = 2.0                                 # 1
        y.sum(axis=0)                              # 1
        cp.matmul(y, x.T)                          # 1
        y.astype(cp.float32)                       # 1
        y.astype(cp.float64, copy=False)           # the array itself: 0
        cp.zeros(3)                                # a memset: 1
        y.T.reshape(-1)                            # not a view: a copy, 1
    assert launched.launches == 9
    assert sum(launched.launch_sites.values()) == 9
    assert all(site.startswith(__file__) for site in launched.launch_sites), launched.launch_sites
    assert launched.events == []                   # launches are counted by site, not listed


# ---- the compute type of products --------------------------------------------------------------

@pytest.fixture
def compute_type(cp):  # noqa: F811
    """cupy._core._routines_linalg; the float32 compute type put back afterwards."""
    linalg = cp._core._routines_linalg
    saved = linalg.get_compute_type(np.float32)
    yield linalg
    linalg.set_compute_type(np.float32, saved)


def tf32(values) -> np.ndarray:
    """float32 values rounded to TF32's 10-bit mantissa, to nearest even, by the bits."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000
    return rounded.astype(np.uint32).view(np.float32)


def test_tf32_compute_type_rounds_the_operands_of_2d_products_only(cp, compute_type):  # noqa: F811
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 8)).astype(np.float32)
    b = rng.standard_normal((8, 3)).astype(np.float32)
    da, db = cp.asarray(a), cp.asarray(b)
    compute_type.set_compute_type(np.float32, compute_type.COMPUTE_TYPE_TF32)
    with cp._double.counting() as counted:
        two_d = (da @ db).get()
        also = [cp.dot(da, db).get(), cp.tensordot(da, db, 1).get()]
        batched = cp.matmul(da[None], db[None]).get()
        vectors = cp.dot(da[0], da[1]).get()
        doubles = (da.astype(cp.float64) @ db.astype(cp.float64)).get()
    assert (counted.tf32_products, counted.fp32_products) == (3, 0)
    np.testing.assert_array_equal(two_d, tf32(a) @ tf32(b))
    for result in also:
        np.testing.assert_array_equal(result, two_d)
    assert not np.array_equal(two_d, a @ b)                    # the rounding shows
    np.testing.assert_array_equal(batched[0], np.matmul(a[None], b[None])[0])
    np.testing.assert_array_equal(vectors, np.dot(a[0], a[1]))
    np.testing.assert_array_equal(doubles, a.astype(np.float64) @ b.astype(np.float64))
    # to nearest: 2^-12 above 1 + 2^-10 is below half of TF32's step (2^-10) and goes
    one = cp.ones((1, 1), dtype=cp.float32)
    for value, expected in ((1 + 2 ** -10 + 2 ** -12, 1 + 2 ** -10),
                            (1 + 2 ** -11 + 2 ** -12, 1 + 2 ** -10), (1 + 2 ** -11, 1.0)):
        assert (cp.asarray([[value]], dtype=cp.float32) @ one).item() == expected
    compute_type.set_compute_type(np.float32, compute_type.COMPUTE_TYPE_DEFAULT)
    np.testing.assert_array_equal((da @ db).get(), a @ b)


def test_compute_type_follows_cupy_tf32_and_the_compute_capability(cp, compute_type,  # noqa: F811
                                                                   monkeypatch):
    monkeypatch.setenv("CUPY_TF32", "1")
    compute_type.set_compute_type(np.float32, compute_type.COMPUTE_TYPE_TBD)
    assert compute_type.get_compute_type(np.float32) == compute_type.COMPUTE_TYPE_TF32
    monkeypatch.setenv("CUPY_TF32", "0")          # read once, when the type was decided
    assert compute_type.get_compute_type(np.float32) == compute_type.COMPUTE_TYPE_TF32
    assert cp._core.get_compute_type is compute_type.get_compute_type
    monkeypatch.setattr(cp.cuda._state, "COMPUTE_CAPABILITY", 75)
    assert cp.cuda.Device().compute_capability == "75"
    with pytest.warns(UserWarning, match="only available on GPUs with compute capability 8.0"):
        compute_type.set_compute_type(np.float32, compute_type.COMPUTE_TYPE_TF32)
    assert compute_type.get_compute_type(np.float32) == compute_type.COMPUTE_TYPE_DEFAULT
    with pytest.raises(ValueError, match="Unknown compute type: 8"):
        compute_type.set_compute_type(np.float32, 8)
