"""The model registry and interface: the kinds, the lookups, and a third model -- defined here
alone, registered, trained by the shared loop, checkpointed and resumed -- to show that a new
model touches no file but its own."""

import dataclasses
import json
import os
from dataclasses import dataclass

import numpy as np
import pytest

from minitfm import backend, checkpoint, flat, models, usable
from minitfm.training.rundir import LOG_NAME
from minitfm.training.state import TrainOptions
from tests.trainrun import train
from minitfm.layers import embedding, linear, loss
from minitfm.models import base, lm, translator


# ---- the registry -------------------------------------------------------------------------

def test_the_kinds_checkpoints_record_map_to_the_models():
    assert models.kinds() == ["transformer", "lm"]
    assert models.get("transformer") is translator and models.get("lm") is lm
    assert models.get(translator.KIND) is translator and models.get(lm.KIND) is lm
    with pytest.raises(ValueError, match="unknown model kind 'gpt': one of transformer, lm"):
        models.get("gpt")
    assert models.describe("lm") == lm.DESCRIPTION
    assert "unknown kind 'gpt'" in models.describe("gpt")


def test_the_config_picks_the_model_the_loop_trains():
    assert models.of(lm.LMConfig.preset("tiny")) is lm
    assert models.of(translator.Config.preset("tiny")) is translator
    with pytest.raises(TypeError, match="dict is not the config of a registered model"):
        models.of({"vocab": 3})


@pytest.mark.parametrize("model", [translator, lm], ids=["translator", "lm"])
def test_each_model_has_every_member_of_the_interface(model):
    assert all(hasattr(model, name) for name in base.MEMBERS)
    cfg = model.Config.preset("tiny")
    assert model.Config.from_dict(cfg.to_dict()) == cfg
    params = model.init_params(cfg, 0)
    model.check_params(params, cfg)
    assert list(params) == list(model.parameter_shapes(cfg))


def test_register_refuses_what_is_not_a_model_or_a_kind_taken():
    with pytest.raises(TypeError, match="lacks .*loss_and_grads"):
        models.register(type("Half", (), {"KIND": "half", "Config": dict}))
    clash = type("Clash", (), {name: getattr(lm, name) for name in base.MEMBERS})
    clash.Config = type("OtherConfig", (), {})
    with pytest.raises(ValueError, match="kind 'lm' is registered already"):
        models.register(clash)


# ---- a third model, defined here alone -------------------------------------------------------

@dataclass(frozen=True)
class BagConfig:
    vocab: int = 12
    classes: int = 3
    d_model: int = 8
    max_len: int = 16

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        return cls(**d)


