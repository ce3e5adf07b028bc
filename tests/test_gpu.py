"""The CuPy path on a real device (``pytest -m gpu``; skipped where no CUDA device is usable)."""

import numpy as np
import pytest

from minitfm import backend
from minitfm.gradcheck.cases import translation_batch
from minitfm.gradcheck.__main__ import main as gradcheck_main
from minitfm.models import translator

pytestmark = pytest.mark.gpu


@pytest.mark.slow
def test_gradient_checks_pass_on_cupy(cupy_backend, capsys):
    """Every case of the table on the CuPy path, along three random directions of each array (on
    the double element by element took some 8 minutes, op by op; NumPy's runs check every element,
    and the CuPy path's gradients equal NumPy's below)."""
    assert gradcheck_main(["--backend", "cupy", "--directions", "3"]) == 0
    out = capsys.readouterr().out
    assert "backend cupy" in out and "along 3 random directions" in out


def test_cupy_step_matches_numpy(cupy_backend):
    cfg = translator.Config.preset("tiny", d_model=16, d_ff=32, n_heads=4)
    src, tgt = translation_batch(backend.host_rng(0), cfg, 3, 5, 6)
    src, tgt = backend.to_host(src), backend.to_host(tgt)
    results = {}
    for name in ("numpy", "cupy"):
        backend.use(name)
        params = translator.init_params(cfg, 0, dtype=np.float64)
        stats, grads = translator.loss_and_grads(params, cfg, backend.to_device(src), backend.to_device(tgt))
        results[name] = stats, {k: backend.to_host(v) for k, v in grads.items()}
    assert float(results["cupy"][0]["loss"]) == pytest.approx(float(results["numpy"][0]["loss"]),
                                                             rel=1e-10)
    for k, g in results["numpy"][1].items():
        np.testing.assert_allclose(results["cupy"][1][k], g, rtol=1e-8, atol=1e-12)


def test_numpy_parameters_are_refused_by_a_cupy_model(cupy_backend):
    cfg = translator.Config.preset("tiny")
    params = {k: backend.to_host(v) for k, v in translator.init_params(cfg, 0).items()}
    with pytest.raises(TypeError, match="numpy.ndarray on the host.*'cupy'"):
        translator.loss_and_grads(params, cfg, np.array([[5, 3]]), np.array([[2, 5, 3]]))


def test_host_token_ids_equal_device_token_ids(cupy_backend):
    """Batches come from the data pipeline as host arrays: checked there, then copied over."""
    cfg = translator.Config.preset("tiny")
    params = translator.init_params(cfg, 0)
    src, tgt = np.array([[5, 3]]), np.array([[2, 5, 3]])
    host, _ = translator.loss_and_grads(params, cfg, src, tgt)
    device, _ = translator.loss_and_grads(params, cfg, backend.to_device(src), backend.to_device(tgt))
    assert float(host["loss"]) == float(device["loss"])


def test_continuous_beam_search_on_cupy_gives_numpy_tokens(cupy_backend):
    """Batches refilled as sentences end (rows at different positions in one step) on the CuPy
    path: the tokens NumPy finds."""
    from minitfm.decoding import batched
    cfg = translator.Config.preset("tiny", d_model=16, d_ff=32, n_heads=4)
    rng = np.random.default_rng(4)
    sentences = [rng.integers(4, cfg.src_vocab, size=n).tolist() for n in (5, 1, 7, 0, 3)]
    found = {}
    for name in ("numpy", "cupy"):
        backend.use(name)
        params = translator.init_params(cfg, 0, dtype=np.float64)
        found[name] = batched.translate_ids(params, cfg, sentences, beam=2, nbest=2, batch_size=2,
                                         max_len=9)
    assert [[h[0] for h in hyps] for hyps in found["cupy"]] == \
        [[h[0] for h in hyps] for hyps in found["numpy"]]
