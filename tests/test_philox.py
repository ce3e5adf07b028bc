"""Tests of minitfm.backend.philox: the block function against published answers and an independent
implementation, the stream and its draws, the distributions, and (``gpu``) the CuPy backend's
dropout and sampling, which draw from it.

The array code is the same on both backends, so everything but the ``gpu`` tests runs it with
NumPy arrays. ``numpy.random.Philox`` is Philox4x64-10 (64-bit words, other multipliers), so the
word-for-word reference for Philox4x32-10 is randomgen's ``Philox(number=4, width=32)``.
"""

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitfm import backend
from minitfm.backend import philox
from minitfm.backend.philox import Philox

pytestmark = pytest.mark.usefixtures("numpy_backend")

U64 = np.uint64


def block_of(counter, key):
    """The block function on one counter: 4 words -> 4 words (host ints)."""
    c = [np.array([w], dtype=U64) for w in counter]
    return [int(w[0]) for w in philox.block(*c, *key, np)]


# Known answers for Philox4x32-10, from the kat_vectors file of the Random123 distribution
# (D. E. Shaw Research, random123 "examples/kat_vectors", lines "philox4x32 10"):
# counter c0 c1 c2 c3, key k0 k1, expected output.
KAT_4X32_10 = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff),
     (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),   # pi's digits
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
]


@pytest.mark.parametrize("counter, key, expected", KAT_4X32_10)
def test_block_function_gives_the_published_answers(counter, key, expected):
    assert block_of(counter, key) == list(expected)


def test_stream_gives_the_cpp_standards_answer():
    """C++26 [rand.predef], philox4x32: the 10000th value of a default-constructed engine (key
    (20111115, 0), counter 0; the words of block 0, then block 1, ...) is 1955073260."""
    assert int(Philox(20111115, xp=np).words(10000)[9999]) == 1955073260


def test_block_function_works_on_whole_arrays():
    counters = [np.array([KAT_4X32_10[i][0][w] for i in (0, 2)], dtype=U64) for w in range(4)]
    out = philox.block(*counters, *KAT_4X32_10[2][1], np)
    assert [int(w[1]) for w in out] == list(KAT_4X32_10[2][2])
    assert all(w.dtype == U64 and w.shape == (2,) for w in out)


# ---- against an independent implementation, word for word ------------------------------------

def reference_stream(key: int, counter: int, n: int):
    """n words of randomgen's Philox4x32-10 from block ``counter`` on. It holds the counter as
    the integer c0 + 2^32 c1 + 2^64 c2 + 2^96 c3 and the key as k0 + 2^32 k1, increments the
    counter *before* each block, and gives the 4 words of a block in order, one per random_raw."""
    randomgen = pytest.importorskip("randomgen")
    bits = randomgen.Philox(key=key, counter=(counter - 1) % 2**128, number=4, width=32)
    return bits.random_raw(n)


@settings(max_examples=40)
@given(key=st.integers(0, 2**64 - 1), counter=st.integers(0, 2**128 - 1))
def test_block_function_equals_randomgen(key, counter):
    words = [(counter >> (32 * i)) & 0xFFFFFFFF for i in range(4)]
    assert block_of(words, (key & 0xFFFFFFFF, key >> 32)) == list(reference_stream(key, counter, 4))


@pytest.mark.parametrize("key, counter", [(0, 0), (0x299f31d0a4093822, 5), (2**64 - 1, 0),
                                          (12345, 2**32 - 3), (2**63 + 7, 2**64 - 41)])
def test_stream_equals_randomgen_word_for_word(key, counter):
    """Counters crossing 2^32 carry into c1; the last case ends at the top of the 2^64 blocks."""
    g = Philox(key, counter, xp=np)
    words = g.words(157)                                 # 39 blocks and one word of a 40th
    assert words.dtype == U64 and words.shape == (157,)
    np.testing.assert_array_equal(words, reference_stream(key, counter, 157))
    assert g.counter == counter + 40
    np.testing.assert_array_equal(g.words(3), reference_stream(key, counter + 40, 3))


def test_stream_ends_after_2_to_the_64_blocks():
    g = Philox(1, 2**64 - 2, xp=np)
    g.words(8)
    with pytest.raises(ValueError, match="used up"):
        g.words(1)


def test_key_and_counter_are_checked():
    with pytest.raises(ValueError, match="key and counter"):
        Philox(2**64, xp=np)
    with pytest.raises(ValueError, match="key and counter"):
        Philox(0, -1, xp=np)


# ---- keys from (seed, *stream) -------------------------------------------------------------

def test_key_is_the_blake2b_hash_of_the_numbers():
    digest = hashlib.blake2b(b"7,3,1", digest_size=8).digest()
    assert philox.key_of(7, 3, 1) == int.from_bytes(digest, "little")
    assert philox.key_of(np.int64(7), 3, 1) == philox.key_of(7, 3, 1)
    assert len({philox.key_of(*s) for s in [(1, 23), (12, 3), (123,), (1, 2, 3), (-1, 23)]}) == 5


