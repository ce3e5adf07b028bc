"""The gradients between the backward pass and the update: norm clipping, the finite check and
(mixed precision) the loss scale.

Clipping (Pascanu et al., 2013): when the global L2 norm of all gradients exceeds ``max_norm``,
scale them all down so that it equals ``max_norm``; a non-finite norm leaves them as they are,
for the caller to see.

Fused (``--kernels fused``, on CuPy, a flat gradient buffer): three kernels, partial sums of
squares over a fixed number of blocks (the same sums in the same order on every run), the norm
and the scale in one block, the scaling; their twins are the plain lines of ``clip_grad_norm``.
"""

from __future__ import annotations

import numpy

from minitfm import backend, flat, fused

__all__ = ["clip_grad_norm"]


def clip_grad_norm(grads: dict, max_norm: float):
    """Scale all gradients in place so their global L2 norm is at most ``max_norm``.

        norm  = sqrt(sum of g^2 over every gradient)
        g    *= min(1, max_norm / norm)          (not at all when norm is NaN or Inf)

    Returns the norm before clipping as a 0-d array of the backend: the clipping itself never
    waits for the device, and the caller reads the number (``float(norm)``) only when it needs it.
    A non-finite norm (an overflow or NaN somewhere) leaves the gradients untouched, so the
    caller can see it and skip the step. Flat gradients (:mod:`minitfm.flat`) take two passes
    (three kernels fused).
    """
    if not max_norm > 0:
        raise ValueError(f"max_norm must be positive, got {max_norm}")
    xp = backend.xp
    buffers = flat.buffer_of(grads)
    arrays = [buffers[0]] if buffers is not None else [g.ravel() for g in grads.values()]
    if not arrays:
        return xp.zeros((), dtype=backend.float_dtype())
    if len(arrays) == 1 and fused.active(arrays[0]):
        g, parts = arrays[0], numpy.int32(min(PARTS, fused.grid_for(arrays[0].size)[0]))
        partial, norm_scale = xp.empty(int(parts), dtype=g.dtype), xp.empty(2, dtype=g.dtype)
        SQUARES((int(parts),), (g, partial, numpy.int64(g.size)))
        CLIP((1,), (partial, parts, norm_scale, numpy.float32(max_norm)))
        SCALE(fused.grid_for(g.size), (g, norm_scale, numpy.int64(g.size)))
        return norm_scale[0]
    total = xp.asarray(sum(xp.vdot(g, g) for g in arrays))              # 0-d, on the device
    xp.sqrt(total, out=total)
    scale = xp.minimum(float(max_norm) / xp.maximum(total, 1e-30), 1.0)
    scale = xp.where(xp.isfinite(total), scale, 1.0).astype(arrays[0].dtype)
    for g in arrays:
        g *= scale
    return total


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
    scale = xp.minimum(float(max_norm) / xp.maximum(total, 1e-30), 1.0)
    norm_scale[0], norm_scale[1] = total, xp.where(xp.isfinite(total), scale, 1.0)


SQUARES = fused.Kernel("sum_squares", CLIP_SOURCE, _squares_twin)
CLIP = fused.Kernel("clip_scale", CLIP_SOURCE, _clip_twin)
SCALE = fused.Kernel("scale_by", CLIP_SOURCE, lambda g, norm_scale, n: g.__imul__(norm_scale[1]))
