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

The fused kernels of both (``--kernels fused``, on CuPy) are in ``minitfm/speed/gradscale.py``.
"""

from __future__ import annotations

import math

from minitfm import backend, flat

__all__ = ["clip_grad_norm", "clip_arrays", "clip_factor", "LossScaler", "unscale_buffer",
           "decide", "INITIAL_SCALE", "GROWTH_INTERVAL"]

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
    return clip_arrays(arrays, max_norm)


def clip_arrays(arrays: list, max_norm: float):
    """:func:`clip_grad_norm` over the 1-D views ``arrays`` (one: a flat buffer), in place."""
    xp = backend.xp
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
        buffers = flat.buffer_of(grads)
        if buffers is None:
            raise TypeError("the loss scaler works on a flat gradient buffer (minitfm.flat)")
        return unscale_buffer(buffers[0], self.state, max_norm, self.growth_interval)

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


def unscale_buffer(g, state, max_norm: float | None, growth_interval: int):
    """:meth:`LossScaler.unscale` of the flat gradient buffer g with the scaler's ``state``."""
    xp = backend.xp
    g *= 1.0 / state[0]
    total = xp.sqrt(xp.vdot(g, g))
    xp.nan_to_num(g, copy=False, posinf=0.0, neginf=0.0)      # a skipped update reads zeros
    clip = decide(state, total, max_norm, growth_interval)
    if max_norm:
        g *= clip
    return total


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
