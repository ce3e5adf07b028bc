"""Translating text with trained checkpoints: a checkpoint (or several, as an ensemble) loaded
with the vocabulary it stores, lines of text encoded, translated with beam search
(:func:`minitfm.decoding.batched.translate_ids`) and detokenized.

A blank line gives an empty translation; a line longer than the model accepts (``max_len`` tokens,
EOS included) is cut to fit, with a warning naming the line. The command line that reads a file
and writes its translations is ``python -m minitfm.translate`` (:mod:`minitfm.cli.translate`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from tqdm import tqdm

from minitfm import checkpoint, usable
from minitfm.decoding import batched
from minitfm.data.reading import DataError
from minitfm.data.vocab import Vocab
from minitfm.decoding.ensemble import Ensemble
from minitfm.models import translator as model

__all__ = ["TranslateError", "Translation", "load_translator", "load_translators", "warn",
           "encode_lines", "translate_lines", "translate_texts"]

Translation = tuple[str, float]   # (detokenized text, length-normalised log-probability)


class TranslateError(Exception):
    """The checkpoint or the options cannot be used for translation; the message says why."""


def load_translator(path: str) -> tuple[dict, model.Config, Vocab]:
    """``(params, cfg, vocab)`` of a checkpoint, parameters on the active backend.

    The checkpoint must pass :mod:`minitfm.usable`'s check (a translator, sound parameters):
    :class:`usable.UnusableCheckpoint` otherwise, naming the newest one of its directory that
    does."""
    try:
        checked = usable.load(path, model.KIND, with_optimizer=False)
    except FileNotFoundError:
        raise TranslateError(f"checkpoint {path} does not exist") from None
    ckpt, cfg = checked.ckpt, checked.config
    if ckpt.vocab_model is None:
        raise TranslateError(
            f"checkpoint {path} has no vocabulary: translation needs the sentencepiece model the "
            f"model was trained with to encode the input and detokenize the output. Use a "
            f"checkpoint written with vocab_model (training on text stores it in every checkpoint)")
    try:
        vocab = Vocab.from_bytes(ckpt.vocab_model)
    except DataError as exc:
        raise TranslateError(f"checkpoint {path} is not usable: {exc}") from exc
    if vocab.size > min(cfg.src_vocab, cfg.tgt_vocab):
        raise TranslateError(
            f"checkpoint {path}: its vocabulary has {vocab.size} pieces but the model only "
            f"{min(cfg.src_vocab, cfg.tgt_vocab)} embeddings: the vocabulary is not the one the "
            f"model was trained with")
    return checkpoint.params_to_device(ckpt.params), cfg, vocab


def load_translators(paths: Sequence[str]) -> tuple[dict | Ensemble, model.Config, Vocab]:
    """:func:`load_translator` of one checkpoint; of several, ``(their Ensemble, its cfg, the
    vocabulary)``: they must have been trained with one vocabulary."""
    loaded = [load_translator(path) for path in paths]
    if len(loaded) == 1:
        return loaded[0]
    vocab = loaded[0][2]
    for path, (_, _, other) in zip(paths[1:], loaded[1:]):
        if other != vocab:
            raise TranslateError(
                f"checkpoint {path} was trained with another vocabulary ({other.identifier}) than "
                f"{paths[0]} ({vocab.identifier}): the models of an ensemble must share one. "
                f"Ensemble models trained on the same data with the same --vocab-size")
    try:
        ensemble = Ensemble([(params, cfg) for params, cfg, _ in loaded])
    except ValueError as exc:
        raise TranslateError(f"checkpoints {', '.join(paths)}: {exc}") from exc
    return ensemble, ensemble.cfg, vocab


def warn(message: str) -> None:
    """Print ``warning: message`` on standard error."""
    print(f"warning: {message}", file=sys.stderr)


def encode_lines(vocab: Vocab, cfg: model.Config, lines: Sequence[str], first_line: int = 1,
                 warn: Callable[[str], None] = warn) -> list[list[int] | None]:
    """Token ids of each line, None for a blank line; too long lines are cut to fit the model
    (``cfg.max_len`` positions with EOS) with a warning naming the line (counted from
    ``first_line``)."""
    longest = cfg.max_len - 1
    encoded: list[list[int] | None] = [None] * len(lines)
    texts = [(i, line) for i, line in enumerate(lines) if line.strip()]
    for (i, _), ids in zip(texts, vocab.encode([line for _, line in texts])):
        if len(ids) > longest:
            warn(f"line {first_line + i} has {len(ids)} tokens, more than the model's maximum of "
                 f"{longest}: translating only its first {longest} tokens")
            ids = ids[:longest]
        encoded[i] = ids
    return encoded


def translate_lines(params: dict, cfg: model.Config, vocab: Vocab, lines: Sequence[str], *,
                    beam: int = 4, alpha: float = 0.6, nbest: int = 1, batch_size: int = 64,
                    max_len: int | None = None, first_line: int = 1, lenpen_form: str = "gnmt",
                    stopping: str = "auto",
                    warn: Callable[[str], None] = warn) -> list[list[Translation]]:
    """The ``nbest`` best translations of each line, best first; ``[("", 0.0)]`` for a blank.
    The search settings are ``batched.translate_ids``'s."""
    encoded = encode_lines(vocab, cfg, lines, first_line, warn)
    todo = [i for i, ids in enumerate(encoded) if ids is not None]
    found = batched.translate_ids(params, cfg, [encoded[i] for i in todo], beam=beam, alpha=alpha,
                                 max_len=max_len, nbest=nbest, batch_size=batch_size,
                                 lenpen_form=lenpen_form, stopping=stopping)
    results: list[list[Translation]] = [[("", 0.0)] for _ in lines]
    for i, hyps in zip(todo, found):
        texts = vocab.decode([tokens for tokens, _ in hyps])
        results[i] = [(text.replace("\n", " "), score) for text, (_, score) in zip(texts, hyps)]
    return results


def translate_texts(params: dict, cfg: model.Config, vocab: Vocab, lines: Sequence[str], *,
                    beam: int = 4, alpha: float = 0.6, batch_size: int = 64,
                    progress: bool = False, lenpen_form: str = "gnmt",
                    stopping: str = "auto",
                    warn: Callable[[str], None] = warn) -> list[str]:
    """The best translation of each line, with an optional progress bar."""
    outputs: list[str] = []
    chunk = 4 * batch_size
    with tqdm(total=len(lines), desc="translate", unit=" sent", disable=not progress) as bar:
        for start in range(0, len(lines), chunk):
            results = translate_lines(params, cfg, vocab, lines[start:start + chunk], beam=beam,
                                      alpha=alpha, batch_size=batch_size, first_line=start + 1,
                                      lenpen_form=lenpen_form, stopping=stopping, warn=warn)
            outputs += [hyps[0][0] for hyps in results]
            bar.update(len(results))
    return outputs

