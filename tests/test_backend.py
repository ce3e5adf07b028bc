"""The array backend: selection, errors, helpers, and readiness of the library for CuPy.

The CuPy checks need no GPU: every array function the library calls is looked up in CuPy's
namespace when CuPy is installed (skipped otherwise), and host/device mixing is caught.
"""

import ast
import hashlib
import os
import pathlib
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitfm import backend
from minitfm.models import translator

from .conftest import cupy_device_available
from tests import forkserver

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "minitfm"

# Host-side modules that may import NumPy directly (file I/O, data preparation, synthetic
# tasks, plotting), the workers' devices and NCCL (CuPy) and their placement (NumPy's BLAS
# threads), the precision of the products (products.py: CuPy's compute type for float32), the
# fused kernels' execution on the CPU (cudahost/: C++ run over NumPy's memory), and the
# workshop (learn/: its checks run on NumPy, in float64): they never do the model's array math.
HOST_SIDE = {"backend/__init__.py", "checkpoint.py", "usable.py", "averaging.py", "plotting.py", "tasks.py",
             "devices.py", "compiled.py", "products.py",
             "placement.py"}


def library_files():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def is_host_side(path):
    rel = path.relative_to(PACKAGE)
    return (rel.parts[0] in ("data", "export", "cudahost", "learn") or rel.name in HOST_SIDE
            or rel.as_posix() in HOST_SIDE)


def xp_attribute_chains(tree):
    """Every dotted name read off the array module: ``xp.random.default_rng`` -> "random.default_rng"."""
    chains = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        parts, base = [], node
        while isinstance(base, ast.Attribute):
            parts.append(base.attr)
            base = base.value
        parts.reverse()
        if isinstance(base, ast.Name) and base.id == "xp":
            chain = parts
        elif isinstance(base, ast.Name) and base.id == "backend" and parts[:1] == ["xp"]:
            chain = parts[1:]
        else:
            continue
        if chain:
            chains.add(".".join(chain))
    # keep only maximal chains' prefixes that are module attributes (xp.random.default_rng, not
    # also xp.random)
    return {c for c in chains if not any(o != c and o.startswith(c + ".") for o in chains)}


def used_xp_names():
    names = {}
    for path in library_files():
        for chain in xp_attribute_chains(ast.parse(path.read_text())):
            names.setdefault(chain, path.name)
    return names


def resolve(module, chain):
    obj = module
    for part in chain.split("."):
        obj = getattr(obj, part)
    return obj


def test_library_reads_array_functions_off_the_backend():
    names = used_xp_names()
    assert {"exp", "zeros", "uint64"} <= set(names)


def test_no_array_library_generator_is_ever_created():
    """Random numbers on the device come from minitfm.backend.philox, never from ``xp.random``: a CuPy
    generator allocates and initialises a cuRAND state per GPU thread."""
    assert not [f"{c} ({f})" for c, f in used_xp_names().items() if c.startswith("random")]


def test_every_array_function_used_exists_in_numpy():
    missing = [f"{c} ({f})" for c, f in used_xp_names().items() if not _has(np, c)]
    assert not missing


@pytest.mark.cupy
def test_every_array_function_used_exists_in_cupy():
    cupy = pytest.importorskip("cupy")
    missing = [f"{c} ({f})" for c, f in used_xp_names().items() if not _has(cupy, c)]
    assert not missing, f"not in CuPy's namespace: {missing}"


def test_the_cupy_branch_draws_from_philox(monkeypatch):
    """On CuPy, backend.rng gives a Philox generator, and dropout and sampling draw from it
    (the backend's name set to "cupy" with NumPy arrays, so that its CuPy branches run here)."""
    from minitfm.backend import philox
    from minitfm.decoding import sampling
    monkeypatch.setattr(backend, "name", "cupy")
    generator = backend.rng(0, 1)
    assert isinstance(generator, philox.Philox) and generator.key == philox.key_of(0, 1)
    cfg = translator.Config.preset("tiny", dropout=0.2)
    params = translator.init_params(cfg, 0)
    src, tgt = np.array([[5, 6, 3]]), np.array([[2, 7, 8, 3]])
    a, _ = translator.loss_and_grads(params, cfg, src, tgt, generator, grads=False)
    assert generator.counter > 0                          # the masks came from it
    b, _ = translator.loss_and_grads(params, cfg, src, tgt, backend.rng(0, 1), grads=False)
    c, _ = translator.loss_and_grads(params, cfg, src, tgt, backend.rng(0, 2), grads=False)
    assert a["loss"] == b["loss"] != c["loss"]
    ids = sampling.sample(np.zeros((3, 5)), backend.rng(1))
    assert ids.shape == (3,) and ids.dtype == np.int64


