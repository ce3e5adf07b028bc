"""Inverted dropout (paper, section 5.4: P_drop on every sub-layer output and on the embedding sums).

Forward (training, drop probability p, keep mask m_i ~ Bernoulli(1 - p))
    y = x * m / (1 - p)
so that E[y] = x and nothing needs rescaling at test time (p = 0, or no generator: y = x).
(p is rounded to a multiple of 2^-16 when the mask is drawn; see backend.dropout_keep.)

Backward
    dL/dx = dL/dy * m / (1 - p)      the same mask, the same scale

The mask comes from the generator passed in; the trainer passes ``backend.rng(seed, step, i)``
for the i-th batch of a step, so the masks are reproducible from those numbers alone: on NumPy
a ``numpy.random.Generator`` that draws 16-bit integers as raw bytes, on CuPy the counter-based
Philox stream (``minitfm.philox``), computed with array operations and creating no generator on
the device. The two backends draw different masks. No parameters.

Fused (``--kernels fused``, on CuPy): the mask is drawn and applied in one kernel, which computes
the Philox stream itself (``philox.DEVICE``: one thread per block of the stream, 8 elements) and
draws exactly what ``Philox.keep`` draws; the backward pass is one kernel too. Their twins, below
each, are the plain code above. ``draw`` and ``mask_of`` serve the kernels that fuse a dropout
with their own work (residual, feed-forward); ``apply_rows``, a compiled loop (CPU), the row
passes that do (minitfm.compiled).
"""

from __future__ import annotations

from typing import NamedTuple

from minitfm import backend, compiled, fused, philox


class Cache(NamedTuple):
    keep: object            # bool, the shape of x: the kept elements
    scale: float            # 1 / (1 - p)


def forward(x, p, rng=None, inplace=False):
    """Return ``(y, cache)``; identity (cache None) when ``p == 0`` or ``rng`` is None (evaluation).

    ``inplace=True`` writes y over x (for callers that own x and no longer need it).
    """
    if rng is None or p == 0.0:
        return x, None
    if fused.active(x) and isinstance(rng, philox.Philox):
        return _fused_forward(x, p, rng, inplace)
    keep, scale = backend.dropout_keep(rng, x.shape, p)      # bool, same shape as x
    return apply(x, keep, scale, out=x if inplace else None), Cache(keep, scale)


def backward(dy, cache: Cache | None):
    """Return ``(dx, {})``."""
    if cache is None:
        return dy, {}
    if fused.active(dy):
        dx = backend.xp.empty_like(dy)
        BACKWARD(fused.grid_for(dy.size), (dy, cache.keep, dx, fused.i64(dy.size),
                                          fused.f32(cache.scale)))
        return dx, {}
    return apply(dy, cache.keep, cache.scale), {}


def apply(x, keep, scale, out=None):
    """``x * keep * scale``, both ways of the pass (into ``out`` when given, which may be x);
    the row passes that fuse a dropout with their own work call it on their blocks."""
    y = backend.xp.multiply(x, keep, out=out)
    y *= scale
    return y


@compiled.kernel
def apply_rows(x, keep, scale, out):
    """``apply`` on rows (n, D) as a compiled loop: out = x * keep * scale (out may be x)."""
    n, d = x.shape
    for r in range(n):
        for c in range(d):
            out[r, c] = x[r, c] * compiled.float32(keep[r, c]) * scale


# ---- fused: one kernel each way ----------------------------------------------------------

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
    scale 1) and the backward pass's Cache (None without dropout)."""
    if p <= 0.0:
        return like, (fused.u32(0), fused.f32(1), fused.u32(0), fused.u32(0), fused.u64(0)), None
    keep = backend.xp.empty(like.shape, dtype=bool)
    args = draw(rng, like.size, p)
    return keep, args, Cache(keep, float(args[1]))


def dropped_twin(x, y, keep, threshold, scale, k0, k1, first):
    """What a kernel's dropout does, plainly (its twin's part): ``keep`` drawn from ``draw``'s
    arguments, y = x * keep * scale (``y`` may be ``x``)."""
    keep[...] = mask_of(x.shape, threshold, k0, k1, first)
    apply(x, keep, float(scale), out=y)


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
    apply(dy, keep, float(scale), out=dx)


BACKWARD = fused.Kernel("dropout_backward", BACKWARD_SOURCE, _backward_twin)


def _fused_forward(x, p, rng, inplace):
    x = backend.xp.ascontiguousarray(x)
    y = x if inplace else backend.xp.empty_like(x)
    keep = backend.xp.empty(x.shape, dtype=bool)
    args = draw(rng, x.size, p)
    FORWARD(fused.grid_for(x.size, philox.KEEP_PER_BLOCK), (x, y, keep, fused.i64(x.size), *args))
    return y, Cache(keep, float(args[1]))
