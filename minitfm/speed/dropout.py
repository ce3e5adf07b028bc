"""The fast paths of inverted dropout (``minitfm/layers/dropout.py``), chosen per call by
:mod:`minitfm.speed.policy`; the plain functions are their twins.

Fused (``--kernels fused``, on CuPy): the mask is drawn and applied in one kernel, which computes
the Philox stream itself (``philox.DEVICE``: one thread per block of the stream, 8 elements) and
draws exactly what ``Philox.keep`` draws; the backward pass is one kernel too. ``draw`` and
``mask_of`` serve the kernels that fuse a dropout with their own work (residual, feed-forward);
``apply_loop``, a compiled loop (CPU), the row passes that do (:mod:`minitfm.speed.compiled`).

Compiled (CPU, where the row passes run their compiled loops): NumPy's generator draws a mask's
numbers one call at a time (its PCG64's ``random_raw``); :func:`pcg64_numbers` computes the same
numbers with a compiled loop, 32 of them side by side, in parts on the worker's threads (each
part from the generator's state jumped ahead to its start): the same masks, some five times
faster (:func:`loops_keep_mask`).
"""

from __future__ import annotations

from minitfm import backend
from minitfm.backend import philox
from minitfm.layers import dropout
from minitfm.speed import compiled, fused, policy, rows


@compiled.kernel
def apply_loop(x, keep, scale, out):
    """``apply`` on rows (n, D) as a compiled loop: out = x * keep * scale (out may be x)."""
    n, d = x.shape
    for r in range(n):
        for c in range(d):
            out[r, c] = x[r, c] * compiled.float32(keep[r, c]) * scale


# ---- fused: one kernel each way ----------------------------------------------------------

@policy.fast_path(dropout.forward)
def choose_forward(x, p, rng=None, inplace=False):
    """The fused kernel on CuPy (--kernels fused), drawing a Philox mask."""
    if rng is None or p == 0.0:
        return None
    return fused_forward if isinstance(rng, philox.Philox) and fused.active(x) else None


@policy.fast_path(dropout.backward)
def choose_backward(dy, cache: dropout.Cache | None):
    """The fused kernel on CuPy (--kernels fused)."""
    return fused_backward if cache is not None and fused.active(dy) else None


def draw(rng: philox.Philox, size: int, p: float) -> tuple:
    """The arguments a kernel needs to draw a keep mask of ``size`` elements at drop probability
    ``p`` from ``rng`` (which moves on past them): ``(threshold, scale, k0, k1, first)``, typed as
    the kernels take them."""
    threshold, scale = philox.dropout_threshold(p)
    k0, k1, first = rng.take(size)
    return (fused.u32(threshold), fused.f32(scale), fused.u32(k0), fused.u32(k1),
            fused.u64(first))


def mask_of(shape, threshold, k0, k1, first):
    """The keep mask that ``draw``'s arguments stand for, drawn with the plain Philox (a twin's)."""
    generator = philox.Philox(int(k0) | int(k1) << 32, int(first), xp=backend.xp)
    return generator.keep(shape, int(threshold))


def kernel_mask(rng: philox.Philox | None, like, p: float) -> tuple:
    """For a kernel that drops elements of ``like`` with probability ``p`` (0: none) as it
    writes them: ``(keep, args, cache)``, the keep mask it fills (without dropout ``like``, a
    placeholder it never reads), :func:`draw`'s arguments (without dropout: keep everything,
    scale 1) and the backward pass's dropout.Cache (None without dropout)."""
    if p <= 0.0:
        return like, (fused.u32(0), fused.f32(1), fused.u32(0), fused.u32(0), fused.u64(0)), None
    keep = backend.xp.empty(like.shape, dtype=bool)
    args = draw(rng, like.size, p)
    return keep, args, dropout.Cache(keep, float(args[1]))


def dropped_twin(x, y, keep, threshold, scale, k0, k1, first):
    """What a kernel's dropout does, plainly (its twin's part): ``keep`` drawn from ``draw``'s
    arguments, y = x * keep * scale (``y`` may be ``x``)."""
    keep[...] = mask_of(x.shape, threshold, k0, k1, first)
    dropout.apply(x, keep, float(scale), out=y)