def _has(module, chain):
    try:
        resolve(module, chain)
        return True
    except AttributeError:
        return False


def test_only_host_side_modules_import_numpy_or_cupy():
    offenders = []
    for path in library_files():
        if is_host_side(path):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                continue
            if any(m.split(".")[0] in ("numpy", "cupy", "cupyx") for m in mods):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not offenders, "array math must go through minitfm.backend.xp: " + ", ".join(offenders)


def test_no_module_binds_xp_at_import_time():
    """``from minitfm.backend import xp`` would freeze the backend chosen at import time."""
    for path in library_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("backend"):
                assert all(a.name != "xp" for a in node.names), path


# ---- selection --------------------------------------------------------------------------

def test_using_a_backend_for_a_block_puts_the_last_one_back(numpy_backend):
    with backend.using("numpy"):
        assert backend.name == "numpy"
    with pytest.raises(RuntimeError), backend.using("numpy"):
        raise RuntimeError("inside the block")
    assert backend.name == "numpy"
    with pytest.raises(backend.BackendError, match="unknown backend"), backend.using("torch"):
        pass
    assert backend.name == "numpy"


def test_use_numpy_and_unknown_names(numpy_backend):
    backend.use("numpy")
    assert backend.xp is np and backend.name == "numpy" and not backend.is_gpu()
    with pytest.raises(backend.BackendError, match="unknown backend 'torch'.*numpy.*cupy.*auto"):
        backend.use("torch")
    assert backend.name == "numpy"


@pytest.mark.skipif(cupy_device_available(), reason="a CUDA device is present")
def test_cupy_without_a_device_says_why(numpy_backend):
    with pytest.raises(backend.BackendError) as err:
        backend.use("cupy")
    message = str(err.value)
    assert ("not installed" in message and "pip install" in message) or "no usable CUDA device" in message
    assert backend.name == "numpy"            # nothing changed


@pytest.mark.skipif(cupy_device_available(), reason="a CUDA device is present")
def test_auto_falls_back_to_numpy_without_a_device(numpy_backend):
    backend.use("auto")
    assert backend.name == "numpy"


def test_environment_variable_selects_the_backend():
    code = "from minitfm import backend; print(backend.name)"
    env = dict(os.environ, MINITFM_BACKEND="numpy")
    out = forkserver.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "numpy"
    env["MINITFM_BACKEND"] = "tpu"
    out = forkserver.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "unknown backend 'tpu'" in out.stderr


# ---- helpers ----------------------------------------------------------------------------

@pytest.mark.parametrize("scatter", [backend.scatter_add, backend.sorted_scatter_add])
def test_scatter_add_accumulates_repeated_indices(scatter, numpy_backend):
    target = np.zeros((4, 2))
    scatter(target, np.array([1, 3, 1, 1]), np.ones((4, 2)))
    np.testing.assert_array_equal(target[:, 0], [0, 3, 0, 1])


@settings(max_examples=40)
@given(st.integers(1, 60), st.integers(1, 12), st.integers(0, 2 ** 32 - 1),
       st.sampled_from([np.float32, np.float64]))
def test_sorted_scatter_add_equals_add_at(n, rows, seed, dtype):
    """The order-fixed segment sum (used on GPUs) gives add.at's sums, onto a non-zero target."""
    backend.use("numpy")
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, rows, size=n)
    values = rng.standard_normal((n, 3)).astype(dtype)
    start = rng.standard_normal((rows, 3)).astype(dtype)
    expected, got = start.copy(), start.copy()
    np.add.at(expected, indices, values)
    backend.sorted_scatter_add(got, indices, values)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, expected, rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)


def test_sorted_scatter_add_is_bit_reproducible(numpy_backend):
    rng = np.random.default_rng(0)
    indices = rng.integers(0, 50, size=5000)
    values = rng.standard_normal((5000, 16)).astype(np.float32)
    results = []
    for _ in range(2):
        target = np.zeros((50, 16), np.float32)
        backend.sorted_scatter_add(target, indices, values)
        results.append(target)
    np.testing.assert_array_equal(results[0], results[1])


@settings(max_examples=20)
@given(st.floats(0.0, 0.9), st.integers(0, 1000))
def test_dropout_keep_rate_and_scale(p, seed):
    keep, scale = backend.dropout_keep(np.random.default_rng(seed), (200, 100), p)
    p_rounded = round(p * 2**16) / 2**16
    assert scale == pytest.approx(1 / (1 - p_rounded))
    assert keep.dtype == bool and keep.shape == (200, 100)
    assert abs(keep.mean() - (1 - p_rounded)) < 5 * np.sqrt(p_rounded * (1 - p_rounded) / keep.size) + 1e-12


