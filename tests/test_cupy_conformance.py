"""The CuPy double (tests/cupy_double) against the installed CuPy package.

Every name the double offers must exist in CuPy, with the same parameters; every keyword the
double's ufuncs, ``einsum`` and ``matmul`` refuse, CuPy's refuse too, and those they accept, CuPy
accepts; ``nccl.get_unique_id`` returns the type CuPy's documents; the errors say what CuPy's
say. The double follows the rules of the installed CuPy's major release (13 or 14). No GPU is
needed: CuPy imports without one, checks keywords before touching the device, and the rest is
read from signatures, docstrings (Cython functions embed theirs) and source.

Runs under ``-m cupy`` where ``cupy`` (the real package) is importable, which the ``real``
fixture imports (nothing here imports it while the tests are collected): CI installs
``cupy-cuda12x`` in a second environment for it. When CuPy changes, this test says
where the double no longer matches.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import types
import warnings

import numpy
import pytest

from .conftest import cupy_double
from .cupy_signatures import doc_parameters, parameters, same_parameters


pytestmark = pytest.mark.cupy


@pytest.fixture(scope="module")
def real():
    """The installed CuPy package; the test skips where there is none."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")    # "nccl library could not be loaded" and the like
        try:
            import cupy
        except ImportError as exc:
            pytest.skip(f"the real CuPy is not importable here ({exc}): install cupy-cuda12x "
                        f"to check the double against it")
    if "cupy_double" in (getattr(cupy, "__file__", "") or ""):
        pytest.skip("cupy here is the double itself, not the real package")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cupy.random.Generator          # its lazy imports, done before the double becomes `cupy`
        import cupy._core._gufuncs     # noqa: F401
    return cupy


@pytest.fixture(scope="module")
def rules(real) -> str:
    """The installed CuPy's major release, whose rules the double follows."""
    return real.__version__.split(".")[0]


@pytest.fixture(scope="module")
def double(real, rules):
    """The double, following the installed CuPy's rules, imported beside the real one."""
    if rules not in ("13", "14"):
        pytest.fail(f"CuPy {real.__version__} is installed, the double knows the rules of CuPy 13 "
                    f"and 14: read CuPy {rules}'s source and add its rules to the double")
    with cupy_double(rules, devices=2) as module:
        assert module is not real
        yield module


def _public(namespace) -> dict:
    return {n: getattr(namespace, n) for n in dir(namespace) if not n.startswith("_")}


def _is_double_ufunc(obj, double) -> bool:
    return isinstance(obj, double.ufunc)


def _is_real_ufunc(obj) -> bool:
    return type(obj).__name__ == "ufunc"


# ---- the tests -------------------------------------------------------------------------------

def test_the_double_follows_the_installed_release(double, rules):
    assert double.__version__.split(".")[0] == rules
    assert double._double.RULES == int(rules)


def test_every_routine_exists_in_cupy_with_the_same_parameters(double, real):
    problems = []
    for name, mine in _public(double).items():
        if isinstance(mine, types.ModuleType):
            if name in ("cuda", "random", "linalg") and not hasattr(real, name):
                problems.append(f"cupy.{name} is missing")
            continue
        if not hasattr(real, name):
            problems.append(f"cupy.{name} is missing in CuPy {real.__version__}")
            continue
        theirs = getattr(real, name)
        if getattr(mine, "__module__", "").split(".")[0] == "numpy" or not callable(mine):
            continue          # dtypes, constants: NumPy's own objects in both
        if _is_double_ufunc(mine, double):
            if not _is_real_ufunc(theirs):
                problems.append(f"cupy.{name} is a ufunc in the double, {type(theirs)} in CuPy")
            elif (mine.nin, mine.nout) != (theirs.nin, theirs.nout):
                problems.append(f"cupy.{name}: nin/nout {(mine.nin, mine.nout)} against "
                                f"{(theirs.nin, theirs.nout)}")
            continue
        if isinstance(mine, type):
            continue          # classes: their methods are checked below
        if name == "matmul":
            continue          # test_matmul_keywords
        problems += same_parameters(mine, theirs, f"cupy.{name}")
    for name, mine in _public(double.linalg).items():
        if callable(mine) and not isinstance(mine, types.ModuleType):
            if not hasattr(real.linalg, name):
                problems.append(f"cupy.linalg.{name} is missing")
            elif name != "matmul":
                problems += same_parameters(mine, getattr(real.linalg, name), f"cupy.linalg.{name}")
    assert not problems, "\n".join(problems)


