"""The fast path of the language model's step on the CPU (``minitfm/models/lm.py``), chosen per
call by :mod:`minitfm.speed.policy`: a batch of blocks in two shards of whole blocks, side by side
on the worker's threads (:mod:`minitfm.speed.shards`: the machinery, the rounding, dropout).

``train_lm.py``'s defaults (22 blocks of 48 tokens, d_model 128) make two shards of 11 blocks:
on two threads the step takes 0.8 of the whole batch's time (docs/speed.md, "A batch in two
shards").
"""

from __future__ import annotations

from minitfm.models import lm
from minitfm.speed import policy, shards

__all__ = ["sharded_loss_and_grads"]


@policy.fast_path(lm.loss_and_grads)
def choose_loss_and_grads(params, cfg, x, y, rng=None, *, grads=True, normalizer=None, out=None,
                          loss_scale=None):
    """Shards of the batch on the worker's threads: on NumPy, float32 parameters, the row passes
    chosen (--kernels fused), and a batch of two shards' work or more."""
    if not shards.chosen(params, x, cfg.d_model):
        return None
    return sharded_loss_and_grads


def sharded_loss_and_grads(params, cfg, x, y, rng=None, *, grads=True, normalizer=None, out=None,
                           loss_scale=None):
    """``lm.loss_and_grads`` over the batch's shards, side by side on the worker's threads; the
    same results up to float32 rounding (:mod:`minitfm.speed.shards`)."""
    plain = policy.plain_function(lm.loss_and_grads)
    lm.check_params(params, cfg)
    x, y = lm.check_blocks(cfg, x, y)
    parts = shards.shards(*x.shape, cfg.d_model)
    norm = float(normalizer) if normalizer is not None else float(x.size)
    stats, grads_out = shards.run(plain, params, cfg, x, y, parts, rng, grads=grads,
                                  normalizer=norm, out=out, loss_scale=loss_scale)
    loss = shards.added(stats, "loss")          # the language model's nll is its loss
    return {"loss": loss, "nll": loss, "tokens": int(x.size)}, grads_out
