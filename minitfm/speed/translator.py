"""The fast path of the translator's step on the CPU (``minitfm/models/translator.py``), chosen
per call by :mod:`minitfm.speed.policy`: a batch of sentences in two shards of whole sentences,
side by side on the worker's threads (:mod:`minitfm.speed.shards`: the machinery, the rounding,
dropout).

The shards are the batch's rows as they come (the sentences of a batch have near-equal
lengths), each shard with the batch's width; a batch one of whose shards would have no target
token runs whole.
"""

from __future__ import annotations

from minitfm.models import translator
from minitfm.speed import policy, shards

__all__ = ["sharded_loss_and_grads"]


@policy.fast_path(translator.loss_and_grads)
def choose_loss_and_grads(params, cfg, src, tgt, rng=None, *, grads=True, normalizer=None,
                          out=None, loss_scale=None):
    """Shards of the batch on the worker's threads: on NumPy, float32 parameters, the row passes
    chosen (--kernels fused), and a batch of two shards' work or more."""
    if not shards.chosen(params, tgt, cfg.d_model):
        return None
    return sharded_loss_and_grads


def sharded_loss_and_grads(params, cfg, src, tgt, rng=None, *, grads=True, normalizer=None,
                           out=None, loss_scale=None):
    """``translator.loss_and_grads`` over the batch's shards, side by side on the worker's
    threads; the same results up to float32 rounding (:mod:`minitfm.speed.shards`)."""
    plain = policy.plain_function(translator.loss_and_grads)
    translator.check_params(params, cfg)
    src, tgt, targets = translator.check_batch(cfg, src, tgt)
    parts = shards.shards(*tgt.shape, cfg.d_model)
    if not all((tgt[part, 1:] != cfg.pad_id).any() for part in parts):
        return plain(params, cfg, src, tgt, rng, grads=grads, normalizer=normalizer, out=out,
                     loss_scale=loss_scale)
    norm = float(normalizer) if normalizer is not None else float(targets.size)
    stats, grads_out = shards.run(plain, params, cfg, src, tgt, parts, rng, grads=grads,
                                  normalizer=norm, out=out, loss_scale=loss_scale)
    return ({"loss": shards.added(stats, "loss"), "nll": shards.added(stats, "nll"),
             "tokens": int(targets.size)}, grads_out)