FORWARD_SOURCE = philox.DEVICE + r"""
extern "C" __global__ void dropout_forward(const float* x, float* y, bool* keep, long long n,
        unsigned int threshold, float scale, unsigned int k0, unsigned int k1,
        unsigned long long first) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;   // Philox block first + t
    long long i = t * 8;
    if (i >= n) return;
    unsigned int u[8];
    philox_draws16(first + t, k0, k1, u);
    for (int j = 0; j < 8 && i + j < n; ++j) {
        bool kept = u[j] >= threshold;
        keep[i + j] = kept;
        y[i + j] = kept ? x[i + j] * scale : 0.0f;
    }
}
"""


def _forward_twin(x, y, keep, n, threshold, scale, k0, k1, first):
    dropped_twin(x, y, keep, threshold, scale, k0, k1, first)


FORWARD = fused.Kernel("dropout_forward", FORWARD_SOURCE, _forward_twin)

BACKWARD_SOURCE = r"""
extern "C" __global__ void dropout_backward(const float* dy, const bool* keep, float* dx,
                                            long long n, float scale) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dx[i] = keep[i] ? dy[i] * scale : 0.0f;
}
"""


def _backward_twin(dy, keep, dx, n, scale):
    dropout.apply(dy, keep, float(scale), out=dx)


BACKWARD = fused.Kernel("dropout_backward", BACKWARD_SOURCE, _backward_twin)


def fused_forward(x, p, rng=None, inplace=False):
    x = backend.xp.ascontiguousarray(x)
    y = x if inplace else backend.xp.empty_like(x)
    keep = backend.xp.empty(x.shape, dtype=bool)
    args = draw(rng, x.size, p)
    FORWARD(fused.grid_for(x.size, philox.KEEP_PER_BLOCK), (x, y, keep, fused.i64(x.size), *args))
    return y, dropout.Cache(keep, float(args[1]))


def fused_backward(dy, cache: dropout.Cache):
    dx = backend.xp.empty_like(dy)
    BACKWARD(fused.grid_for(dy.size), (dy, cache.keep, dx, fused.i64(dy.size),
                                      fused.f32(cache.scale)))
    return dx, {}


# ---- compiled: NumPy's PCG64 numbers on the worker's threads (CPU) ---------------------------

@policy.fast_path(dropout.keep_mask)
def choose_keep_mask(rng, shape, p: float):
    """The mask's numbers by the compiled loop, where the row passes run theirs (--kernels fused,
    Numba)."""
    return loops_keep_mask if rows.compiled() else None


def loops_keep_mask(rng, shape, p: float):
    """``dropout.keep_mask``: the same mask and scale, its random numbers drawn by
    :func:`pcg64_numbers` (a NumPy generator's; another generator draws its own)."""
    return backend.dropout_keep(rng, shape, p, raw=pcg64_numbers)


PCG_LANES = 32              # numbers a step of the loop computes side by side
PCG_PART = 1 << 14          # numbers a thread draws at least
_W = compiled.uint64
_MULT_HI, _MULT_LO = _W(2549297995355413924), _W(4865540595714422341)   # PCG64's multiplier


