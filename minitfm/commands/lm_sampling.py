"""Sampling from a trained language model, streamed as it is drawn: ``train_lm.py --sample``
(from a checkpoint) and the samples ``train_lm.py`` prints after training. The tokenizer comes
from the checkpoint (every checkpoint of a language model stores it).
"""

from __future__ import annotations

import argparse
import sys

from minitfm import checkpoint, usable
from minitfm.decoding import generation
from minitfm.cli import limits, placing
from minitfm.data import tokenizers
from minitfm.cli.exits import UsageError
from minitfm.models import lm


def stored_tokenizer(vocab_id: str | None, vocab_model: bytes | None,
                     where: str) -> tokenizers.Tokenizer:
    """The tokenizer a checkpoint stores (its vocabulary's identifier and model); ``where``
    names the checkpoint or run for the message."""
    kind = (vocab_id or "").split(":", 1)[0]
    if vocab_model is None or kind not in ("char", "bpe"):
        raise checkpoint.CheckpointError(f"checkpoint {where} holds no tokenizer: it was not "
                                         f"written by train_lm.py")
    return tokenizers.tokenizer_from_array(kind, vocab_model)


def encode_prompt(tokenizer: tokenizers.Tokenizer, prompt: str):
    """The prompt's token ids, checked before any work: known characters, at least one token."""
    ids = tokenizer.encode(prompt)
    if not len(ids):
        raise UsageError("--prompt must hold at least one token")
    return ids


def stream_sample(params: dict, cfg: lm.LMConfig, tokenizer, prompt, args: argparse.Namespace,
                  seed: int) -> str:
    """Print the prompt, then the text as each token is drawn; return the whole text."""
    ids = [int(i) for i in prompt]
    shown = tokenizer.decode(ids)
    sys.stdout.write(shown)
    sys.stdout.flush()
    tokens = generation.generate(params, cfg, prompt, args.max_new_tokens,
                                 temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                 seed=seed, greedy=args.greedy)
    for token in tokens:
        ids.append(int(token[0]))
        text = tokenizer.decode(ids)        # the whole text: BPE pieces join with their spaces
        sys.stdout.write(text[len(shown):])
        sys.stdout.flush()
        shown = text
    sys.stdout.write("\n")
    sys.stdout.flush()
    return shown


def run_sampling(args: argparse.Namespace, threads_cap: int | None) -> int:
    """``train_lm.py --sample``: stream text from ``--checkpoint``."""
    placing.select_backend(args.backend, "numpy")
    placing.place(args.threads, threads_cap, args.precision, announce=False,
                  kernels=args.kernels)    # output: the text alone
    checked = usable.load(args.checkpoint, lm.KIND, with_optimizer=False)
    tokenizer = stored_tokenizer(checked.ckpt.vocab_id, checked.ckpt.vocab_model,
                                 checked.ckpt.path)
    params, cfg = checkpoint.params_to_device(checked.ckpt.params), checked.config
    limits.check_fits("sampling", {"--max-new-tokens": (args.max_new_tokens,
                                                        range(0, args.max_new_tokens + 1))},
                      lambda v: limits.sampling_estimate(cfg, new_tokens=v["--max-new-tokens"],
                                                         params=False))
    stream_sample(params, cfg, tokenizer, encode_prompt(tokenizer, args.prompt), args,
                  seed=args.seed)
    return 0
