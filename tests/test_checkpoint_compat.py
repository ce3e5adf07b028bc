"""Checkpoints written before the model interface existed still load, resume and decode.

``tests/fixtures/translator_step3.npz`` and ``lm_step3.npz`` are step 3 of the runs of
test_same_losses.py, saved by the code of that time (with a tiny sentencepiece vocabulary in the
translator's). Resumed to step 6 they must log the losses of the uninterrupted runs recorded
there; the translator must translate, and the language model sample, as they did then.
"""

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from minitfm import checkpoint, models
from minitfm.decoding import generation
from minitfm.cli import translate
from minitfm.models import lm, translator
from tests.test_same_losses import (LM_LOSSES, TRANSLATOR_LOSSES, lm_batches, lm_config,
                                    logged_losses, options, translator_batches,
                                    translator_config)
from tests.trainrun import train

FIXTURES = Path(__file__).parent / "fixtures"
# what the code of that time printed for the translator checkpoint (beam 2, 2-best) ...
TRANSLATION = "0 |||  ||| -2.0250\n0 |||  ||| -3.6358\n1 |||  ||| -2.0264\n1 |||  ||| -3.6360\n"
# ... and drew from the language model's (temperature 0.9, top-k 6, seed 5; then greedy)
SAMPLED = [[0, 0], [5, 5], [10, 5], [5, 10], [10, 0], [1, 7], [5, 0], [0, 0], [5, 5], [1, 10],
           [4, 7], [0, 10], [1, 0], [7, 0], [0, 10], [1, 10], [5, 5], [7, 5], [0, 5], [7, 1]]
GREEDY = [[0], [0], [0], [5], [5], [5], [5], [5]]


def test_old_checkpoints_load_with_their_kinds_and_names():
    for name, kind, config in [("translator_step3.npz", translator.KIND, translator_config()),
                               ("lm_step3.npz", lm.KIND, lm_config())]:
        ckpt = checkpoint.load(FIXTURES / name)
        assert ckpt.kind == kind and ckpt.step == 3
        assert ckpt.config == config.to_dict()
        assert type(config) is models.get(ckpt.kind).Config
        assert list(ckpt.params) == list(models.get(ckpt.kind).parameter_shapes(config))


@pytest.mark.parametrize("name", ["translator_step3.npz", "lm_step3.npz"])
def test_old_checkpoints_get_the_fields_added_since_at_their_old_values(name):
    """Saved before word dropout existed: their configs lack the field, and load with it off."""
    with np.load(FIXTURES / name) as archive:
        saved = json.loads(archive["meta"].tobytes().decode("utf-8"))["config"]
    assert "word_dropout" not in saved
    ckpt = checkpoint.load(FIXTURES / name)
    assert ckpt.config == {**saved, "word_dropout": 0.0}
    assert models.get(ckpt.kind).LATER_FIELDS == {"word_dropout": 0.0}


def test_a_config_of_other_fields_is_not_completed(tmp_path):
    """Only a config with every other field of its model's config gains the later ones."""
    config = {"d_model": 4, "note": "not a translator's config"}
    path = checkpoint.save(tmp_path / "c.npz", {"w": np.ones(2)}, step=1, config=config,
                           vocab_id=None)
    assert checkpoint.load(path).config == config


@pytest.mark.parametrize("name, config, batches, recorded", [
    ("translator_step3.npz", translator_config, translator_batches, TRANSLATOR_LOSSES),
    ("lm_step3.npz", lm_config, lm_batches, LM_LOSSES),
], ids=["translator", "lm"])
def test_old_checkpoints_resume_to_the_recorded_losses(name, config, batches, recorded, tmp_path,
                                                       numpy_backend):
    shutil.copy(FIXTURES / name, tmp_path / "checkpoint_00000003.npz")
    ckpt = checkpoint.load(FIXTURES / name, with_optimizer=False)
    state = train(config(), batches(), options(tmp_path, resume=True), vocab_id=ckpt.vocab_id,
                  vocab_model=ckpt.vocab_model)
    assert state.step == 6
    losses = logged_losses(tmp_path)
    np.testing.assert_allclose([losses[k] for k in (4, 5, 6)], recorded[3:], rtol=1e-6, atol=0)


def test_old_translator_checkpoint_translates_as_before(numpy_backend):
    out = io.StringIO()
    code = translate.main(["--checkpoint", str(FIXTURES / "translator_step3.npz"), "--beam", "2",
                           "--nbest", "2"], stdin=io.BytesIO(b"a man sings\ntwo dogs\n"),
                          stdout=out)
    assert code == 0 and out.getvalue() == TRANSLATION


def test_old_lm_checkpoint_samples_as_before(numpy_backend):
    ckpt = checkpoint.load(FIXTURES / "lm_step3.npz", with_optimizer=False)
    cfg = lm.LMConfig.from_dict(ckpt.config)
    params = checkpoint.params_to_device(ckpt.params)
    drawn = generation.generate(params, cfg, np.array([[4, 5, 6], [7, 8, 9]]), 20, temperature=0.9,
                        top_k=6, seed=5)
    assert [t.tolist() for t in drawn] == SAMPLED
    greedy = generation.generate(params, cfg, np.array([4, 5, 6]), 8, greedy=True)
    assert [t.tolist() for t in greedy] == GREEDY
