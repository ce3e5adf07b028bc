"""The models' steps on a batch's shards (minitfm.speed.shards, minitfm.speed.lm,
minitfm.speed.translator): shards that depend on the batch's shape alone, the whole batch's loss
and gradients up to float32 rounding, the same bits on one thread or three, dropout drawn from
the batch's generator, and the worker's threads given back as they were."""

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from minitfm import backend, flat, speed
from minitfm.gradcheck.cases import translation_batch
from minitfm.models import lm, translator
from minitfm.speed import lm as speed_lm
from minitfm.speed import policy, rows, shards
from minitfm.speed import translator as speed_translator

DROPOUTS = dict(dropout=0.1, attention_dropout=0.1, relu_dropout=0.1)
LM = lm.LMConfig(vocab=23, n_layers=2, d_model=16, d_ff=24, n_heads=2, max_len=12)
TRANSLATOR = translator.Config.preset("tiny", src_vocab=19, tgt_vocab=21, d_model=16, d_ff=24,
                                      max_len=12, label_smoothing=0.1, share_embeddings=False)


def lm_blocks(cfg, rows_, seed):
    tokens = np.random.default_rng(seed).integers(0, cfg.vocab, size=(rows_, cfg.max_len + 1))
    return tokens[:, :-1], tokens[:, 1:]


def sentences(cfg, rows_, seed):
    return translation_batch(backend.host_rng(seed), cfg, rows_, 9, 10)


MODELS = {"lm": (lm, LM, lm_blocks, speed_lm), "translator": (translator, TRANSLATOR, sentences,
                                                              speed_translator)}


@pytest.fixture(autouse=True)
def on_numpy(numpy_backend, monkeypatch):
    monkeypatch.setattr(shards, "MIN_WORK", 8 * 16)      # shard the tests' small batches
    yield
    rows.use(False, 1)


def params_of(model, cfg, seed=0):
    """float32 parameters with random biases and gains (not the initial zeros and ones), so that
    every gradient is a sum of terms of both signs."""
    params = flat.flatten(model.init_params(cfg, seed), dtype=np.float32)
    rng = np.random.default_rng(seed + 1)
    for array in params.values():
        array += rng.normal(0.0, 0.1, array.shape).astype(np.float32)
    return params


def case(name, rows_=6, seed=1, **changes):
    model, cfg, batch, _ = MODELS[name]
    cfg = cfg.replace(**changes) if changes else cfg
    return model, cfg, params_of(model, cfg), batch(cfg, rows_, seed)


def copied(stats, grads):
    numbers = (float(stats["loss"]), float(stats["nll"]), stats["tokens"])
    return numbers, ({k: v.copy() for k, v in grads.items()} if grads else None)


def assert_close_to_whole(grads, whole, exact):
    """The shards' gradients as close to the exact ones (``exact``: float64) as the whole batch's
    float32 gradients are, within a factor: the shards' rows go through products of fewer rows,
    whose float32 rounding differs, and their sums add two shards' sums where the whole batch
    made one; a wrong split is off by the size of the gradients themselves."""
    for name, g in grads.items():
        error = np.abs(g - exact[name]).max()
        whole_error = np.abs(whole[name] - exact[name]).max()
        unit = np.finfo(np.float32).eps * np.abs(exact[name]).max()
        assert error <= 10 * max(whole_error, unit), (name, error, whole_error, unit)


def test_shards_are_runs_of_whole_rows_that_depend_on_the_shape_alone(monkeypatch):
    monkeypatch.setattr(shards, "MIN_WORK", 256 * 128)
    assert shards.shards(22, 48, 128) == [slice(0, 11), slice(11, 22)]
    assert shards.shards(7, 100, 128) == [slice(0, 3), slice(3, 7)]
    assert shards.shards(10, 48, 128) == [slice(0, 10)]  # 480 tokens: two shards of 240, too few
    assert shards.shards(10, 48, 256) == [slice(0, 5), slice(5, 10)]    # but twice as wide
    assert shards.shards(1, 4096, 128) == [slice(0, 1)]  # one row: it is not split
    for threads in (1, 2, 3):
        rows.use(True, threads)
        assert shards.shards(22, 48, 128) == [slice(0, 11), slice(11, 22)]


