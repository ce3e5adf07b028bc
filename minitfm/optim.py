"""Adam (with optional decoupled weight decay) and learning-rate schedules.

Section 5.3 of the paper: "We used the Adam optimizer with beta1 = 0.9, beta2 = 0.98 and
epsilon = 1e-9. We varied the learning rate over the course of training, according to the formula

    lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)        (3)

This corresponds to increasing the learning rate linearly for the first warmup_steps training
steps, and decreasing it thereafter proportionally to the inverse square root of the step number.
We used warmup_steps = 4000."

Adam (Kingma & Ba, Algorithm 1), for each parameter p with gradient g at step t = 1, 2, ...:

    m = beta1 * m + (1 - beta1) * g          first moment
    v = beta2 * v + (1 - beta2) * g^2        second moment
    m_hat = m / (1 - beta1^t)                bias corrections: m and v start at zero
    v_hat = v / (1 - beta2^t)
    p = p - lr * m_hat / (sqrt(v_hat) + eps)

AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization") adds an optional decay of
the weights themselves, decoupled from the gradient (so Adam's normalisation does not rescale it):

    p = p - lr * weight_decay * p            before the Adam step, for the decayed parameters only

Which parameters decay is a predicate on their names (:func:`decays_by_default` unless given).

Language models usually train with a different schedule from the paper's: a linear warm-up to a
peak rate, then a cosine or linear decay to a minimum (:class:`WarmupDecaySchedule`).

Parameters, gradients and the moments ``m``, ``v`` are flat ``dict[str, array]`` with the same
keys. The update works in place: the parameter arrays are never reallocated, so anything holding
a reference to them (the model, a weight-tied view) sees the new values, and float32 parameters
stay float32 (every scalar is a Python float, which does not promote an array's dtype).

Array math goes through ``backend.xp``, so the same code runs on NumPy and on CuPy. The fast
paths of the flat update (one kernel, or blocks of the buffers on the worker's threads) are in
``minitfm/speed/optim.py``. (Clipping and loss scaling, before the update:
:mod:`minitfm.gradscale`.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from minitfm import backend, flat

__all__ = ["Adam", "LRSchedule", "WarmupDecaySchedule", "Cooldown", "run_progress",
           "decays_by_default", "adam_step", "coefficients", "flat_step", "flat_update"]


def _check_same_keys(expected: dict, given: dict, what: str) -> None:
    """Raise a ValueError naming missing and extra keys unless the two dicts have the same keys."""
    if given.keys() == expected.keys():
        return
    missing = sorted(expected.keys() - given.keys())
    extra = sorted(given.keys() - expected.keys())
    raise ValueError(f"{what}: missing {missing}, extra {extra}")


@dataclass(frozen=True)
class LRSchedule:
    """The learning rate of equation (3), scaled by ``factor``; steps count from 1.

    It rises linearly to its peak ``factor * (d_model * warmup)^-0.5`` at ``step == warmup``, then
    decays as ``step^-0.5``. Every schedule here is called as ``schedule(step, time_fraction)``;
    this one does not depend on when the run ends, so it ignores ``time_fraction``.
    """

    d_model: int
    warmup: int = 4000
    factor: float = 1.0

    def __post_init__(self) -> None:
        if self.d_model < 1 or self.warmup < 1 or self.factor <= 0:
            raise ValueError(
                f"learning-rate schedule needs d_model >= 1, warmup >= 1 and factor > 0, got "
                f"d_model={self.d_model}, warmup={self.warmup}, factor={self.factor}")

    def __call__(self, step: int, time_fraction: float = 0.0) -> float:
        if step < 1:
            raise ValueError(f"learning-rate steps count from 1, got step={step}")
        return self.factor * self.d_model ** -0.5 * min(step ** -0.5, step * self.warmup ** -1.5)


@dataclass(frozen=True)
class WarmupDecaySchedule:
    """Linear warm-up to ``peak_lr``, then a cosine or linear decay to ``min_lr``; steps from 1.

        step <= warmup                lr = peak_lr * step / warmup
        warmup < step < total_steps   s = (step - warmup) / (total_steps - warmup)   in (0, 1)
                                      cosine: lr = min_lr + (peak_lr - min_lr) (1 + cos(pi s)) / 2
                                      linear: lr = min_lr + (peak_lr - min_lr) (1 - s)
        step >= total_steps           lr = min_lr

    The rate peaks at ``step == warmup`` (``warmup = 0``: no warm-up, the decay starts at step 1)
    and reaches ``min_lr`` at ``step == total_steps``, usually the last step of training.

    A run that ends on a clock instead (a time limit that comes before ``total_steps``) passes
    ``time_fraction``, the part of its time spent, and the decay follows whichever of the two
    ends first: the steps' progress ``p = step / total_steps`` is replaced by the larger
    ``max(p, time_fraction)`` (so ``s = (p - w) / (1 - w)`` with ``w = warmup / total_steps``)
    and the rate reaches ``min_lr`` when the time runs out. A warm-up step then takes the smaller
    of its own rate and the decayed one, so the rate never jumps.
    """

    peak_lr: float
    warmup: int
    total_steps: int
    min_lr: float = 0.0
    decay: str = "cosine"     # or "linear"

    def __post_init__(self) -> None:
        if self.decay not in ("cosine", "linear"):
            raise ValueError(f"decay must be 'cosine' or 'linear', got {self.decay!r}")
        if not (math.isfinite(self.peak_lr) and self.peak_lr > 0
                and 0 <= self.min_lr <= self.peak_lr):
            raise ValueError(f"learning-rate schedule needs peak_lr > 0 and 0 <= min_lr <= "
                             f"peak_lr, got peak_lr={self.peak_lr}, min_lr={self.min_lr}")
        if not 0 <= self.warmup < self.total_steps:
            raise ValueError(f"learning-rate schedule needs 0 <= warmup < total_steps, got "
                             f"warmup={self.warmup}, total_steps={self.total_steps}")

    def __call__(self, step: int, time_fraction: float = 0.0) -> float:
        if step < 1:
            raise ValueError(f"learning-rate steps count from 1, got step={step}")
        if time_fraction > step / self.total_steps:          # the clock ends the run first
            w = self.warmup / self.total_steps
            decayed = self._decayed(min(1.0, (time_fraction - w) / (1.0 - w)))
            if step <= self.warmup:
                return min(self.peak_lr * (step / self.warmup), decayed)
            return decayed
        if step <= self.warmup:
            return self.peak_lr * (step / self.warmup)     # exactly peak_lr at step == warmup
        if step >= self.total_steps:
            return self.min_lr
        return self._decayed((step - self.warmup) / (self.total_steps - self.warmup))

    def _decayed(self, progress: float) -> float:
        """The rate at ``progress`` in [0, 1] of the decay (0: its start, 1: its end)."""
        progress = max(progress, 0.0)
        if self.decay == "cosine":
            remaining = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            remaining = 1.0 - progress
        return self.min_lr + (self.peak_lr - self.min_lr) * remaining


def run_progress(step: int, total_steps: int, time_fraction: float = 0.0) -> float:
    """The part of a run behind update ``step`` (counted from 1): by the steps done before it, or
    by the clock (``time_fraction`` of a time limit) if that is further on."""
    return max((step - 1) / total_steps, time_fraction)


@dataclass(frozen=True)
class Cooldown:
    """Any schedule, brought down linearly to 0 over the last ``fraction`` of a run.

        p = max((step - 1) / total_steps, time_fraction)        the part of the run behind us
        lr = schedule(step) * min(1, (1 - p) / fraction)

    The paper's schedule never comes down far: at the end of a short run it is still at half its
    peak or more. A cool-down of the last 10-20 % keeps it for most of the run and ends it
    near 0, where the parameters settle into the minimum the noisy updates circled around. As
    for :class:`WarmupDecaySchedule`, a run that ends on a clock passes ``time_fraction``, and it
    is passed on to ``schedule``. ``follow_clock=False`` measures the run by its steps alone
    (p = (step - 1) / total_steps): a cool-down over a number of updates, the same on any machine.
    """

    schedule: Callable[[int, float], float]
    total_steps: int
    fraction: float
    follow_clock: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1 or self.total_steps < 1:
            raise ValueError(f"cool-down needs 0 < fraction <= 1 and total_steps >= 1, got "
                             f"fraction={self.fraction}, total_steps={self.total_steps}")

    def __call__(self, step: int, time_fraction: float = 0.0) -> float:
        progress = run_progress(step, self.total_steps,
                                time_fraction if self.follow_clock else 0.0)
        return self.schedule(step, time_fraction) * min(1.0, max(0.0, (1.0 - progress)
                                                                  / self.fraction))


def decays_by_default(name: str) -> bool:
    """Whether weight decay applies to parameter ``name`` unless told otherwise.

    Decayed: the weight matrices (last name part starting with ``w``: ``w_qkv``, ``w_o``, ``w1``,
    ...) and the embeddings (ending in ``emb``: ``emb``, ``src_emb``, ``tgt_emb``, a learned
    position table named ``pos_emb``). Not decayed: biases (``b_qkv``, ``b1``, ...) and
    LayerNorm's gain ``gamma`` and shift ``beta``.

    Why: decay pulls a weight towards zero, which for a matrix shrinks the scale of a linear map
    the next layer (or LayerNorm) can compensate for; for a bias or a shift, zero is a particular
    offset, and for a gain it is a dead unit, so decaying those only biases the function.
    Embeddings decay as GPT-2 and nanoGPT do: a shared embedding is also the output projection,
    a matrix like the others. A row that gets no gradient still shrinks by (1 - lr * decay) per
    step; pass a different predicate to ``Adam(decay=...)`` to exempt embeddings.
    """
    leaf = name.rsplit(".", 1)[-1]
    return leaf.startswith("w") or leaf.endswith("emb")


class Adam:
    """Adam with the paper's defaults and bias correction, over a flat parameter dict.

    ``Adam(params)`` creates zero moments shaped like ``params``; each ``update(params, grads, lr)``
    advances ``step`` by one and changes ``params`` in place. ``state_dict()`` /
    ``load_state_dict(state)`` save and restore ``{"step": int, "m": dict, "v": dict}``.

    ``weight_decay > 0`` makes it AdamW: each step first multiplies every parameter whose name
    ``decay(name)`` accepts (:func:`decays_by_default`: matrices and embeddings) by
    ``1 - lr * weight_decay``. The decayed names are fixed at construction, in ``decayed``.
    ``weight_decay = 0`` (the default) is plain Adam.
    """

    def __init__(self, params: dict, *, beta1: float = 0.9, beta2: float = 0.98, eps: float = 1e-9,
                 weight_decay: float = 0.0, decay: Callable[[str], bool] = decays_by_default):
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0 and eps > 0.0):
            raise ValueError(f"Adam needs 0 <= beta1, beta2 < 1 and eps > 0, got "
                             f"beta1={beta1}, beta2={beta2}, eps={eps}")
        if not (math.isfinite(weight_decay) and weight_decay >= 0.0):
            raise ValueError(f"weight_decay must be finite and >= 0, got {weight_decay}")
        if not callable(decay):
            raise TypeError(f"decay must be a function of a parameter name, got {decay!r}")
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self.weight_decay = float(weight_decay)
        self.decayed = frozenset(name for name in params if decay(name))
        for name, p in params.items():
            backend.check_array(p, f"parameter {name!r}")
        # the moments share the parameters' layout; in one flat buffer when the parameters are
        self.m = flat.zeros_like(params)
        self.v = flat.zeros_like(params)
        self._decay_mask = None             # 1 where a parameter decays, for flat updates
        self.step = 0

    def _check(self, params: dict, grads: dict) -> None:
        _check_same_keys(self.m, params, "the parameters differ from those Adam was created with")
        _check_same_keys(self.m, grads, "the gradients do not match the parameters one to one")
        for name, p in params.items():
            g = backend.check_array(grads[name], f"gradient {name!r}")
            if g.shape != p.shape or g.dtype != p.dtype or p.shape != self.m[name].shape:
                raise ValueError(
                    f"gradient {name!r} has shape {g.shape} and dtype {g.dtype}, but the parameter "
                    f"has {p.shape} {p.dtype} (optimizer state {self.m[name].shape}): "
                    f"gradients must match their parameters exactly")

    def update(self, params: dict, grads: dict, lr: float, scaler=None) -> None:
        """One Adam(W) step at learning rate ``lr``: ``params`` change in place, ``step`` += 1.

        When parameters and gradients are flat buffers of one layout (:mod:`minitfm.flat`), the
        step is a dozen operations on whole buffers; otherwise it runs array by array. With a
        ``scaler`` (mixed precision, :class:`minitfm.gradscale.LossScaler`), an update whose
        gradients were not finite changes nothing, decided on the device, and the bias
        corrections count the updates applied (``step`` counts them all).
        """
        self._check(params, grads)
        self.step += 1
        decay = float(lr) * self.weight_decay             # AdamW: p -= lr * weight_decay * p
        state = None if scaler is None else scaler.state
        buffers = flat.buffer_of(params, grads, self.m, self.v)
        if buffers is not None:
            decays = self._flat_decay_mask(params) if decay and self.decayed else None
            flat_update(*buffers, decays, self, lr, decay, state)
            return
        b1, b2, step_size, v_scale, keep = coefficients(self.beta1, self.beta2, self.step, lr,
                                                        1.0 - decay, state)
        for name, p in params.items():
            if decay and name in self.decayed:
                p *= keep
            adam_step(p, grads[name], self.m[name], self.v[name], b1, b2, self.eps, step_size,
                      v_scale)

    def _flat_decay_mask(self, params: dict):
        """A flat bool buffer, True at the decayed parameters' positions."""
        if self._decay_mask is None:
            mask = flat.zeros_like(params)
            for name in self.decayed:
                mask[name] = 1.0
            self._decay_mask = mask.buffer != 0
        return self._decay_mask

    def state_dict(self) -> dict:
        """``{"step": int, "m": {name: array}, "v": {name: array}}``; live arrays, not copies."""
        return {"step": self.step, "m": self.m, "v": self.v}

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict()`` (host or device arrays), copying into the existing moments."""
        _check_same_keys({"step": 0, "m": 0, "v": 0}, state, "not an Adam state_dict()")
        for moment, arrays in (("m", self.m), ("v", self.v)):
            _check_same_keys(arrays, state[moment],
                             f"optimizer state {moment!r} belongs to a different set of parameters")
            for name, target in arrays.items():
                source = state[moment][name]
                if tuple(source.shape) != target.shape:
                    raise ValueError(
                        f"optimizer state {moment}[{name!r}] has shape {tuple(source.shape)}, but "
                        f"the parameter has {target.shape}: the state belongs to a different model")
                target[...] = backend.to_device(source, dtype=target.dtype)
        self.step = int(state["step"])


def coefficients(beta1: float, beta2: float, step: int, lr: float, keep: float, state=None):
    """``(b1, b2, step_size, v_scale, keep)`` of update ``step``, with
    lr * m_hat / (sqrt(v_hat) + eps) == step_size * m / (sqrt(v) * v_scale + eps): host numbers,
    or with a loss scaler's ``state`` 0-d arrays on the device that make a skipped update
    (``state[3]``) a no-op (b = 1, step_size = 0, keep = 1) and count the updates applied,
    ``t = step - state[2]``."""
    if state is None:
        return (beta1, beta2, float(lr) / (1.0 - beta1 ** step),
                1.0 / math.sqrt(1.0 - beta2 ** step), keep)
    xp, skip = backend.xp, state[3] != 0
    t = xp.maximum(step - state[2], 1.0)          # the updates applied, this one included
    return tuple(a.astype(state.dtype) for a in (
        xp.where(skip, 1.0, beta1), xp.where(skip, 1.0, beta2),
        xp.where(skip, 0.0, float(lr) / (1.0 - beta1 ** t)), 1.0 / xp.sqrt(1.0 - beta2 ** t),
        xp.where(skip, 1.0, keep)))


def adam_step(p, g, m, v, b1, b2, eps: float, step_size, v_scale) -> None:
    """The Adam step of one array (or of one flat buffer), in place."""
    xp = backend.xp
    buf = xp.multiply(g, 1.0 - b1)          # the only scratch array
    m *= b1
    m += buf                                # m = b1 m + (1 - b1) g
    xp.multiply(g, g, out=buf)
    buf *= 1.0 - b2
    v *= b2
    v += buf                                # v = b2 v + (1 - b2) g^2
    xp.sqrt(v, out=buf)
    buf *= v_scale
    buf += eps                              # sqrt(v_hat) + eps
    xp.divide(m, buf, out=buf)
    buf *= step_size
    p -= buf                                # p -= lr m_hat / (sqrt(v_hat) + eps)


def flat_step(p, g, m, v, decays, keep, b1, b2, eps: float, step_size, v_scale) -> None:
    """The update of flat buffers, in place: AdamW's decay, ``p *= keep`` where ``decays``
    (a bool buffer; None: no decay), then :func:`adam_step`."""
    if decays is not None:      # 1 - lr * decay where a parameter decays, 1 elsewhere
        p *= backend.xp.where(decays, keep, 1.0).astype(p.dtype)
    adam_step(p, g, m, v, b1, b2, eps, step_size, v_scale)


def flat_update(p, g, m, v, decays, adam: Adam, lr: float, decay: float, state=None) -> None:
    """Update ``adam.step`` of ``adam`` over flat buffers, in place: :func:`flat_step` with the
    step's :func:`coefficients` (``decay``: lr * weight_decay; ``state``: a loss scaler's)."""
    b1, b2, step_size, v_scale, keep = coefficients(adam.beta1, adam.beta2, adam.step, lr,
                                                    1.0 - decay, state)
    flat_step(p, g, m, v, decays, keep, b1, b2, adam.eps, step_size, v_scale)
