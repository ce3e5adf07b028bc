"""Philox4x32-10, a counter-based random generator computed with whole-array operations.

Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC 2011): the
generator of cuRAND's ``curand_init(..., Philox4_32_10)``, JAX and PyTorch on GPUs. The random
words are a pure function of a key and a counter, so any element of the stream is computed on its
own: one array operation draws them all, with no state to create on the device. The CuPy backend
draws its dropout masks and sampling uniforms here (``backend.rng``); NumPy keeps its own
generator.

The block function: a 128-bit counter (c0, c1, c2, c3) and a 64-bit key (k0, k1), all 32-bit
words, go through 10 rounds of

    p0 = 0xD2511F53 * c0                      32 x 32 -> 64-bit products
    p1 = 0xCD9E8D57 * c2
    (c0, c1, c2, c3) <- (hi(p1) ^ c1 ^ k0,  lo(p1),  hi(p0) ^ c3 ^ k1,  lo(p0))

with the key bumped by the Weyl increments between rounds (k0 += 0x9E3779B9, k1 += 0xBB67AE85,
mod 2^32); the four words after round 10 are the output. hi and lo are the upper and lower 32
bits of the product: every word is held in a uint64 array, so a product of two 32-bit words is
exact, and ``>> 32`` and ``& 0xFFFFFFFF`` split it.

The stream of a generator: key = (k0, k1) = the low and high halves of a 64-bit integer K; block b
(b = 0, 1, 2, ...) has counter (b mod 2^32, b >> 32, 0, 0) and gives the 4 words
``w[4b], ..., w[4b + 3]``. A draw takes whole blocks, starting at the generator's offset, and
advances the offset past them, so successive draws from one generator differ and replay the same
on every run. ``Philox.seeded(seed, *stream)`` derives K from the integers
``(seed, *stream)``: K is the first 8 bytes, little-endian, of the BLAKE2b hash of their decimal
text joined by commas (``"seed,step,i"``), a fixed function on every machine.

From words to values (elements in row-major order):

    random, float32    (w >> 8) * 2^-24                          one word per element, in [0, 1)
    random, float64    ((w[2i] << 32 | w[2i+1]) >> 11) * 2^-53    two words per element, in [0, 1)
    keep mask          u >= threshold, with u = the low 16 bits of w[i // 2] for even i, the
                       high 16 bits for odd i: drop with probability threshold / 2^16

The shapes and sizes are host integers, and nothing is read back from the device. The array
module a generator computes with (NumPy or CuPy) is given to it (``xp``): the backend makes its
generators (``backend.rng``), and this module imports none of the library's.

The fused kernels that draw dropout masks (``layers/dropout.py`` and the kernels that fuse a
dropout) compute the same block function in CUDA C++ (:data:`DEVICE`), one thread per block of
the stream, 8 mask elements a thread: a generator hands them its key and the first block of the
draw (:meth:`Philox.take`), and moves on exactly as :meth:`Philox.keep` would, so a fused and a
plain run draw the same masks.
"""

from __future__ import annotations

import hashlib
import math
import operator

__all__ = ["Philox", "block", "key_of", "MULTIPLIERS", "WEYL", "ROUNDS", "DEVICE",
           "KEEP_PER_BLOCK", "DROPOUT_LEVELS", "dropout_threshold"]

MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
WEYL = (0x9E3779B9, 0xBB67AE85)
ROUNDS = 10
WORD = 0xFFFFFFFF


def block(c0, c1, c2, c3, k0: int, k1: int, xp):
    """Philox4x32-10 of the counters (c0, c1, c2, c3), uint64 arrays of 32-bit words of the
    array module ``xp``, under the key (k0, k1) (host integers): the four output words, uint64
    arrays of the same shape."""
    u64 = xp.uint64                         # every constant typed: no promotion surprises
    m0, m1, word, half = u64(MULTIPLIERS[0]), u64(MULTIPLIERS[1]), u64(WORD), u64(32)
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + WEYL[0]) & WORD, (k1 + WEYL[1]) & WORD
        p0 = c0 * m0                                # exact in uint64: both factors < 2^32
        p1 = c2 * m1
        c0, c1, c2, c3 = ((p1 >> half) ^ c1 ^ u64(k0), p1 & word,
                          (p0 >> half) ^ c3 ^ u64(k1), p0 & word)
    return c0, c1, c2, c3


KEEP_PER_BLOCK = 8      # 16-bit draws in one block of 4 words: mask elements per kernel thread
DROPOUT_LEVELS = 1 << 16   # drop probabilities are multiples of 2^-16: masks compare 16-bit draws


def dropout_threshold(p: float) -> tuple[int, float]:
    """``(threshold, scale)`` for drop probability ``p``: a 16-bit draw below ``threshold`` drops
    its element, and the kept ones are scaled by 1 / (1 - threshold / 2^16)."""
    threshold = round(p * DROPOUT_LEVELS)
    return threshold, DROPOUT_LEVELS / (DROPOUT_LEVELS - threshold)