def pcg64_numbers(bits, n: int):
    """``bits.random_raw(n)`` of a NumPy ``PCG64`` bit generator: the same n 64-bit numbers,
    computed by :func:`pcg64_part` in parts on the worker's threads; ``bits`` then stands where
    random_raw leaves it."""
    xp, state = backend.xp, bits.state["state"]
    words = [_W(v >> 64 if high else v & 0xFFFF_FFFF_FFFF_FFFF)
             for v in (state["state"], state["inc"]) for high in (True, False)]
    out = xp.empty(n, dtype=xp.uint64)
    parts = max(1, min(rows.threads(), n // PCG_PART))
    edges = [n * k // parts for k in range(parts + 1)]

    def part(k):
        lanes = xp.empty((2, PCG_LANES), dtype=xp.uint64)
        pcg64_part(*words, edges[k], out[edges[k]:edges[k + 1]], lanes)
    rows.run(part, list(range(parts)))
    bits.advance(n)
    return out


@compiled.kernel
def pcg64_part(s_hi, s_lo, inc_hi, inc_lo, first, out, lanes):
    """out[i] = PCG64's number first + i from state s and increment inc (each a 128-bit number
    as two 64-bit words): the state stepped first + i + 1 times, s <- M s + inc (mod 2^128),
    then mixed to 64 bits (XSL-RR: its halves' xor, rotated right by its top 6 bits). Column j
    of ``lanes`` (2, PCG_LANES) holds the state of numbers j, j + PCG_LANES, ...: one loop step
    moves each lane PCG_LANES steps at once (s <- A s + C)."""
    one, zero, low, w32 = _W(1), _W(0), _W(0xFFFFFFFF), _W(32)

    def mul(a_hi, a_lo, b_hi, b_lo):            # a b mod 2^128, from 32-bit pieces
        a0, a1, b0, b1 = a_lo & low, a_lo >> w32, b_lo & low, b_lo >> w32
        p00, p01, p10 = a0 * b0, a0 * b1, a1 * b0
        middle = (p00 >> w32) + (p01 & low) + (p10 & low)
        carried = a1 * b1 + (p01 >> w32) + (p10 >> w32) + (middle >> w32)    # a_lo b_lo >> 64
        return carried + a_lo * b_hi + a_hi * b_lo, a_lo * b_lo

    def mul_add(a_hi, a_lo, b_hi, b_lo, c_hi, c_lo):         # a b + c mod 2^128
        p_hi, p_lo = mul(a_hi, a_lo, b_hi, b_lo)
        lo = p_lo + c_lo
        return p_hi + c_hi + (one if lo < p_lo else zero), lo

    def jump(steps):        # (A, C): `steps` steps are s <- A s + C (F. Brown's method)
        a_hi, a_lo, c_hi, c_lo = zero, one, zero, zero
        m_hi, m_lo, i_hi, i_lo = _MULT_HI, _MULT_LO, inc_hi, inc_lo
        while steps > 0:
            if steps & 1:
                a_hi, a_lo = mul(a_hi, a_lo, m_hi, m_lo)
                c_hi, c_lo = mul_add(c_hi, c_lo, m_hi, m_lo, i_hi, i_lo)
            m1_hi, m1_lo = mul_add(m_hi, m_lo, zero, one, zero, one)         # m + 1
            i_hi, i_lo = mul(m1_hi, m1_lo, i_hi, i_lo)
            m_hi, m_lo = mul(m_hi, m_lo, m_hi, m_lo)
            steps >>= 1
        return a_hi, a_lo, c_hi, c_lo

    a_hi, a_lo, c_hi, c_lo = jump(first + 1)
    s_hi, s_lo = mul_add(a_hi, a_lo, s_hi, s_lo, c_hi, c_lo)          # number first's state
    for j in range(PCG_LANES):
        lanes[0, j], lanes[1, j] = s_hi, s_lo
        s_hi, s_lo = mul_add(_MULT_HI, _MULT_LO, s_hi, s_lo, inc_hi, inc_lo)
    a_hi, a_lo, c_hi, c_lo = jump(PCG_LANES)
    n = out.shape[0]
    whole = n - n % PCG_LANES
    for i in range(0, whole, PCG_LANES):
        for j in range(PCG_LANES):          # whole steps: the loop runs in vector registers
            h, lo = lanes[0, j], lanes[1, j]
            x, turn = h ^ lo, h >> _W(58)
            out[i + j] = (x >> turn) | (x << ((_W(64) - turn) & _W(63)))
            lanes[0, j], lanes[1, j] = mul_add(a_hi, a_lo, h, lo, c_hi, c_lo)
    for j in range(n - whole):
        x, turn = lanes[0, j] ^ lanes[1, j], lanes[0, j] >> _W(58)
        out[whole + j] = (x >> turn) | (x << ((_W(64) - turn) & _W(63)))
