"""Sync budgets: a GPU is fast only while the host never waits for it.

Every device-to-host copy (``float()`` of a device number, ``.get()``, ``.tolist()``, a boolean
mask, printing) makes the host wait until the device has finished all the work queued before it.
These tests run the library on the strict CuPy double, which counts each such copy and each
random generator the array library creates, and hold the budgets:

    inside a training update            0 copies
    a log line                          at most 1
    a validation batch                  at most 1
    a checkpoint                        one copy per flat buffer: parameters, Adam's m and v
    a beam-search step                  at most 1
    a sampled token                     at most 1
    random generators of CuPy           0 (dropout and sampling draw from Philox, keyed on
                                        the seed, the step and the batch)

Counting needs the double; on a real device (``pytest -m gpu``) these tests skip.
"""

import numpy as np
import pytest

from minitfm import backend, checkpoint, flat, optim
from minitfm.decoding import beam as search, decode, generation
from minitfm.models import lm
from minitfm.models import translator as model

from minitfm.training.validation import evaluate
from tests.test_train import CFG, epoch_batches, options, ragged_batch, train

pytestmark = pytest.mark.gpu


@pytest.fixture
def counted(cupy_backend):
    """The double's counters (``counting()``); skip on a real device."""
    import cupy
    if not hasattr(cupy, "_double"):
        pytest.skip("counting device-to-host copies needs the CuPy double")
    return cupy._double


def run_steps(counted, steps: int, log_every: int, **overrides):
    with counted.counting() as seen:
        state = train(CFG, epoch_batches, options(max_steps=steps, log_every=log_every,
                                                  **overrides))
    return seen, state


def test_a_training_update_never_waits_for_the_device(counted):
    """Runs of 4 and 12 updates with the same number of log lines wait as often: the updates
    themselves copy nothing to the host, and a log line copies once."""
    short, _ = run_steps(counted, 4, log_every=4)
    long, _ = run_steps(counted, 12, log_every=12)
    assert long.device_to_host == short.device_to_host, counted.describe(long.events)
    assert short.generators == long.generators == 0, counted.describe(long.events)


@pytest.mark.parametrize("clip_norm", [None, 1.0])
def test_a_log_line_copies_once(counted, clip_norm):
    """12 updates logged every 4 steps against every 12: two more log lines, two more copies
    (the loss, the NLL and the gradient norm travel together)."""
    few, _ = run_steps(counted, 12, log_every=12, clip_norm=clip_norm)
    many, _ = run_steps(counted, 12, log_every=4, clip_norm=clip_norm)
    assert many.device_to_host - few.device_to_host <= 2, counted.describe(many.events)


def test_validation_copies_at_most_once_per_batch(counted):
    params = model.init_params(CFG, 0)
    batches = [ragged_batch(seed) for seed in range(5)]
    with counted.counting() as seen:
        results = evaluate(params, CFG, batches)
    assert seen.device_to_host <= len(batches), counted.describe(seen.events)
    assert np.isfinite(results["valid_loss"])


def test_a_checkpoint_copies_each_flat_buffer_once(counted, tmp_path):
    params = flat.flatten(model.init_params(CFG, 0))
    adam = optim.Adam(params)
    with counted.counting() as seen:
        checkpoint.save(tmp_path / "c.npz", params, optimizer_state=adam.state_dict(), step=1,
                        config=CFG.to_dict(), vocab_id=None)
    assert seen.device_to_host == 3, counted.describe(seen.events)
    loaded = checkpoint.load(tmp_path / "c.npz")
    for name, array in params.items():
        np.testing.assert_array_equal(loaded.params[name], backend.to_host(array))


@pytest.mark.parametrize("beam", [1, 3])
def test_a_decoding_step_copies_at_most_once(counted, beam):
    params = model.init_params(CFG, 0)
    src, _ = ragged_batch(3)
    steps = 7
    with counted.counting() as seen:
        if beam == 1:
            decode.greedy(params, CFG, src, max_len=steps)
        else:
            search.beam_search(params, CFG, src, beam=beam, max_len=steps)
    assert seen.device_to_host <= steps, counted.describe(seen.events)


def test_a_sampled_token_copies_at_most_once(counted):
    cfg = lm.LMConfig(vocab=11, n_layers=1, d_model=8, n_heads=2, d_ff=16, max_len=16)
    params = lm.init_params(cfg, 0)
    count = 9
    with counted.counting() as seen:
        tokens = [backend.to_host(t) for t in generation.generate(params, cfg, np.array([[3, 4, 5]]),
                                                          count, temperature=0.8, top_k=5,
                                                          top_p=0.9, seed=1)]
    assert len(tokens) == count
    assert seen.device_to_host <= count, counted.describe(seen.events)
    assert seen.generators == 0, counted.describe(seen.events)
