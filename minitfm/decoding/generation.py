"""Text generation with the language model: feed a prompt, then draw one token at a time.

The model runs one position at a time over its key/value cache (``models.lm.step``); each next
token is drawn from its distribution with :mod:`minitfm.decoding.sampling` (temperature, top-k, top-p)
from a generator seeded once, so the same seed gives the same text. When a sequence fills the
context (``cfg.max_len``), the cache is rebuilt from its last ``max_len // 2`` tokens and
generation goes on from there.
"""

from __future__ import annotations

from collections.abc import Iterator

from minitfm import backend
from minitfm.decoding import sampling
from minitfm.models import lm
from minitfm.models.base import check_tokens


def generate(params, cfg: lm.LMConfig, prompt, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int = 0,
             greedy: bool = False) -> Iterator:
    """An iterator over ``max_new_tokens`` next tokens, one (R,) int64 host (NumPy) array per
    step, each yielded as soon as it is drawn: the one wait for the device per token, which also
    brings back whether the logits were finite (:func:`minitfm.decoding.sampling.draw_next`). The
    arguments are checked at the call, on the host, before any work.

    prompt: (R, P) or (P,) token ids, P >= 1 (one row per sequence; a 1-D prompt is one row).
    Each token is drawn from the model's distribution after temperature, top-k and top-p
    (:func:`minitfm.decoding.sampling.sample`) with a generator seeded once by ``seed``, or is the most
    likely one with ``greedy``.
    """
    prompt = backend.to_host(prompt)                # checked on the host
    if prompt.ndim == 1:
        prompt = prompt[None]
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    context = check_tokens(prompt[:, -cfg.max_len:], "prompt", cfg.vocab, cfg, host=True)
    context = backend.to_device(context, dtype="int64")                          # (R, <= L)
    if not greedy:                                  # bad settings fail before any work
        sampling.check_settings(cfg.vocab, temperature=temperature, top_k=top_k, top_p=top_p)
    lm.check_params(params, cfg)
    return _tokens(params, cfg, context, max_new_tokens, backend.rng(seed), greedy,
                   dict(temperature=temperature, top_k=top_k, top_p=top_p))


def _tokens(params, cfg: lm.LMConfig, context, max_new_tokens: int, generator, greedy: bool,
            settings: dict) -> Iterator:
    """The generator behind :func:`generate`, once its arguments are checked."""
    xp = backend.xp
    keep = max(1, cfg.max_len // 2)                 # tokens kept when the context is full
    cache = lm.init_cache(cfg, context.shape[0], params["emb"].dtype)
    filled = 0                                      # positions whose keys and values are cached
    for _ in range(max_new_tokens):
        for t in range(filled, context.shape[1]):
            z = lm.step(params, cfg, cache, context[:, t], t)              # (R, V)
        filled = context.shape[1]
        token, finite = sampling.draw_next(z, generator, greedy=greedy, **settings)
        host_token, finite = backend.to_host_together(token, finite)
        if not finite:
            raise sampling.NonFiniteLogits("the model's logits")
        yield host_token
        context = xp.concatenate([context, token[:, None]], axis=1)
        if context.shape[1] > cfg.max_len:         # full: start again from the recent tokens
            context, filled = context[:, -keep:], 0
