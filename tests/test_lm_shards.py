"""The language model's step on a batch's shards (minitfm.speed.lm): shards that depend on the
batch's shape alone, the whole batch's loss and gradients up to float32 rounding, the same bits on
one thread or three, and the worker's threads given back as they were."""

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from minitfm import flat, speed
from minitfm.models import lm
from minitfm.speed import lm as shards
from minitfm.speed import policy, rows

CFG = lm.LMConfig(vocab=23, n_layers=2, d_model=16, d_ff=24, n_heads=2, max_len=12)
DROPOUTS = dict(dropout=0.1, attention_dropout=0.1, relu_dropout=0.1)


@pytest.fixture(autouse=True)
def on_numpy(numpy_backend, monkeypatch):
    monkeypatch.setattr(shards, "MIN_TOKENS", 8)        # shard the tests' small batches
    yield
    rows.use(False, 1)


def params_of(cfg, seed=0):
    """float32 parameters with random biases and gains (not the initial zeros and ones), so that
    every gradient is a sum of terms of both signs."""
    params = flat.flatten(lm.init_params(cfg, seed), dtype=np.float32)
    rng = np.random.default_rng(seed + 1)
    for array in params.values():
        array += rng.normal(0.0, 0.1, array.shape).astype(np.float32)
    return params


def blocks(rows_, seed=1, cfg=CFG):
    tokens = np.random.default_rng(seed).integers(0, cfg.vocab, size=(rows_, cfg.max_len + 1))
    return tokens[:, :-1], tokens[:, 1:]


def copied(stats, grads):
    return float(stats["loss"]), ({k: v.copy() for k, v in grads.items()} if grads else None)


def test_shards_are_runs_of_whole_blocks_that_depend_on_the_shape_alone(monkeypatch):
    monkeypatch.setattr(shards, "MIN_TOKENS", 256)
    assert shards.shards(22, 48) == [slice(0, 11), slice(11, 22)]
    assert shards.shards(7, 100) == [slice(0, 3), slice(3, 7)]
    assert shards.shards(10, 48) == [slice(0, 10)]       # 480 tokens: two shards of 240, too few
    assert shards.shards(1, 4096) == [slice(0, 1)]       # one block: it is not split
    for threads in (1, 2, 3):
        rows.use(True, threads)
        assert shards.shards(22, 48) == [slice(0, 11), slice(11, 22)]


def test_the_chooser_takes_float32_batches_of_two_shards_with_the_row_passes_on():
    params, (x, y) = params_of(CFG), blocks(6)
    assert policy.path(lm.loss_and_grads, params, CFG, x, y) is lm.loss_and_grads.plain
    rows.use(True, 2)
    assert policy.path(lm.loss_and_grads, params, CFG, x, y) is shards.sharded_loss_and_grads
    assert "sharded_loss_and_grads" in speed.explain(lm.loss_and_grads, params, CFG, x, y)
    small = blocks(1)                                    # one block of 12 tokens: whole
    assert policy.path(lm.loss_and_grads, params, CFG, *small) is lm.loss_and_grads.plain
    wide = flat.flatten(params, dtype=np.float64)        # the gradient checks' type: plain
    assert policy.path(lm.loss_and_grads, wide, CFG, x, y) is lm.loss_and_grads.plain


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("batch_rows", [2, 5, 8])
def test_the_shards_give_the_whole_batch_loss_and_gradients_up_to_rounding(threads, batch_rows):
    params, (x, y) = params_of(CFG), blocks(batch_rows)
    whole_loss, whole = copied(*lm.loss_and_grads.plain(params, CFG, x, y))
    rows.use(True, threads)
    stats, grads = lm.loss_and_grads(params, CFG, x, y)
    assert stats["tokens"] == x.size and stats["nll"] is stats["loss"]
    assert float(stats["loss"]) == pytest.approx(whole_loss, rel=1e-6)
    for name, g in grads.items():
        # two shards' sums where the whole batch made one: float32 rounding of the largest term
        scale = np.abs(whole[name]).max()
        np.testing.assert_allclose(g, whole[name], rtol=0, atol=2e-6 * scale, err_msg=name)
        assert np.abs(g - whole[name]).max() <= 2e-6 * scale