def test_generators_are_reproducible_per_stream(numpy_backend):
    assert isinstance(backend.rng(1, 5), np.random.Generator)
    a = backend.rng(1, 5).random(4)
    assert np.array_equal(a, backend.rng(1, 5).random(4))
    assert not np.array_equal(a, backend.rng(1, 6).random(4))
    assert np.array_equal(a, np.random.default_rng([1, 5]).random(4))
    assert np.array_equal(backend.host_rng(2, 1).random(3), backend.host_rng(2, 1).random(3))


# Two successive masks of rng(*stream): sha256 of their packed bits (first 16 hex digits), their
# counts of kept elements, and the packed bits of the first 32 elements of the first, recorded
# with the NumPy code path as it was before the CuPy backend moved to minitfm.backend.philox.
NUMPY_MASKS = [((3, 7, 1), (37, 11), 0.1, "23921ff08c7113b8", 365, 362, "df7ff7f6"),
               ((0, 1, 0), (4, 5, 6), 0.3, "f335ad80373d4728", 86, 87, "7ff9ea18")]


@pytest.mark.parametrize("stream, shape, p, digest, kept1, kept2, head", NUMPY_MASKS)
def test_numpy_dropout_masks_are_unchanged(numpy_backend, stream, shape, p, digest, kept1,
                                           kept2, head):
    generator = backend.rng(*stream)
    first, _ = backend.dropout_keep(generator, shape, p)
    second, _ = backend.dropout_keep(generator, shape, p)
    bits = np.packbits(np.concatenate([first.ravel(), second.ravel()])).tobytes()
    assert hashlib.sha256(bits).hexdigest()[:16] == digest
    assert (first.sum(), second.sum()) == (kept1, kept2)
    assert np.packbits(first.ravel()[:32]).tobytes().hex() == head
    # ... which are 16-bit integers drawn as raw bytes from default_rng([seed, *stream])
    size = int(np.prod(shape))
    raw = np.random.default_rng(list(stream)).bytes(2 * size)
    expected = np.frombuffer(raw, dtype=np.uint16).reshape(shape) >= round(p * 2**16)
    np.testing.assert_array_equal(first, expected)


@pytest.mark.parametrize("shape", [(8,), (6,), (3, 7), (64, 24, 8), (5, 4, 3)])
@pytest.mark.parametrize("before", [0, 1, 2])
def test_dropout_draws_the_bytes_of_the_generator(numpy_backend, shape, before):
    """The mask's 16-bit draws are ``generator.bytes(2 * size)`` (taken from the generator's raw
    64-bit outputs where they are whole), and leave the generator where ``bytes`` would, after an
    earlier draw of ``before`` 16-bit halves too."""
    ours, reference = backend.rng(4, 2), backend.rng(4, 2)
    ours.bytes(2 * before)
    reference.bytes(2 * before)
    keep, _ = backend.dropout_keep(ours, shape, 0.25)
    raw = np.frombuffer(reference.bytes(2 * int(np.prod(shape))), dtype=np.uint16)
    np.testing.assert_array_equal(keep, raw.reshape(shape) >= round(0.25 * 2**16))
    assert ours.bytes(12) == reference.bytes(12)
    assert ours.random(3).tolist() == reference.random(3).tolist()


def test_dropout_refuses_other_generators(numpy_backend, monkeypatch):
    with pytest.raises(TypeError, match="backend.rng"):
        backend.dropout_keep(np.random.RandomState(0), (2, 3), 0.1)
    monkeypatch.setattr(backend, "name", "cupy")
    with pytest.raises(TypeError, match="cupy backend.*backend.rng"):
        backend.dropout_keep(np.random.default_rng(0), (2, 3), 0.1)


def test_host_and_device_copies(numpy_backend):
    x = backend.to_device([[1, 2]], dtype=np.float32)
    assert isinstance(x, np.ndarray) and x.dtype == np.float32
    assert backend.to_host(x) is x


def test_float_dtype_setting():
    assert backend.float_dtype() == np.float32
    backend.set_float_dtype("float64")
    try:
        assert backend.float_dtype() == np.float64
    finally:
        backend.set_float_dtype(np.float32)
    with pytest.raises(ValueError, match="float16"):
        backend.set_float_dtype("float16")


def test_check_array_names_the_array_and_the_remedy(numpy_backend):
    class Fake:
        __cuda_array_interface__ = {}
    with pytest.raises(TypeError, match=r"weights is a .*Fake on the GPU.*'numpy'.*to_device"):
        backend.check_array(Fake(), "weights")
    x = np.zeros(2)
    assert backend.check_array(x, "x") is x