class BagOfEmbeddings:
    """A classifier: the mean of a sentence's token embeddings, then a linear layer and the
    cross-entropy; batches are (ids (B, T), labels (B,)). The backward is written out with the
    layers' own, under the gradient rule (the embedding adds into a zeroed buffer)."""

    KIND = "bag-of-embeddings"
    DESCRIPTION = "a bag-of-embeddings classifier"
    Config = BagConfig

    @staticmethod
    def parameter_shapes(cfg):
        return {"emb": (cfg.vocab, cfg.d_model), "out.w": (cfg.d_model, cfg.classes),
                "out.b": (cfg.classes,)}

    @staticmethod
    def init_params(cfg, seed=0, dtype=None):
        shapes = BagOfEmbeddings.parameter_shapes(cfg)
        return base.initial_values(shapes, cfg.d_model, seed, dtype,
                                   normal={"emb": cfg.d_model ** -0.5})

    @staticmethod
    def check_params(params, cfg):
        base.check_param_shapes(params, BagOfEmbeddings.parameter_shapes(cfg))

    @staticmethod
    def batch_tokens(batch, cfg):
        return int(len(batch[1]))                 # one label per sentence

    @staticmethod
    def output_vocab(cfg):
        return cfg.classes

    @staticmethod
    def batch_bytes(cfg, *, rows, src_len, tgt_len, float_bytes, attention=True):
        return float_bytes * rows * (tgt_len * cfg.d_model + cfg.classes), 0

    @staticmethod
    def logits(params, cfg, h):
        return h @ params["out.w"] + params["out.b"]

    @staticmethod
    def loss_and_grads(params, cfg, ids, labels, rng=None, *, grads=True, normalizer=None,
                       out=None):
        BagOfEmbeddings.check_params(params, cfg)
        ids = backend.to_device(base.check_tokens(np.asarray(ids), "ids", cfg.vocab, cfg))
        labels = backend.to_device(np.asarray(labels))
        e, c_emb = embedding.forward(ids, {"table": params["emb"]}, scale=1.0)   # (B, T, d)
        h = e.mean(axis=1)                                                      # (B, d)
        z, c_out = linear.forward(h, {"w": params["out.w"], "b": params["out.b"]})
        (loss_sum, _), c_loss = loss.forward(z, labels, 0.0)
        norm = float(normalizer) if normalizer is not None else float(len(labels))
        stats = {"loss": loss_sum / norm, "nll": loss_sum / norm, "tokens": int(len(labels))}
        if not grads:
            return stats, None
        out = flat.zeros_like(params) if out is None else out
        dz, _ = loss.backward(1.0 / norm, c_loss)
        dh, _ = linear.backward(dz, c_out, {"w": out["out.w"], "b": out["out.b"]})
        de = backend.xp.repeat(dh[:, None, :] / ids.shape[1], ids.shape[1], axis=1)
        out["emb"][...] = 0.0                     # the embedding adds: nothing was written yet
        embedding.backward(de, c_emb, {"table": out["emb"]})
        return stats, out


@pytest.fixture
def bag():
    models.register(BagOfEmbeddings)
    yield BagOfEmbeddings
    models.unregister(BagOfEmbeddings.KIND)


def bag_batches(epoch):
    """Sentences of 6 tokens; the label is which of tokens 0, 1, 2 occurs most."""
    rng = np.random.default_rng(epoch)
    for _ in range(8):
        ids = rng.integers(0, 12, size=(16, 6))
        counts = np.stack([(ids == k).sum(axis=1) for k in range(3)], axis=1)
        yield ids, counts.argmax(axis=1)


def _options(out_dir, steps, **more):
    return TrainOptions(max_steps=steps, out_dir=str(out_dir), seed=1, warmup=5, log_every=1,
                        save_every=10, lr_factor=4.0, progress=False, **more)


def test_a_third_model_trains_checkpoints_and_resumes_in_the_shared_loop(bag, tmp_path,
                                                                         numpy_backend):
    cfg = BagConfig()
    assert models.of(cfg) is bag and models.kinds()[-1] == bag.KIND
    state = train(cfg, bag_batches, _options(tmp_path / "straight", 40))
    with open(tmp_path / "straight" / LOG_NAME) as f:
        losses = [r["loss"] for r in map(json.loads, f) if "loss" in r]
    assert losses[-1] < 0.8 * losses[0]                         # it learns

    ckpt = checkpoint.load(checkpoint.latest(tmp_path / "straight"))
    assert ckpt.kind == bag.KIND and list(ckpt.params) == ["emb", "out.w", "out.b"]
    assert usable.problem(ckpt, bag.KIND) is None
    assert "holds a bag-of-embeddings classifier" in usable.problem(ckpt, lm.KIND)[1]

    train(cfg, bag_batches, _options(tmp_path / "resumed", 20))
    resumed = train(cfg, bag_batches, _options(tmp_path / "resumed", 40, resume=True))
    assert resumed.step == 40
    for name, value in state.params.items():
        np.testing.assert_array_equal(resumed.params[name], value, err_msg=name)
    assert os.path.exists(tmp_path / "resumed" / "checkpoint_00000040.npz")


def test_an_unregistered_config_is_refused_by_the_loop(tmp_path):
    with pytest.raises(TypeError, match="BagConfig is not the config of a registered model"):
        train(BagConfig(), bag_batches, _options(tmp_path, 2))