DEVICE = r"""
// Philox4x32-10 (minitfm/backend/philox.py): block b of the stream of key (k0, k1), as 8 16-bit draws,
// u[2j] the low and u[2j + 1] the high half of word j: the keep-mask draws of elements
// 8(b - first) ... 8(b - first) + 7 of a draw that starts at block `first`.
__device__ __forceinline__ void philox_draws16(unsigned long long b, unsigned int k0,
                                               unsigned int k1, unsigned int u[8]) {
    unsigned int c0 = (unsigned int)b, c1 = (unsigned int)(b >> 32), c2 = 0u, c3 = 0u;
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        unsigned long long p0 = (unsigned long long)0xD2511F53u * c0;
        unsigned long long p1 = (unsigned long long)0xCD9E8D57u * c2;
        unsigned int n0 = (unsigned int)(p1 >> 32) ^ c1 ^ k0, n1 = (unsigned int)p1;
        unsigned int n2 = (unsigned int)(p0 >> 32) ^ c3 ^ k1, n3 = (unsigned int)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    }
    u[0] = c0 & 0xFFFFu; u[1] = c0 >> 16; u[2] = c1 & 0xFFFFu; u[3] = c1 >> 16;
    u[4] = c2 & 0xFFFFu; u[5] = c2 >> 16; u[6] = c3 & 0xFFFFu; u[7] = c3 >> 16;
}
"""


def key_of(seed: int, *stream: int) -> int:
    """The 64-bit key K of the generator of ``(seed, *stream)`` (see the module docstring)."""
    values = []
    for value in (seed, *stream):
        try:
            values.append(operator.index(value))
        except TypeError:
            raise TypeError(f"a random stream is named by integers, got {value!r} of type "
                            f"{type(value).__name__} in {(seed, *stream)!r}") from None
    text = ",".join(str(v) for v in values).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


class Philox:
    """The Philox4x32-10 stream of the 64-bit key ``key``, from block ``counter`` on, computed
    with the array module ``xp`` (NumPy or CuPy; its draws are arrays of that module).

    Offers what the library draws from a generator: :meth:`random` (uniforms, as a NumPy or
    CuPy ``Generator`` does) and :meth:`keep` (dropout masks at 16-bit resolution).
    """

    def __init__(self, key: int, counter: int = 0, *, xp):
        key, counter = operator.index(key), operator.index(counter)
        if not 0 <= key < 1 << 64 or not 0 <= counter < 1 << 64:
            raise ValueError(f"key and counter must be in [0, 2^64), got key={key}, "
                             f"counter={counter}")
        self.key = key
        self.counter = counter          # the next block a draw starts at
        self.xp = xp

    @classmethod
    def seeded(cls, seed: int, *stream: int, xp) -> "Philox":
        """The generator of ``(seed, *stream)``: its key hashed from them, its counter at 0."""
        return cls(key_of(seed, *stream), xp=xp)

    def words(self, n: int):
        """The next ``n`` words of the stream, a (n,) uint64 array of 32-bit values; the
        generator moves on by ceil(n / 4) blocks."""
        xp = self.xp
        blocks = -(-n // 4)
        b = xp.arange(blocks, dtype=xp.uint64) + xp.uint64(self._advance(blocks))   # (blocks,)
        zero = xp.zeros_like(b)
        low, high = b & xp.uint64(WORD), b >> xp.uint64(32)
        out = block(low, high, zero, zero, self.key & WORD, self.key >> 32, xp)
        return xp.stack(out, axis=-1).reshape(-1)[:n]                      # w[4b + j] = out[j][b]

    def take(self, size: int) -> tuple[int, int, int]:
        """For a kernel that draws a keep mask of ``size`` elements: ``(k0, k1, first)``, the key's
        low and high words and the first block of the draw; the generator moves on as
        :meth:`keep` of that size would (ceil(size / 8) blocks)."""
        first = self._advance(-(-operator.index(size) // KEEP_PER_BLOCK))
        return self.key & WORD, self.key >> 32, first

    def _advance(self, blocks: int) -> int:
        """The first of the next ``blocks`` blocks; the generator moves on past them."""
        if self.counter + blocks > 1 << 64:
            raise ValueError("this generator's 2^64 blocks are used up: start another stream")
        first, self.counter = self.counter, self.counter + blocks
        return first

    def random(self, shape, dtype=None):
        """Uniform numbers in [0, 1) of the given shape; ``dtype`` float64 (the default, as a
        NumPy or CuPy generator's) from 53 random bits, or float32 from 24."""
        xp = self.xp
        shape, size = _shape(shape)
        dtype = xp.dtype(xp.float64 if dtype is None else dtype)
        if dtype == xp.float32:
            bits = self.words(size) >> xp.uint64(8)                       # 24 random bits
            return (bits.astype(xp.float32) * xp.float32(2.0 ** -24)).reshape(shape)
        if dtype != xp.float64:
            raise ValueError(f"random draws float32 or float64, got dtype {dtype}")
        w = self.words(2 * size).reshape(size, 2)
        bits = ((w[:, 0] << xp.uint64(32)) | w[:, 1]) >> xp.uint64(11)    # 53 random bits
        return (bits.astype(xp.float64) * 2.0 ** -53).reshape(shape)

    def keep(self, shape, threshold: int):
        """A bool mask of the given shape, True where a 16-bit draw u (two per word) has
        ``u >= threshold``: False with probability ``threshold / 2^16``."""
        xp = self.xp
        shape, size = _shape(shape)
        w = self.words(-(-size // 2))
        t = xp.uint64(threshold)
        halves = xp.stack([(w & xp.uint64(0xFFFF)) >= t, (w >> xp.uint64(16)) >= t], axis=-1)
        return halves.reshape(-1)[:size].reshape(shape)


def _shape(shape):
    """``shape`` (an int or a tuple of ints, host integers) as a tuple, and its size."""
    shape = (shape,) if isinstance(shape, int) or not hasattr(shape, "__iter__") else shape
    shape = tuple(operator.index(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimensions are not allowed, got shape {shape}")
    return shape, math.prod(shape)
