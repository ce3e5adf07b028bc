"""Synthetic sequence tasks for checking that the model learns: copy, reverse and sort.

Each example is a random sequence of ``length`` symbols and the sequence the model must produce
from it:

    copy      3 9 4 4 7  ->  3 9 4 4 7     (the "Annotated Transformer" sanity check)
    reverse   3 9 4 4 7  ->  7 4 4 9 3
    sort      3 9 4 4 7  ->  3 4 4 7 9

Symbols are token ids ``FIRST_SYMBOL .. FIRST_SYMBOL + vocab - 1``: ids 0-3 are PAD, UNK, BOS and
EOS, so a model for ``vocab`` symbols needs a vocabulary of ``vocab + FIRST_SYMBOL`` ids
(:func:`model_vocab`). Batches come in the project's format: ``src = symbols + EOS`` (B, L+1)
and ``tgt = BOS + answer + EOS`` (B, L+2); every sequence has the same length, so there is no
padding.

Everything is reproducible from a seed. Training batch ``i`` is drawn from its own generator
``host_rng(seed, TRAIN_STREAM, epoch, i)``, so the stream is the same however it is consumed; the
held-out set comes from a different stream (``HELD_OUT_STREAM``) of the same seed. With
``vocab ** length`` possible inputs, overlap between the two is negligible, not excluded.

Data is made on the host, so this module uses NumPy deliberately; the training loop moves the
batches to the active backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy

from minitfm import backend
from minitfm.ids import BOS_ID, EOS_ID

__all__ = ["TASKS", "FIRST_SYMBOL", "TRAIN_STREAM", "HELD_OUT_STREAM", "model_vocab", "answers",
           "sample", "to_batch", "train_batches", "held_out", "exact_match"]

TASKS = ("copy", "reverse", "sort")
FIRST_SYMBOL = 4        # ids 0-3 are PAD, UNK, BOS, EOS
TRAIN_STREAM = 0        # the second part of a generator seed: (seed, stream, ...)
HELD_OUT_STREAM = 1

Batch = tuple[numpy.ndarray, numpy.ndarray]


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")


def model_vocab(vocab: int) -> int:
    """The model vocabulary size for ``vocab`` symbols: the symbols plus the 4 special ids."""
    if vocab < 2:
        raise ValueError(f"a task needs at least 2 symbols, got vocab={vocab}")
    return vocab + FIRST_SYMBOL


def answers(task: str, inputs: numpy.ndarray) -> numpy.ndarray:
    """The expected output (n, L) for each input row (n, L) of symbols."""
    _check_task(task)
    if task == "copy":
        return inputs.copy()
    if task == "reverse":
        return inputs[:, ::-1].copy()
    return numpy.sort(inputs, axis=1)


def sample(task: str, rng: numpy.random.Generator, n: int, *, vocab: int,
           length: int) -> tuple[numpy.ndarray, numpy.ndarray]:
    """``n`` random inputs (n, L) and their answers (n, L), symbols drawn uniformly."""
    _check_task(task)
    model_vocab(vocab)
    if length < 1 or n < 1:
        raise ValueError(f"need at least one sequence of at least one symbol, got n={n}, "
                         f"length={length}")
    inputs = rng.integers(FIRST_SYMBOL, FIRST_SYMBOL + vocab, size=(n, length), dtype=numpy.int64)
    return inputs, answers(task, inputs)


def to_batch(inputs: numpy.ndarray, outputs: numpy.ndarray) -> Batch:
    """``(src, tgt)`` in the project's format: src = inputs + EOS, tgt = BOS + outputs + EOS."""
    n = inputs.shape[0]
    eos = numpy.full((n, 1), EOS_ID, dtype=inputs.dtype)
    bos = numpy.full((n, 1), BOS_ID, dtype=outputs.dtype)
    return (numpy.concatenate([inputs, eos], axis=1),
            numpy.concatenate([bos, outputs, eos], axis=1))


def train_batches(task: str, *, vocab: int, length: int, batch_size: int,
                  seed: int) -> Callable[[int], Iterator[Batch]]:
    """A batch factory for :func:`minitfm.training.loop.train`: ``factory(epoch)`` yields batches forever.

    The stream is endless, so training stays in epoch 0; batch ``i`` depends only on
    ``(seed, i)`` (and the epoch, should one ever end).
    """
    sample(task, backend.host_rng(seed), 1, vocab=vocab, length=length)   # validate arguments

    def factory(epoch: int) -> Iterator[Batch]:
        i = 0
        while True:
            rng = backend.host_rng(seed, TRAIN_STREAM, epoch, i)
            yield to_batch(*sample(task, rng, batch_size, vocab=vocab, length=length))
            i += 1

    return factory


def held_out(task: str, n: int, *, vocab: int, length: int,
             seed: int) -> tuple[numpy.ndarray, numpy.ndarray]:
    """``n`` evaluation inputs and answers, from a generator stream training never uses."""
    return sample(task, backend.host_rng(seed, HELD_OUT_STREAM), n, vocab=vocab, length=length)


def exact_match(hypotheses: list[list[int]], outputs: numpy.ndarray) -> float:
    """The fraction of hypotheses (token ids, no BOS/EOS) equal to their expected output row."""
    if len(hypotheses) != len(outputs):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(outputs)} expected outputs")
    if not len(hypotheses):
        raise ValueError("exact_match needs at least one hypothesis")
    hits = sum(list(map(int, h)) == row.tolist() for h, row in zip(hypotheses, outputs))
    return hits / len(hypotheses)