def test_ndarray_methods_exist_in_cupy_with_the_same_parameters(double, real):
    problems = []
    for name in dir(double.ndarray):
        if name.startswith("_"):
            continue
        if not hasattr(real.ndarray, name):
            problems.append(f"cupy.ndarray.{name} is missing")
            continue
        mine = inspect.getattr_static(double.ndarray, name)
        if isinstance(mine, property):
            continue
        problems += same_parameters(getattr(double.ndarray, name), getattr(real.ndarray, name),
                                    f"cupy.ndarray.{name}")
    assert not problems, "\n".join(problems)


# conversions and protocols: present or absent in both (no __index__ in CuPy: an array is not
# an integer, even a 0-d one)
DUNDERS = ("__array__", "__array_ufunc__", "__array_function__", "__cuda_array_interface__",
           "__array_interface__", "__index__", "__int__", "__float__", "__complex__", "__bool__",
           "__iter__", "__len__", "__matmul__", "__iadd__", "__imatmul__", "__dlpack__",
           "__array_priority__")


def test_conversions_and_protocols_match(double, real):
    problems = [f"{d}: double {hasattr(double.ndarray, d)}, CuPy {hasattr(real.ndarray, d)}"
                for d in DUNDERS if d != "__dlpack__"
                and hasattr(double.ndarray, d) != hasattr(real.ndarray, d)]
    assert not problems, "\n".join(problems)
    assert double.ndarray.__array_priority__ == real.ndarray.__array_priority__
    assert real.ndarray.__hash__ is None and double.ndarray.__hash__ is None


BAD_KEYWORDS = {"order": "K", "where": True, "subok": True, "signature": None, "axes": None,
                "axis": None, "keepdims": False, "foo": 1}
GOOD_KEYWORDS = {"out": None, "dtype": None, "casting": "same_kind"}


def _accepts(function, args, keyword, value) -> bool:
    """Whether ``function`` takes ``keyword``: a refusal is a TypeError naming the arguments,
    raised before the device is touched; anything else (a result, or CUDA failing for want of a
    device) means the keyword was accepted."""
    try:
        function(*args, **{keyword: value})
    except TypeError as exc:
        if "Wrong arguments" in str(exc) or "unexpected keyword" in str(exc):
            return False
        return True
    except Exception:
        return True
    return True


def test_ufuncs_refuse_the_keywords_cupy_refuses(double, real):
    problems = []
    for name, mine in _public(double).items():
        if not _is_double_ufunc(mine, double):
            continue
        theirs = getattr(real, name)
        args = [1.0] * mine.nin if "shift" not in name and "bitwise" not in name and name != "invert" else [1] * mine.nin
        for keyword, value in {**GOOD_KEYWORDS, **BAD_KEYWORDS}.items():
            a, b = _accepts(mine, args, keyword, value), _accepts(theirs, args, keyword, value)
            if a != b:
                problems.append(f"cupy.{name}({keyword}=...): the double "
                                f"{'accepts' if a else 'refuses'} it, CuPy {'accepts' if b else 'refuses'}")
        doc = doc_parameters(theirs.__doc__)
        if {n for n, _ in doc} - {"x", "x1", "x2", "*"} != set(GOOD_KEYWORDS):
            problems.append(f"cupy.{name} documents {doc}")
    assert not problems, "\n".join(problems)
    with pytest.raises(TypeError, match=r"Wrong arguments \{'order': 'C'\}"):
        real.exp(1.0, order="C")
    with pytest.raises(TypeError, match=r"Wrong arguments \{'order': 'C'\}"):
        double.exp(1.0, order="C")


def test_einsum_takes_only_dtype_and_optimize(double, real):
    source = "\n".join(line for line in inspect.getsource(real.einsum).splitlines()
                       if not line.strip().startswith("#"))
    popped = set(re.findall(r"kwargs\.pop\('(\w+)'", source))
    assert popped == {"dtype", "optimize"}, popped
    assert "Did not understand the following kwargs: %s" in source
    assert parameters(double.einsum) == parameters(real.einsum) == [("*operands", "*"), ("**kwargs", "*")]
    x = double.ones((2, 3))
    for keyword in ("out", "order", "casting"):
        with pytest.raises(TypeError, match=rf"Did not understand the following kwargs: \['{keyword}'\]"):
            double.einsum("ij->i", x, **{keyword: None})
    double.einsum("ij->i", x, dtype=None, optimize=False)