def test_a_planted_shard_offset_is_caught(monkeypatch):
    """A fault in the split (the second shard one block short) must not pass the test above."""
    params, (x, y) = params_of(CFG), blocks(6)
    whole_loss, _ = copied(*lm.loss_and_grads.plain(params, CFG, x, y))
    rows.use(True, 2)
    monkeypatch.setattr(shards, "shards", lambda n, t: [slice(0, n // 2), slice(n // 2, n - 1)])
    stats, _ = lm.loss_and_grads(params, CFG, x, y)
    assert float(stats["loss"]) != pytest.approx(whole_loss, rel=1e-6)


@pytest.mark.parametrize("dropout", [False, True])
def test_the_same_bits_on_one_thread_two_or_three(dropout):
    cfg = CFG.replace(**DROPOUTS) if dropout else CFG
    params, (x, y) = params_of(cfg), blocks(7, cfg=cfg)
    results = []
    for threads in (1, 2, 3, 2):
        rows.use(True, threads)
        generator = np.random.default_rng([4, 1]) if dropout else None
        results.append(copied(*lm.loss_and_grads(params, cfg, x, y, generator)))
    first_loss, first = results[0]
    for loss, grads in results[1:]:
        assert loss == first_loss
        for name in first:
            np.testing.assert_array_equal(grads[name], first[name], err_msg=name)


def test_dropout_draws_from_the_batch_generator():
    cfg = CFG.replace(**DROPOUTS)
    params, (x, y) = params_of(cfg), blocks(6, cfg=cfg)
    rows.use(True, 2)
    losses = [float(lm.loss_and_grads(params, cfg, x, y, np.random.default_rng(seed),
                                      grads=False)[0]["loss"]) for seed in (0, 0, 1)]
    assert losses[0] == losses[1] != losses[2]
    without = float(lm.loss_and_grads(params, cfg, x, y, None, grads=False)[0]["loss"])
    assert without not in losses


def test_the_arguments_of_the_plain_function_keep_their_meaning():
    """``out``, ``normalizer``, ``loss_scale`` and ``grads=False`` as the plain function reads
    them; a second step reuses the further shard's buffer and gives the same gradients."""
    params, (x, y) = params_of(CFG), blocks(6)
    scale = np.asarray(8.0, np.float32)
    whole_loss, whole = copied(*lm.loss_and_grads.plain(params, CFG, x, y, normalizer=50.0,
                                                        loss_scale=scale))
    rows.use(True, 2)
    out = flat.zeros_like(params)
    for _ in range(2):
        stats, grads = lm.loss_and_grads(params, CFG, x, y, normalizer=50.0, out=out,
                                         loss_scale=scale)
        assert grads is out
        assert float(stats["loss"]) == pytest.approx(whole_loss, rel=1e-6)
        for name in whole:
            np.testing.assert_allclose(out[name], whole[name], rtol=0,
                                       atol=2e-6 * np.abs(whole[name]).max(), err_msg=name)
    stats, grads = lm.loss_and_grads(params, CFG, x, y, grads=False)
    assert grads is None and stats["tokens"] == x.size


def test_bad_blocks_are_refused_with_the_plain_function_words():
    params, (x, y) = params_of(CFG), blocks(6)
    x = x.copy()
    x[5, 3] = CFG.vocab                                # in the second shard
    with pytest.raises(ValueError) as plain_error:
        lm.loss_and_grads.plain(params, CFG, x, y)
    rows.use(True, 2)
    with pytest.raises(ValueError) as sharded_error:
        lm.loss_and_grads(params, CFG, x, y)
    assert str(sharded_error.value) == str(plain_error.value)


def test_an_error_in_a_shard_reaches_the_caller_and_the_threads_are_given_back(monkeypatch):
    params, (x, y) = params_of(CFG), blocks(7)          # shards of 3 and 4 blocks
    rows.use(True, 2)
    blas_before = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    plain = lm.loss_and_grads.plain

    def failing(params, cfg, x, y, rng=None, **kwargs):
        if x.shape[0] == 4:
            raise RuntimeError("planted in the second shard")
        return plain(params, cfg, x, y, rng, **kwargs)

    monkeypatch.setattr(lm.loss_and_grads, "plain", failing)
    with pytest.raises(RuntimeError, match="planted in the second shard"):
        lm.loss_and_grads(params, CFG, x, y)
    assert [lib["num_threads"] for lib in threadpool_info()
            if lib["user_api"] == "blas"] == blas_before
    assert rows.threads() == 2 and not policy.plain_here()
    monkeypatch.setattr(lm.loss_and_grads, "plain", plain)
    loss, _ = copied(*lm.loss_and_grads(params, CFG, x, y))      # and the next step runs
    assert loss == pytest.approx(float(plain(params, CFG, x, y)[0]["loss"]), rel=1e-6)


def test_a_shard_runs_the_layers_own_paths_on_its_share_of_the_threads():
    rows.use(True, 4)
    seen = []

    def part(i):
        seen.append((rows.threads(), policy.plain_here()))
        return i

    assert rows.run(part, [0, 1], share=2) == [0, 1]
    assert seen == [(2, False), (2, False)]
    seen.clear()
    rows.run(part, [0, 1])                              # a row pass's blocks: plain code
    assert [here for _, here in seen] == [True, True]
    assert rows.threads() == 4