@pytest.mark.parametrize("name", MODELS)
def test_the_chooser_takes_float32_batches_of_two_shards_with_the_row_passes_on(name):
    model, cfg, params, (a, b) = case(name)
    fast = MODELS[name][3].sharded_loss_and_grads
    assert policy.path(model.loss_and_grads, params, cfg, a, b) is model.loss_and_grads.plain
    rows.use(True, 2)
    assert policy.path(model.loss_and_grads, params, cfg, a, b) is fast
    assert "sharded_loss_and_grads" in speed.explain(model.loss_and_grads, params, cfg, a, b)
    one = (a[:1], b[:1])                                  # one row: whole
    assert policy.path(model.loss_and_grads, params, cfg, *one) is model.loss_and_grads.plain
    wide = flat.flatten(params, dtype=np.float64)         # the gradient checks' type: plain
    assert policy.path(model.loss_and_grads, wide, cfg, a, b) is model.loss_and_grads.plain


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("batch_rows", [2, 5, 8])
def test_the_shards_give_the_whole_batch_loss_and_gradients_up_to_rounding(name, threads,
                                                                          batch_rows):
    model, cfg, params, (a, b) = case(name, batch_rows)
    (loss, nll, tokens), whole = copied(*model.loss_and_grads.plain(params, cfg, a, b))
    _, exact = copied(*model.loss_and_grads.plain(flat.flatten(params, dtype=np.float64), cfg,
                                                  a, b))
    rows.use(True, threads)
    assert policy.path(model.loss_and_grads, params, cfg, a, b) is not model.loss_and_grads.plain
    stats, grads = model.loss_and_grads(params, cfg, a, b)
    assert stats["tokens"] == tokens
    assert float(stats["loss"]) == pytest.approx(loss, rel=1e-6)
    assert float(stats["nll"]) == pytest.approx(nll, rel=1e-6)
    assert_close_to_whole(grads, whole, exact)


