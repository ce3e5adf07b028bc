"""The fast paths of gradient clipping and the loss scaler (``minitfm/gradscale.py``), chosen per
call by :mod:`minitfm.speed.policy`; the plain functions are their twins.

Fused (``--kernels fused``, on CuPy, a flat gradient buffer): clipping is three kernels, partial
sums of squares over a fixed number of blocks (the same sums in the same order on every run), the
norm and the scale in one block, the scaling; the loss scaler two or three (the division by S with
the partial sums, the decision in one block, the clipping). Their twins are the plain lines of
``gradscale.clip_arrays`` and ``gradscale.unscale_buffer``.
"""

from __future__ import annotations

from minitfm import backend, gradscale
from minitfm.speed import fused, policy


@policy.fast_path(gradscale.clip_arrays)
def choose_clip_arrays(arrays: list, max_norm: float):
    """Three fused kernels on CuPy over a flat buffer (--kernels fused)."""
    return fused_clip if len(arrays) == 1 and fused.active(arrays[0]) else None


@policy.fast_path(gradscale.unscale_buffer)
def choose_unscale_buffer(g, state, max_norm: float | None, growth_interval: int):
    """Two or three fused kernels on CuPy (--kernels fused, --precision fp16)."""
    return fused_unscale if fused.active(g) else None


def fused_clip(arrays: list, max_norm: float):
    """``gradscale.clip_arrays`` of one flat buffer, three kernels."""
    xp, g = backend.xp, arrays[0]
    parts = fused.i32(min(PARTS, fused.grid_for(g.size)[0]))
    partial, norm_scale = xp.empty(int(parts), dtype=g.dtype), xp.empty(2, dtype=g.dtype)
    SQUARES((int(parts),), (g, partial, fused.i64(g.size)))
    CLIP((1,), (partial, parts, norm_scale, fused.f32(max_norm)))
    SCALE(fused.grid_for(g.size), (g, norm_scale, fused.i64(g.size)))
    return norm_scale[0]


def fused_unscale(g, state, max_norm: float | None, growth_interval: int):
    """``gradscale.unscale_buffer``, two kernels (three with clipping)."""
    xp = backend.xp
    parts = fused.i32(min(PARTS, fused.grid_for(g.size)[0]))
    partial, norm_clip = xp.empty(int(parts), dtype=g.dtype), xp.empty(2, dtype=g.dtype)
    UNSCALE((int(parts),), (g, state, partial, fused.i64(g.size)))
    DECIDE((1,), (partial, parts, state, norm_clip, fused.f32(max_norm or 0),
                  fused.i32(growth_interval)))
    if max_norm:
        SCALE(fused.grid_for(g.size), (g, norm_clip, fused.i64(g.size)))
    return norm_clip[0]


PARTS = 1024        # the partial sums of the fused norm: a fixed number, a fixed order of sums
CLIP_SOURCE = fused.BLOCK_REDUCE + r"""
extern "C" __global__ void sum_squares(const float* g, float* partial, long long n) {
    __shared__ float scratch[32];
    float s = 0.0f;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) s += g[i] * g[i];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
// norm_scale = (norm, min(1, max_norm / norm)), the scale 1 where the norm is not finite
extern "C" __global__ void clip_scale(const float* partial, int parts, float* norm_scale,
                                      float max_norm) {
    __shared__ float scratch[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) s += partial[i];
    float norm = sqrtf(block_sum(s, scratch));
    if (threadIdx.x == 0) {
        norm_scale[0] = norm;
        norm_scale[1] = isfinite(norm) ? fminf(max_norm / fmaxf(norm, 1e-30f), 1.0f) : 1.0f;
    }
}
extern "C" __global__ void scale_by(float* g, const float* norm_scale, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] *= norm_scale[1];
}
"""


def _squares_twin(g, partial, n):
    partial[...] = 0.0
    partial[0] = backend.xp.vdot(g, g)


def _clip_twin(partial, parts, norm_scale, max_norm):
    xp = backend.xp
    total = xp.sqrt(partial.sum())
    norm_scale[0], norm_scale[1] = total, gradscale.clip_factor(total, max_norm)


SQUARES = fused.Kernel("sum_squares", CLIP_SOURCE, _squares_twin, sums=("partial",))
CLIP = fused.Kernel("clip_scale", CLIP_SOURCE, _clip_twin)
SCALE = fused.Kernel("scale_by", CLIP_SOURCE, lambda g, norm_scale, n: g.__imul__(norm_scale[1]))


SCALER_SOURCE = fused.BLOCK_REDUCE + r"""
// g /= S, partial sums of squares of the result, a non-finite element zeroed (after it is summed)
extern "C" __global__ void unscale_squares(float* g, const float* state, float* partial,
                                           long long n) {
    __shared__ float scratch[32];
    float inv = 1.0f / state[0], s = 0.0f;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = g[i] * inv;
        s += v * v;
        g[i] = isfinite(v) ? v : 0.0f;
    }
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
// the norm and the clipping factor into norm_clip; S and its record updated (GradScaler's rule)
extern "C" __global__ void scaler_decide(const float* partial, int parts, float* state,
                                         float* norm_clip, float max_norm, int interval) {
    __shared__ float scratch[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) s += partial[i];
    float norm = sqrtf(block_sum(s, scratch));
    if (threadIdx.x != 0) return;
    bool finite = isfinite(norm);
    float good = finite ? state[1] + 1.0f : 0.0f;
    bool grow = good >= interval;
    norm_clip[0] = norm;
    norm_clip[1] = finite && max_norm > 0.0f ? fminf(max_norm / fmaxf(norm, 1e-30f), 1.0f) : 1.0f;
    state[0] = finite ? (grow ? state[0] * 2.0f : state[0]) : state[0] * 0.5f;
    state[1] = grow ? 0.0f : good;
    state[2] = state[2] + (finite ? 0.0f : 1.0f);
    state[3] = finite ? 0.0f : 1.0f;
}
"""


def _unscale_twin(g, state, partial, n):
    g *= 1.0 / state[0]
    partial[...] = 0.0
    partial[0] = backend.xp.vdot(g, g)
    backend.xp.nan_to_num(g, copy=False, posinf=0.0, neginf=0.0)


def _decide_twin(partial, parts, state, norm_clip, max_norm, interval):
    total = backend.xp.sqrt(partial.sum())
    clip = gradscale.decide(state, total, float(max_norm) or None, int(interval))
    norm_clip[0], norm_clip[1] = total, 1.0 if clip is None else clip     # the kernel's 1 too


UNSCALE = fused.Kernel("unscale_squares", SCALER_SOURCE, _unscale_twin, sums=("partial",))
DECIDE = fused.Kernel("scaler_decide", SCALER_SOURCE, _decide_twin)
