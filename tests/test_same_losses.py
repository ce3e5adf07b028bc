"""Both models train to the losses recorded before the model interface existed.

The figures below were measured with the code as it was before the models moved behind one
interface (``minitfm.models``): a short fixed-seed run of the shared loop for each model, with
every dropout on (so the masks matter), two batches per update and a log line per step. Moving
code around must not change a single operation, so the losses must agree to 1e-6 relative.
"""

import json
import os

import numpy as np
import pytest

from minitfm import tasks
from minitfm.training.rundir import LOG_NAME
from minitfm.training.state import TrainOptions
from tests import trainrun
from minitfm.models import lm, translator

TRANSLATOR_LOSSES = [4.005090713500977, 3.4246416091918945, 3.044092814127604,
                     2.6564455032348633, 2.4540440241495767, 2.3556137084960938]
LM_LOSSES = [3.046861012776693, 2.858407974243164, 2.3564276695251465,
             2.4278834660847983, 2.3092246055603027, 2.4203224182128906]
DROPOUTS = dict(dropout=0.1, attention_dropout=0.1, relu_dropout=0.1)


def translator_config(vocab: int = 32) -> translator.Config:
    return translator.Config.preset("tiny", src_vocab=vocab, tgt_vocab=vocab, n_layers=1, d_model=4,
                               d_ff=4, max_len=16, **DROPOUTS)


def translator_batches():
    """The copy task: the same batch stream for the same seed."""
    return tasks.train_batches("copy", vocab=6, length=5, batch_size=4, seed=0)


def lm_config() -> lm.LMConfig:
    return lm.LMConfig.preset("tiny", n_layers=1, d_model=4, d_ff=4, learned_positions=True,
                              **DROPOUTS)


def lm_batches():
    """Four fixed blocks (x, y) of 8 positions over an 11-token vocabulary."""
    rng = np.random.default_rng(0)
    return [(b[:, :-1], b[:, 1:]) for b in (rng.integers(0, 11, size=(3, 9)) for _ in range(4))]


def options(out_dir, **overrides) -> TrainOptions:
    """The recorded runs' options: 6 steps of 2 batches, warmup 3, a checkpoint every 3 steps."""
    settings = dict(max_steps=6, out_dir=str(out_dir), seed=3, warmup=3, log_every=1,
                    save_every=3, keep_last=5, update_freq=2, progress=False)
    return TrainOptions(**{**settings, **overrides})


def logged_losses(out_dir) -> dict[int, float]:
    with open(os.path.join(out_dir, LOG_NAME)) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


@pytest.mark.parametrize("config, batches, recorded", [
    (translator_config, translator_batches, TRANSLATOR_LOSSES),
    (lm_config, lm_batches, LM_LOSSES),
], ids=["translator", "lm"])
def test_training_reaches_the_recorded_losses(config, batches, recorded, tmp_path, numpy_backend):
    trainrun.train(config(), batches(), options(tmp_path))
    losses = logged_losses(tmp_path)
    assert sorted(losses) == list(range(1, 7))
    np.testing.assert_allclose([losses[k] for k in range(1, 7)], recorded, rtol=1e-6, atol=0)