@pytest.mark.parametrize("name", MODELS)
def test_a_planted_shard_offset_is_caught(name, monkeypatch):
    """A fault in the split (the second shard one row short) must not pass the test above."""
    model, cfg, params, (a, b) = case(name)
    (loss, _, _), _ = copied(*model.loss_and_grads.plain(params, cfg, a, b))
    rows.use(True, 2)
    monkeypatch.setattr(shards, "shards",
                        lambda n, t, d: [slice(0, n // 2), slice(n // 2, n - 1)])
    stats, _ = model.loss_and_grads(params, cfg, a, b)
    assert float(stats["loss"]) != pytest.approx(loss, rel=1e-6)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("dropout", [False, True])
def test_the_same_bits_on_one_thread_two_or_three(name, dropout):
    model, cfg, params, (a, b) = case(name, 7, **(DROPOUTS if dropout else {}))
    results = []
    for threads in (1, 2, 3, 2):
        rows.use(True, threads)
        generator = np.random.default_rng([4, 1]) if dropout else None
        results.append(copied(*model.loss_and_grads(params, cfg, a, b, generator)))
    first_numbers, first = results[0]
    for numbers, grads in results[1:]:
        assert numbers == first_numbers
        for key in first:
            np.testing.assert_array_equal(grads[key], first[key], err_msg=key)


@pytest.mark.parametrize("name", MODELS)
def test_dropout_draws_from_the_batch_generator(name):
    model, cfg, params, (a, b) = case(name, **DROPOUTS)
    rows.use(True, 2)
    losses = [float(model.loss_and_grads(params, cfg, a, b, np.random.default_rng(seed),
                                         grads=False)[0]["loss"]) for seed in (0, 0, 1)]
    assert losses[0] == losses[1] != losses[2]
    without = float(model.loss_and_grads(params, cfg, a, b, None, grads=False)[0]["loss"])
    assert without not in losses


@pytest.mark.parametrize("name", MODELS)
def test_the_arguments_of_the_plain_function_keep_their_meaning(name):
    """``out``, ``normalizer``, ``loss_scale`` and ``grads=False`` as the plain function reads
    them; a second step reuses the further shard's buffer and gives the same gradients."""
    model, cfg, params, (a, b) = case(name)
    scale = np.asarray(8.0, np.float32)
    (loss, _, _), whole = copied(*model.loss_and_grads.plain(params, cfg, a, b, normalizer=50.0,
                                                             loss_scale=scale))
    _, exact = copied(*model.loss_and_grads.plain(flat.flatten(params, dtype=np.float64), cfg,
                                                  a, b, normalizer=50.0,
                                                  loss_scale=np.asarray(8.0)))
    rows.use(True, 2)
    out = flat.zeros_like(params)
    for _ in range(2):
        stats, grads = model.loss_and_grads(params, cfg, a, b, normalizer=50.0, out=out,
                                            loss_scale=scale)
        assert grads is out
        assert float(stats["loss"]) == pytest.approx(loss, rel=1e-6)
        assert_close_to_whole(out, whole, exact)
    stats, grads = model.loss_and_grads(params, cfg, a, b, grads=False)
    assert grads is None and stats["tokens"] == model.batch_tokens((a, b), cfg)


def test_a_translator_shard_without_targets_runs_the_batch_whole():
    model, cfg, params, (src, tgt) = case("translator")
    tgt = tgt.copy()
    tgt[3:, 1:] = cfg.pad_id                             # the second shard: no target at all
    rows.use(True, 2)
    numbers, grads = copied(*model.loss_and_grads(params, cfg, src, tgt))
    plain_numbers, plain = copied(*model.loss_and_grads.plain(params, cfg, src, tgt))
    assert numbers == plain_numbers
    for key in plain:
        np.testing.assert_array_equal(grads[key], plain[key], err_msg=key)


@pytest.mark.parametrize("name", MODELS)
def test_bad_batches_are_refused_with_the_plain_function_words(name):
    model, cfg, params, (a, b) = case(name)
    a = a.copy()
    a[5, 3] = 10 ** 6                                    # in the second shard
    with pytest.raises(ValueError) as plain_error:
        model.loss_and_grads.plain(params, cfg, a, b)
    rows.use(True, 2)
    with pytest.raises(ValueError) as sharded_error:
        model.loss_and_grads(params, cfg, a, b)
    assert str(sharded_error.value) == str(plain_error.value)


@pytest.mark.parametrize("name", MODELS)
def test_an_error_in_a_shard_reaches_the_caller_and_the_threads_are_given_back(name,
                                                                               monkeypatch):
    model, cfg, params, (a, b) = case(name, 7)          # shards of 3 and 4 rows
    rows.use(True, 2)
    blas_before = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    plain = model.loss_and_grads.plain

    def failing(params, cfg, a, b, rng=None, **kwargs):
        if a.shape[0] == 4:
            raise RuntimeError("planted in the second shard")
        return plain(params, cfg, a, b, rng, **kwargs)

    monkeypatch.setattr(model.loss_and_grads, "plain", failing)
    with pytest.raises(RuntimeError, match="planted in the second shard"):
        model.loss_and_grads(params, cfg, a, b)
    assert [lib["num_threads"] for lib in threadpool_info()
            if lib["user_api"] == "blas"] == blas_before
    assert rows.threads() == 2 and not policy.plain_here()
    monkeypatch.setattr(model.loss_and_grads, "plain", plain)
    (loss, _, _), _ = copied(*model.loss_and_grads(params, cfg, a, b))   # the next step runs
    assert loss == pytest.approx(float(plain(params, cfg, a, b)[0]["loss"]), rel=1e-6)


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
