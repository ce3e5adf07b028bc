"""Decoding: a model's output, one token at a time.

:mod:`~minitfm.decoding.decode` (greedy decoding over a key/value cache, and the pieces beam
search shares), :mod:`~minitfm.decoding.beam` (beam search, its length penalties and stopping
rules), :mod:`~minitfm.decoding.batched` (many sentences, batch by batch or continuously),
:mod:`~minitfm.decoding.ensemble` (several models as one), :mod:`~minitfm.decoding.translation`
(text translated with checkpoints), :mod:`~minitfm.decoding.sampling` and
:mod:`~minitfm.decoding.generation` (the language model's sampling).
"""
