"""The one place that chooses a call's path (minitfm/speed/policy.py): a route in the plain
function's place once a chooser is registered, the plain code for float64 and inside
``policy.plain()``, and the plain function itself, with no route, where nothing is registered."""

import json
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

from minitfm.speed import policy
from tests.conftest import ROOT


def _module_with(plain):
    """A module holding ``plain`` as its function ``f`` (registration replaces module attributes)."""
    module = types.ModuleType("minitfm_policy_probe")
    plain.__module__ = module.__name__
    module.f = plain
    sys.modules[module.__name__] = module
    return module


@pytest.fixture
def probe():
    calls = []

    def f(x, scale=1.0):
        calls.append("plain")
        return x * scale

    module = _module_with(f)

    def fast(x, scale=1.0):
        calls.append("fast")
        return x * scale

    @policy.fast_path(module.f)
    def choose(x, scale=1.0):
        return fast if x.dtype == np.float32 else None

    yield module, f, fast, calls
    del sys.modules[module.__name__]
    del policy.ROUTES[f"{module.__name__}.f"]


def test_a_registered_chooser_routes_calls_and_keeps_the_plain_function(probe):
    module, plain, fast, calls = probe
    assert module.f is not plain and policy.plain_function(module.f) is plain
    module.f(np.ones(3, np.float32))
    module.f(np.ones(3, np.int64))
    assert calls == ["fast", "plain"]
    assert policy.path(module.f, np.ones(3, np.float32)) is fast
    assert policy.path(module.f, np.ones(3, np.int64)) is plain


def test_float64_and_plain_blocks_run_the_plain_code(probe):
    module, plain, fast, calls = probe
    module.f(np.ones(3, np.float64))
    with policy.plain():
        module.f(np.ones(3, np.float32))
        assert policy.path(module.f, np.ones(3, np.float32)) is plain
    assert calls == ["plain", "plain"]
    module.f(np.ones(3, np.float32))
    assert calls[-1] == "fast"


def test_plain_holds_in_the_thread_that_entered_it_alone(probe):
    module, plain, fast, calls = probe
    seen = []
    with policy.plain():
        worker = threading.Thread(target=lambda: seen.append(policy.path(module.f,
                                                                         np.ones(2, np.float32))))
        worker.start()
        worker.join()
    assert seen == [fast]


def test_a_chooser_must_take_the_plain_functions_arguments():
    def g(x, p, eps=1e-5):
        return x

    module = _module_with(g)
    try:
        with pytest.raises(TypeError, match="must take its arguments"):
            @policy.fast_path(module.f)
            def choose(x, p):
                return None
        assert module.f is g
    finally:
        del sys.modules[module.__name__]


def test_without_the_speed_package_a_layer_is_its_plain_function():
    """The book alone: importing the layers and the models imports nothing of minitfm.speed, and
    ``layernorm.forward`` is the textbook's function, no route in between."""
    code = ("import json, sys; from minitfm.layers import layernorm; from minitfm import models; "
            "print(json.dumps([any(m.startswith('minitfm.speed') for m in sys.modules), "
            "hasattr(layernorm.forward, 'plain'), layernorm.forward.__module__]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == [False, False, "minitfm.layers.layernorm"]


def test_a_plain_run_imports_no_fast_path(tmp_path):
    """``--kernels plain`` (fp32): a training run of the command, start to end, without the speed
    package; ``--kernels fused`` imports it."""
    code = ("import sys; from minitfm.commands import train_toy; "
            "train_toy.main(sys.argv[2:]); print('minitfm.speed' in sys.modules)")
    seen = {}
    for kernels in ("plain", "fused"):
        args = ["--max-steps", "1", "--preset", "tiny", "--eval-size", "4", "--examples", "0",
                "--backend", "numpy", "--kernels", kernels, "--quiet",
                "--out", str(tmp_path / kernels)]
        out = subprocess.run([sys.executable, "-c", code, "--", *args], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        seen[kernels] = out.strip().splitlines()[-1]
    assert seen == {"plain": "False", "fused": "True"}


def test_the_kernels_option_names_the_fast_paths_choices():
    from minitfm.cli import options
    from minitfm.speed import fused
    assert options.KERNELS == fused.CHOICES


def test_explain_names_what_each_call_ran(capsys, numpy_backend):
    """``python -m minitfm.kernelcheck --explain``: under plain kernels every layer call ran its
    plain code; under the row passes the layers with one ran it, each line with its chooser's
    words."""
    from minitfm import kernelcheck
    from minitfm.speed import fused, rows
    try:
        assert kernelcheck.main(["--explain", "--kernels", "plain"]) == 0
        plain = capsys.readouterr().out.splitlines()
        assert kernelcheck.main(["--explain", "--kernels", "fused"]) == 0
        fast = capsys.readouterr().out.splitlines()
    finally:
        fused.use("plain")
        rows.use(False)
    assert "--kernels plain" in plain[0] and "--kernels fused" in fast[0]
    ran = dict(zip(plain[1::2], plain[2::2]))
    assert len(ran) == len(policy.ROUTES)
    assert all(": plain x" in line or line.endswith("not called in this update") for line in ran)
    assert all(words.strip() for words in ran.values())
    fast_lines = {line.split(":")[0]: line for line in fast[1::2]}
    assert "speed.encoder.layer_forward" in fast_lines["layers.encoder.layer_forward"]
    assert "speed.loss.rows_forward_backward" in fast_lines["layers.loss.forward_backward"]


def test_kernels_without_explain_is_refused(capsys):
    from minitfm import kernelcheck
    with pytest.raises(SystemExit) as stop:
        kernelcheck.main(["--kernels", "fused"])
    assert stop.value.code == 2 and "go with --explain" in capsys.readouterr().err


def test_each_fast_path_sits_beside_the_plain_function_it_routes():
    """A route's plain function is the book's (a layer, Adam's update, the gradients' clipping
    and scaling, a model's step) and its chooser lives in the speed package's file of the same
    name."""
    import minitfm.speed  # noqa: F401  (registers every route)
    assert len(policy.ROUTES) >= 20
    for name, route in policy.ROUTES.items():
        plain_module, chooser_module = route.plain.__module__, route.chooser.__module__
        assert plain_module.startswith("minitfm.layers.") or plain_module in (
            "minitfm.optim", "minitfm.gradscale", "minitfm.models.lm",
            "minitfm.models.translator"), name
        assert chooser_module == "minitfm.speed." + plain_module.rsplit(".", 1)[-1], name
        assert route.routed.plain is route.plain and not hasattr(route.plain, "chooser"), name
        module = sys.modules[route.module]
        assert getattr(module, route.name) is route.routed, name