def test_matmul_keywords(double, real, rules):
    call = type(real.matmul).__call__
    try:
        inspect.signature(call)
        explicit = [n for n, _ in parameters(call) if not n.startswith("*")]
    except (TypeError, ValueError):
        explicit = []
    if not explicit:      # (*args, **kwargs): the keywords it pops, from its source
        explicit = re.findall(r"kwargs\.pop\('(\w+)'", "\n".join(
            line for line in inspect.getsource(call).splitlines() if not line.strip().startswith("#")))
    assert set(explicit) == {"axes", "axis", "keepdims", "casting", "dtype", "signature", "order", "out"}
    x = double.ones((2, 2))
    for keyword in explicit:
        value = {"keepdims": False, "casting": "same_kind", "order": "K"}.get(keyword)
        double.matmul(x, x, **{keyword: value})
    unknown = TypeError if rules == "14" else RuntimeError
    with pytest.raises(unknown):
        double.matmul(x, x, foo=1)
    if rules == "14":
        assert parameters(type(double.matmul).__call__) == parameters(call)


def test_generator_has_cupys_methods_only(double, real):
    mine = {n for n in dir(double.random.Generator) if not n.startswith("_")}
    theirs = {n for n in dir(real.random.Generator) if not n.startswith("_")}
    assert mine == theirs
    assert not {"choice", "permutation", "shuffle", "normal", "bytes"} & theirs
    problems = []
    for name in sorted(mine):
        problems += same_parameters(getattr(double.random.Generator, name),
                                    getattr(real.random.Generator, name), f"Generator.{name}")
    problems += same_parameters(double.random.default_rng, real.random.default_rng, "default_rng")
    assert not problems, "\n".join(problems)


def test_cuda_names_and_errors(double, real):
    problems = []
    for path in ("Device", "Stream", "get_current_stream", "runtime.getDeviceCount",
                 "runtime.getDevice", "runtime.setDevice", "runtime.getDeviceProperties",
                 "runtime.memGetInfo", "runtime.deviceSynchronize", "runtime.CUDARuntimeError",
                 "runtime.runtimeGetVersion", "runtime.driverGetVersion", "Device.compute_capability",
                 "memory.OutOfMemoryError", "MemoryPointer", "Device.use", "Device.synchronize",
                 "Stream.synchronize", "Stream.use"):
        mine, theirs = double.cuda, real.cuda
        for part in path.split("."):
            mine, theirs = getattr(mine, part, None), getattr(theirs, part, None)
        if theirs is None:
            problems.append(f"cupy.cuda.{path} is missing in CuPy")
        elif mine is None:
            problems.append(f"cupy.cuda.{path} is missing in the double")
        elif path in ("Stream", "runtime.getDeviceProperties", "runtime.setDevice",
                      "get_current_stream"):
            problems += same_parameters(mine, theirs, f"cupy.cuda.{path}")
    assert not problems, "\n".join(problems)
    assert issubclass(real.cuda.runtime.CUDARuntimeError, RuntimeError)
    assert issubclass(double.cuda.runtime.CUDARuntimeError, RuntimeError)
    assert str(double.cuda.runtime.CUDARuntimeError(101)) == str(real.cuda.runtime.CUDARuntimeError(101))
    assert str(double.cuda.memory.OutOfMemoryError(1024, 512)) == str(real.cuda.memory.OutOfMemoryError(1024, 512))
    assert issubclass(double.cuda.memory.OutOfMemoryError, MemoryError)


COMPUTE_TYPES = ("TBD", "DEFAULT", "PEDANTIC", "FP16", "FP32", "FP64", "BF16", "TF32")


def test_compute_types_match(double, real):
    """cupy._core.set_compute_type / get_compute_type and the COMPUTE_TYPE_* constants of
    cupy._core._routines_linalg: the same values, parameters and refusals (those that need no
    device; the compute-capability warning is read from the v14.2.0 source, RULES.md)."""
    from cupy._core import _routines_linalg as mine      # the double's, while it is `cupy`
    theirs = importlib.import_module(real.__name__ + "._core._routines_linalg")
    for name in COMPUTE_TYPES:
        assert getattr(mine, f"COMPUTE_TYPE_{name}") == getattr(theirs, f"COMPUTE_TYPE_{name}")
    problems = []
    for name in ("set_compute_type", "get_compute_type"):
        problems += same_parameters(getattr(double._core, name), getattr(real._core, name),
                                    f"cupy._core.{name}")
    assert not problems, "\n".join(problems)
    for module in (double, real):
        with pytest.raises(ValueError, match="^Unknown compute type: 99$"):
            module._core.set_compute_type(numpy.float32, 99)
        with pytest.raises(TypeError, match="dtype is not supported: int32"):
            module._core.set_compute_type(numpy.dtype(numpy.int32), 1)
    refusals = []
    for module in (double, real):
        try:
            module._core.get_compute_type(numpy.int32)
        except Exception as exc:             # CuPy 14 reads `.name` of the type: AttributeError
            refusals.append(type(exc))
    assert len(refusals) == 2 and refusals[0] is refusals[1], refusals


