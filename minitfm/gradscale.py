"""The gradients between the backward pass and the update: norm clipping, the finite check and
(mixed precision) the loss scale.

Clipping (Pascanu et al., 2013): when the global L2 norm of all gradients exceeds ``max_norm``,
scale them all down so that it equals ``max_norm``; a non-finite norm leaves them as they are,
for the caller to see.

Dynamic loss scaling (mixed precision, minitfm.speed.mixed), as PyTorch's ``GradScaler`` does it:
the loss gradient is multiplied by a scale S, so that the small gradients of the backward pass
survive float16 (whose smallest number is 6e-8), and the gradients are divided by S before
clipping and the update. S starts at 2^16; an update whose gradients are not all finite (S was
too large: something overflowed) is skipped and S halved; after 2,000 finite updates in a row S
is doubled, to find the largest S that fits. Nothing here waits for the device: S, the count of
finite updates and of skipped ones, and whether the latest update was skipped live in one small
array on the device (:class:`LossScaler`), the skip is a masked no-op of Adam (``optim``), and
the host reads them with the loss at a log line and at checkpoints.

Fused (``--kernels fused``, on CuPy, a flat gradient buffer): clipping is three kernels, partial
sums of squares over a fixed number of blocks (the same sums in the same order on every run),
the norm and the scale in one block, the scaling; the loss scaler two or three (the division by
S with the partial sums, the decision in one block, the clipping). Their twins are the plain
lines of ``clip_grad_norm`` and ``LossScaler.unscale``.
"""

from __future__ import annotations

import math

from minitfm import backend, flat
from minitfm.speed import fused

__all__ = ["clip_grad_norm", "clip_factor", "LossScaler", "decide", "INITIAL_SCALE",
           "GROWTH_INTERVAL"]

INITIAL_SCALE = 2.0 ** 16
GROWTH_INTERVAL = 2000          # finite updates in a row before the scale doubles
FLOAT32_MAX = 3.4028234663852886e38


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
        g, parts = arrays[0], fused.i32(min(PARTS, fused.grid_for(arrays[0].size)[0]))
        partial, norm_scale = xp.empty(int(parts), dtype=g.dtype), xp.empty(2, dtype=g.dtype)
        SQUARES((int(parts),), (g, partial, fused.i64(g.size)))
        CLIP((1,), (partial, parts, norm_scale, fused.f32(max_norm)))
        SCALE(fused.grid_for(g.size), (g, norm_scale, fused.i64(g.size)))
        return norm_scale[0]
    total = xp.asarray(sum(xp.vdot(g, g) for g in arrays))              # 0-d, on the device
    xp.sqrt(total, out=total)
    scale = clip_factor(total, max_norm).astype(arrays[0].dtype)
    for g in arrays:
        g *= scale
    return total


def clip_factor(total, max_norm: float):
    """min(1, ``max_norm`` / ``total``), and 1 where the norm ``total`` (0-d) is not finite."""
    xp = backend.xp
    return xp.where(xp.isfinite(total),
                    xp.minimum(float(max_norm) / xp.maximum(total, 1e-30), 1.0), 1.0)


class LossScaler:
    """The loss scale and its record, on the device: ``state`` (4,) float32 = (scale S, finite
    updates since S last changed, updates skipped so far, 1 if the latest update was skipped).

    Per update: pass ``scale`` (0-d) as the models' ``loss_scale``; :meth:`unscale` the summed
    gradients (and clip them); pass the scaler to ``Adam.update``. :meth:`state_dict` and
    :meth:`load_state_dict` carry it in checkpoints (host numbers, exact)."""

    def __init__(self, scale: float = INITIAL_SCALE, growth_interval: int = GROWTH_INTERVAL):
        if not (math.isfinite(scale) and 0 < scale <= FLOAT32_MAX):
            raise ValueError(f"the loss scale must be a positive float32 number, got {scale}")
        if growth_interval < 1:
            raise ValueError(f"growth_interval must be >= 1, got {growth_interval}")
        self.growth_interval = int(growth_interval)
        self.state = backend.to_device([scale, 0, 0, 0], dtype="float32")

    @property
    def scale(self):
        return self.state[0]

    def unscale(self, grads: dict, max_norm: float | None = None):
        """g /= S, then clip to ``max_norm`` (None: no clipping), decide whether the update is
        skipped (a gradient is not finite: it is zeroed, the update will change nothing) and
        update S; all on the device. Returns the norm of the unscaled gradients (0-d)."""
        xp = backend.xp
        buffers = flat.buffer_of(grads)
        if buffers is None:
            raise TypeError("the loss scaler works on a flat gradient buffer (minitfm.flat)")
        g = buffers[0]
        if fused.active(g):
            parts = fused.i32(min(PARTS, fused.grid_for(g.size)[0]))
            partial, norm_clip = xp.empty(int(parts), dtype=g.dtype), xp.empty(2, dtype=g.dtype)
            UNSCALE((int(parts),), (g, self.state, partial, fused.i64(g.size)))
            DECIDE((1,), (partial, parts, self.state, norm_clip, fused.f32(max_norm or 0),
                          fused.i32(self.growth_interval)))
            if max_norm:
                SCALE(fused.grid_for(g.size), (g, norm_clip, fused.i64(g.size)))
            return norm_clip[0]
        g *= 1.0 / self.state[0]
        total = xp.sqrt(xp.vdot(g, g))
        xp.nan_to_num(g, copy=False, posinf=0.0, neginf=0.0)      # a skipped update reads zeros
        clip = decide(self.state, total, max_norm, self.growth_interval)
        if max_norm:
            g *= clip
        return total

    def state_dict(self) -> dict:
        """The record as host numbers (a copy from the device: at checkpoints only)."""
        scale, good, skipped, last = (float(x) for x in backend.to_host(self.state))
        return {"scale": scale, "good_steps": int(good), "skipped": int(skipped),
                "last_skipped": bool(last), "growth_interval": self.growth_interval}

    def load_state_dict(self, record: dict) -> None:
        self.growth_interval = int(record["growth_interval"])
        self.state[...] = backend.to_device(
            [record["scale"], record["good_steps"], record["skipped"], record["last_skipped"]],
            dtype="float32")


def decide(state, total, max_norm: float | None, growth_interval: int):
    """GradScaler's rule on a scaler's ``state`` given the norm ``total`` (0-d) of the unscaled
    gradients, on the device: S halved and the update marked skipped if ``total`` is not finite,
    else S doubled after ``growth_interval`` finite updates. Returns the clipping factor (None
    without ``max_norm``)."""
    xp = backend.xp
    finite = xp.isfinite(total)
    clip = clip_factor(total, max_norm).astype(state.dtype) if max_norm else None
    scale, good, skipped = state[0], state[1], state[2]
    good = xp.where(finite, good + 1, 0)
    grow = good >= growth_interval
    state[...] = xp.stack([
        xp.where(finite, xp.where(grow, scale * 2.0, scale), scale * 0.5),
        xp.where(grow, 0, good), skipped + ~finite, ~finite]).astype(state.dtype)
    return clip


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
    norm_scale[0], norm_scale[1] = total, clip_factor(total, max_norm)


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
    clip = decide(state, total, float(max_norm) or None, int(interval))
    norm_clip[0], norm_clip[1] = total, 1.0 if clip is None else clip     # the kernel's 1 too


UNSCALE = fused.Kernel("unscale_squares", SCALER_SOURCE, _unscale_twin, sums=("partial",))
DECIDE = fused.Kernel("scaler_decide", SCALER_SOURCE, _decide_twin)