def test_stream_names_must_be_integers():
    with pytest.raises(TypeError, match="named by integers.*0.5"):
        Philox.seeded(1, 0.5, xp=np)


def masks(seed, step, batch, shape=(33, 17), threshold=6554):
    return Philox.seeded(seed, step, batch, xp=np).keep(shape, threshold)


def test_masks_are_a_function_of_seed_step_and_batch():
    a = masks(0, 5, 1)
    np.testing.assert_array_equal(a, masks(0, 5, 1))
    for other in [(1, 5, 1), (0, 6, 1), (0, 5, 0), (0, 5, 2)]:
        assert (masks(*other) != a).mean() > 0.1, other


def test_successive_draws_differ_and_replay():
    g, h = Philox.seeded(3, 1, xp=np), Philox.seeded(3, 1, xp=np)
    first, second = g.keep((9, 7), 30000), g.keep((9, 7), 30000)
    assert (first != second).any()
    np.testing.assert_array_equal(h.keep((9, 7), 30000), first)
    np.testing.assert_array_equal(h.keep((9, 7), 30000), second)
    u, v = g.random(5), g.random(5)
    assert not np.array_equal(u, v)
    np.testing.assert_array_equal(h.random(5), u)


# ---- from words to values --------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(), 1, 3, (5,), (7, 3), (3, 5, 7), (2, 0, 3)])
def test_values_are_made_from_the_words_as_documented(shape):
    size = int(np.prod(shape))
    words = Philox(99, xp=np).words(4 * size + 4)

    u32 = Philox(99, xp=np).random(shape, dtype=np.float32)
    assert u32.dtype == np.float32 and u32.shape == np.empty(shape).shape
    np.testing.assert_array_equal(u32.reshape(-1), (words[:size] >> 8) * 2.0 ** -24)

    u64 = Philox(99, xp=np).random(shape)
    assert u64.dtype == np.float64 and u64.shape == np.empty(shape).shape
    pairs = words[:2 * size].reshape(-1, 2)
    bits = ((pairs[:, 0] << U64(32)) | pairs[:, 1]) >> U64(11)
    np.testing.assert_array_equal(u64.reshape(-1), bits * 2.0 ** -53)

    keep = Philox(99, xp=np).keep(shape, 20000)
    halves = np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(-1)[:size]
    assert keep.dtype == bool and keep.shape == np.empty(shape).shape
    np.testing.assert_array_equal(keep.reshape(-1), halves >= 20000)


def test_odd_sizes_are_prefixes_of_the_next_even_ones():
    """A draw uses whole blocks: an odd size takes the first elements of the rounded-up draw."""
    for size in (1, 3, 5, 7, 9, 1001):
        np.testing.assert_array_equal(Philox(5, xp=np).keep(size, 40000),
                                      Philox(5, xp=np).keep(size + 1, 40000)[:size])
        np.testing.assert_array_equal(
            Philox(5, xp=np).random(size, dtype=np.float32),
            Philox(5, xp=np).random(size + 3, dtype=np.float32)[:size])


def test_random_refuses_other_dtypes():
    with pytest.raises(ValueError, match="float32 or float64"):
        Philox(0, xp=np).random(3, dtype=np.float16)
    with pytest.raises(ValueError, match="negative"):
        Philox(0, xp=np).random((2, -1))


# ---- distributions (fixed seeds) ---------------------------------------------------------------

@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_keep_fraction_is_one_minus_p(p):
    threshold = round(p * 2**16)
    keep = Philox.seeded(11, round(p * 10), xp=np).keep((1001, 999), threshold)     # odd size
    q = 1 - threshold / 2**16
    assert abs(keep.mean() - q) < 5 * np.sqrt(q * (1 - q) / keep.size)
    # the low and the high halves of the words are kept at the same rate
    for half in (keep.reshape(-1)[0::2], keep.reshape(-1)[1::2]):
        assert abs(half.mean() - q) < 5 * np.sqrt(q * (1 - q) / half.size)


def test_backend_dropout_keep_uses_the_philox_mask():
    keep, scale = backend.dropout_keep(Philox.seeded(2, 3, 4, xp=np), (31, 13), 0.1)
    np.testing.assert_array_equal(keep, masks(2, 3, 4, shape=(31, 13), threshold=6554))
    assert scale == 2**16 / (2**16 - 6554)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_uniforms_are_uniform_in_0_1(dtype):
    u = Philox.seeded(4, 2, xp=np).random((999, 1001), dtype=dtype)
    assert u.min() >= 0.0 and u.max() < 1.0
    n = u.size
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n)
    assert abs(u.var() - 1 / 12) < 5 * np.sqrt(1 / 180 / n)        # Var[(U - 1/2)^2] = 1/180
    counts = np.bincount((u.reshape(-1) * 64).astype(int), minlength=64)   # chi-square, 63 dof
    expected = n / 64
    assert ((counts - expected) ** 2 / expected).sum() < 123.0     # about the 0.99999 quantile