def _nccl_documentation() -> str:
    """The text of CuPy's NCCL binding: its docstrings when libnccl loads, else the strings
    compiled into the extension module (the docstrings are among them)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from cupy_backends.cuda.libs import nccl
        return "\n".join([nccl.get_unique_id.__doc__ or "", nccl.NcclCommunicator.__doc__ or "",
                          nccl.NcclCommunicator.__init__.__doc__ or ""])
    except ImportError:
        spec = importlib.util.find_spec("cupy_backends.cuda.libs.nccl")
        assert spec is not None and spec.origin, "CuPy ships no NCCL binding"
        with open(spec.origin, "rb") as f:
            return f.read().decode("latin-1")


def test_nccl_unique_id_type_matches_the_release(double):
    text = _nccl_documentation()
    from cupy.cuda import nccl as double_nccl        # the double's, while it is `cupy`
    takes = "bytes" if "bytes commId" in text else "tuple" if "tuple commId" in text else None
    assert takes, "NcclCommunicator's commId type is not documented in CuPy's NCCL binding"
    assert ("Python bytes object" in text) == (takes == "bytes")
    unique_id = double_nccl.get_unique_id()
    assert type(unique_id).__name__ == takes and len(unique_id) == 128
    other = tuple(unique_id) if takes == "bytes" else bytes(128)
    with pytest.raises(TypeError, match=f"Argument 'commId' has incorrect type \\(expected {takes}"):
        double_nccl.NcclCommunicator(1, other, 0)
    assert re.search(r"NcclCommunicator\(int ndev, %s commId, int rank" % takes, text)


def test_the_double_is_stricter_than_numpy_where_cupy_is(double):
    """What the conformance rests on: the double refuses what CuPy refuses (its source's
    messages, RULES.md)."""
    x = double.arange(3.0)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        numpy.asarray(x)
    with pytest.raises(TypeError, match="Unsupported type <class 'numpy.ndarray'>"):
        x + numpy.ones(3)
    assert "cupy" in sys.modules and sys.modules["cupy"] is double


def test_raw_kernel_has_cupys_parameters(double, real):
    """cupy.RawKernel (cupy/_core/raw.pyx): the constructor's parameters, read from the class's
    docstring (Cython embeds the signature there), and ``__call__(grid, block, args, *,
    shared_mem=0)`` from its docstring's second signature line."""
    from .cupy_signatures import parameters
    theirs = doc_parameters(real.RawKernel.__doc__)
    assert parameters(double.RawKernel.__init__) == theirs, theirs
    call_doc = [line for line in real.RawKernel.__call__.__doc__.splitlines()
                if line.strip().startswith("__call__(")][0].replace("__call__", "RawKernel.__call__")
    assert parameters(double.RawKernel.__call__) == doc_parameters(call_doc)


def _cublas_documentation() -> str:
    """The text of CuPy's cuBLAS binding: gemmEx's docstring where libcublas loads, else the
    strings compiled into the extension module (the docstrings are among them)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from cupy_backends.cuda.libs import cublas
        return cublas.gemmEx.__doc__ or ""
    except ImportError:
        spec = importlib.util.find_spec("cupy_backends.cuda.libs.cublas")
        assert spec is not None and spec.origin, "CuPy ships no cuBLAS binding"
        with open(spec.origin, "rb") as f:
            return f.read().decode("latin-1")


def test_gemm_ex_and_its_constants_match(double, real):
    """The double's ``cupy.cuda.cublas.gemmEx`` (mixed precision's products) has the binding's
    parameters, ``cupy.cuda.get_cublas_handle`` exists, and the data types it is given are
    CuPy's numbers (cuBLAS's enum values, CUBLAS_OP_N 0 / T 1, CUBLAS_COMPUTE_32F 68,
    CUBLAS_GEMM_DEFAULT_TENSOR_OP 99, are cuBLAS's ABI: cublas_api.h)."""
    from .cupy_signatures import parameters
    text = _cublas_documentation()
    line = re.search(r"gemmEx\((intptr_t handle[^)]*)\)", text)
    assert line, "no gemmEx signature in CuPy's cuBLAS binding"
    assert parameters(double.cuda.cublas.gemmEx) == doc_parameters(f"gemmEx({line.group(1)})")
    assert callable(real.cuda.get_cublas_handle) and callable(double.cuda.get_cublas_handle)
    assert (double.cuda.runtime.CUDA_R_16F, double.cuda.runtime.CUDA_R_32F) == \
        (real.cuda.runtime.CUDA_R_16F, real.cuda.runtime.CUDA_R_32F)