def test_sampling_draws_with_a_philox_generator():
    """sampling.draw takes one uniform per row: a Philox generator gives the right frequencies."""
    from minitfm.decoding.sampling import draw
    q = np.array([0.5, 0.25, 0.125, 0.125])
    ids = draw(np.tile(np.log(q), (40_000, 1)), Philox.seeded(1, xp=np))
    counts = np.bincount(ids, minlength=4)
    assert (((counts - 40_000 * q) ** 2) / (40_000 * q)).sum() < 21.1    # chi-square 3 dof, 0.9999
    np.testing.assert_array_equal(draw(np.tile(np.log(q), (50, 1)), Philox.seeded(1, xp=np)),
                                  ids[:50])


# ---- the CuPy backend (a CUDA device, or the CuPy double) -------------------------------------

def _forbid_array_library_generators(monkeypatch, cupy):
    """Count (and refuse) every generator the array library is asked to create."""
    created = []

    def refuse(*args, **kwargs):
        created.append(args)
        raise AssertionError("an array-library random generator was created")

    monkeypatch.setattr(cupy.random, "default_rng", refuse)
    return created


@pytest.mark.gpu
def test_cupy_draws_the_same_words_as_numpy(cupy_backend):
    import cupy
    g = Philox(0x299f31d0a4093822, 2**32 - 3, xp=cupy)
    words = g.words(157)
    assert isinstance(words, cupy.ndarray)
    backend.use("numpy")
    np.testing.assert_array_equal(Philox(0x299f31d0a4093822, 2**32 - 3, xp=np).words(157),
                                  cupy.asnumpy(words))
    backend.use("cupy")
    assert isinstance(backend.rng(0, 1, 2), Philox)


@pytest.mark.gpu
def test_training_updates_on_cupy_create_no_generator_and_replay_their_masks(cupy_backend,
                                                                            monkeypatch):
    """Two updates' masks: the same from a fresh state, batch by batch whatever the split (a
    worker's share), equal to the NumPy-computed Philox masks of (seed, step, i)."""
    import cupy

    from minitfm import tasks
    from minitfm.models import translator as model
    from minitfm.training.loop import accumulate
    from minitfm.training.state import TrainState
    created = _forbid_array_library_generators(monkeypatch, cupy)
    drawn = []
    keep_of = backend.dropout_keep

    def recording(generator, shape, p, raw=None):
        keep, scale = keep_of(generator, shape, p, raw)
        drawn.append((generator.key, keep))        # device arrays: copied after the updates
        return keep, scale

    monkeypatch.setattr(backend, "dropout_keep", recording)
    vocab = tasks.model_vocab(7)
    cfg = model.Config.preset("tiny", src_vocab=vocab, tgt_vocab=vocab, dropout=0.1)
    rng = backend.host_rng(0)
    batches = [tasks.to_batch(*tasks.sample("copy", rng, 3, vocab=7, length=5)) for _ in range(2)]

    def masks_of(micro_batches, first=0):
        drawn.clear()
        state = TrainState(params=model.init_params(cfg, 0), optimizer=None, seed=4)
        accumulate(state, cfg, micro_batches, step=3, seed=4, first=first)
        return [(key, cupy.asnumpy(keep)) for key, keep in drawn]

    whole = masks_of(batches)
    again = masks_of(batches)
    second_alone = masks_of(batches[1:], first=1)
    assert not created
    assert len(whole) == len(again) > 2
    for (k1, a), (k2, b) in zip(whole, again):
        assert k1 == k2 and np.array_equal(a, b)
    tail = whole[-len(second_alone):]
    assert all(k == philox.key_of(4, 3, 1) for k, _ in second_alone)
    for (k1, a), (k2, b) in zip(tail, second_alone):
        assert k1 == k2 and np.array_equal(a, b)
    first_key, first_mask = whole[0]
    assert first_key == philox.key_of(4, 3, 0)
    backend.use("numpy")
    expected = Philox.seeded(4, 3, 0, xp=np).keep(first_mask.shape, round(0.1 * 2**16))
    backend.use("cupy")
    np.testing.assert_array_equal(first_mask, expected)


@pytest.mark.gpu
def test_sampling_on_cupy_creates_no_generator_and_replays(cupy_backend, monkeypatch):
    import cupy

    from minitfm.decoding import generation
    from minitfm.models import lm
    created = _forbid_array_library_generators(monkeypatch, cupy)
    cfg = lm.LMConfig.preset("tiny")
    params = lm.init_params(cfg, 0)
    prompt = np.array([[3, 4, 5], [6, 7, 8]])
    a = [cupy.asnumpy(t) for t in generation.generate(params, cfg, prompt, 6, seed=2)]
    b = [cupy.asnumpy(t) for t in generation.generate(params, cfg, prompt, 6, seed=2)]
    c = [cupy.asnumpy(t) for t in generation.generate(params, cfg, prompt, 6, seed=3)]
    assert not created
    np.testing.assert_array_equal(np.stack(a), np.stack(b))
    assert not np.array_equal(np.stack(a), np.stack(c))
