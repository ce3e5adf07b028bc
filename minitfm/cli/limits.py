"""Sizes checked before any work: every size option of a command, against the libraries' own
limits and against the memory there is, so that an absurd size ends at once with one message
(status 2) instead of a traceback minutes later, after the data is read.

Library limits
--------------
- sentencepiece stores the vocabulary size as a C ``int32``: ``--vocab-size`` is at most
  ``2**31 - 1`` (:data:`SENTENCEPIECE_MAX_VOCAB`, checked by ``minitfm.cli.argtypes.vocab_size``);
- a BPE vocabulary has at most one piece per character of its text (every piece but the
  specials is a character or a merge of two pieces, and each merge needs an occurrence): a plain
  text file of ``n`` bytes holds at most ``n`` characters, so ``--vocab-size`` above ``n`` plus
  the special pieces cannot be reached (:func:`check_vocab_for_corpus`, which reads only the
  files' sizes). sentencepiece's own, exact bound is reported after its training.

Memory
------
Each estimate is a sum of named parts computed from the shapes alone, in bytes; ``f`` is the size
of a float (4 for float32), ``P`` the model's parameter count (from the model's own
``parameter_shapes``), ``d`` the width, ``d_ff`` the feed-forward width, ``H`` the heads, ``V``
the vocabulary, ``L`` the layers (of the encoder and of the decoder each).

Training (:func:`training_estimate`), a batch of ``B`` rows, ``S`` source and ``T`` target
positions, ``N_s = B S`` and ``N_t = B T`` tokens::

    model state  (4 + s) P f          parameters, gradients, Adam's m and v; s = 1 with
                                      --update-freq > 1 (the second gradient buffer)
    one batch    the model's own count (``Model.batch_bytes``), e.g. the translator's
                 f L (6 N_s d + 2 N_s d_ff + B H S^2)                        encoder layers
               + f L (10 N_t d + 2 N_t d_ff + B H T^2 + B H T S)             decoder layers
               + 2 f N_t V                       the logits and their gradient

The language model has no encoder and no cross-attention: ``f L (6 N d + 2 N d_ff + B H T^2)
+ 2 f N V``, plus ``20 B T`` bytes of host blocks (int64 indices and windows, int32 ``x``, ``y``)
(``lm.batch_bytes``). Token-count batches (``train_wmt.py``) take ``N_s = N_t = --max-tokens``
and leave the ``B H T^2`` terms out: they depend on the sentence lengths, and short sentences
make them small.

Decoding (:func:`decoding_estimate`), beam search (greedy: beam 1) over ``R = sentences x beam``
rows, ``C`` output positions, ``S`` source positions::

    key/value cache   2 f L R (C + S) d       self-attention (C slots) and cross-attention (S)
    step scores       3 f R V                 logits, their exponentials, the selection

Before the input is read its lengths are unknown: ``S = 2`` (a token and EOS) and ``C =
min(S + 50, max_len)`` (the default output limit), or ``--max-len`` when given.

Sampling (:func:`sampling_estimate`), ``R`` sequences (one at a time: ``R = 1``)::

    key/value cache   2 f L R max_len d
    step              48 R V                  float64 copies of the filtered logits (6 of them)
    kept tokens       48 R new_tokens         host: the ids of the text so far and the text

The position table (:func:`positions_estimate`, :func:`check_positions`): a model reads
sentences of up to ``max_len`` positions (``--max-len``), and the rows of its sinusoid table for
them are computed in float64 and cast (``layers/positional.py``); an export to CTranslate2 writes
the whole table::

    position table    (8 + f) max_len d

A ``max_len`` whose table does not fit cannot be exported, nor could a sentence that long be
read: training refuses it where ``--max-len`` is given, the export before it computes the table,
each naming the largest ``max_len`` whose table fits.

Parameters already loaded (``translate``, ``--sample``) are not counted: the memory they take is
no longer available. The estimates aim to be right within a small factor and to err low: a size
is refused only when its estimate is above the available memory (:func:`check_fits`): what
clearly cannot fit. (Against the peak of one step measured with tracemalloc on NumPy, the
training and beam-search estimates came to 0.8 to 1.3 times it on six shapes.)

Available memory (:func:`minitfm.backend.memory.available_memory`): on NumPy ``MemAvailable`` of
``/proc/meminfo``, on CuPy the device's free memory (the host's for host parts); where the
system does not say, only the library limits are checked.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from minitfm import backend, files, models
from minitfm.backend import memory
from minitfm.data.reading import GZIP_MAGIC
from minitfm.cli.exits import UsageError
from minitfm.ids import EOS_ID

__all__ = ["SENTENCEPIECE_MAX_VOCAB", "TooLarge", "Estimate", "check_vocab_for_corpus",
           "parameter_count", "training_estimate", "decoding_estimate", "sampling_estimate",
           "state_estimate", "positions_estimate", "check_fits", "check_positions",
           "human_bytes", "model_sizes", "with_model_sizes"]

SENTENCEPIECE_MAX_VOCAB = 2**31 - 1     # sentencepiece's TrainerSpec.vocab_size is an int32
DEFAULT_EXTRA_OUTPUT = 50               # decode.EXTRA_LENGTH: the default output limit S + 50
SAMPLING_STEP_COPIES = 6                # float64 (R, V) arrays of one sampling step
HOST_BYTES_PER_TOKEN = 48               # a kept token: a list slot, an int object, its text


class TooLarge(UsageError):
    """A size option that cannot work: above a library's limit, or needing more memory than
    there is. The message gives the estimate, the memory available and the largest value that
    fits; ``largest``: that value of each option named, for a caller's advice."""

    def __init__(self, message: str, largest: Mapping[str, int] | None = None) -> None:
        super().__init__(message)
        self.largest = dict(largest or {})


@dataclass(frozen=True)
class Estimate:
    """Bytes a command needs, by part: ``device`` on the array backend's memory, ``host`` in
    the host's (the same memory on NumPy)."""

    device: dict[str, int] = field(default_factory=dict)
    host: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.device.values()) + sum(self.host.values())

    def __add__(self, other: Estimate) -> Estimate:
        return Estimate(_merge(self.device, other.device), _merge(self.host, other.host))

    def describe(self) -> str:
        parts = {**self.device, **{f"{k} (host)": v for k, v in self.host.items()}}
        return ", ".join(f"{name} {human_bytes(n)}" for name, n in parts.items() if n)


def _merge(a: dict, b: dict) -> dict:
    merged = dict(a)
    for key, value in b.items():
        merged[key] = merged.get(key, 0) + value
    return merged


def human_bytes(n: float) -> str:
    """``1.5 GiB``, ``320 KiB``, ``12 B``; past the units, ``3.1e+09 YiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"):
        if abs(n) < 1024 or unit == "YiB":
            if unit == "B":
                return f"{n:.0f} B"
            return f"{n:.1e} {unit}" if n >= 1e6 else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# ---- library limits --------------------------------------------------------------------------

def check_vocab_for_corpus(vocab_size: int, paths: Sequence[str | os.PathLike],
                           option: str = "--vocab-size") -> None:
    """Refuse a vocabulary larger than the plain text files ``paths`` can make (one piece per
    character at most, plus the special pieces); gzipped or unreadable files, and anything but a
    regular file, are left to the vocabulary's training and the data checks."""
    characters = 0
    for path in paths:
        if files.kind_of(path) is not None:        # never opened here: a pipe would block
            return                                  # the data checks refuse it
        try:
            with open(path, "rb") as f:
                if f.read(2) == GZIP_MAGIC:
                    return
            characters += os.path.getsize(path)
        except OSError:
            return                                  # the data checks name a missing file
    specials = EOS_ID + 1                           # PAD, UNK, BOS, EOS: ids 0 to EOS_ID
    most = characters + specials
    if vocab_size > most:
        names = ", ".join(map(str, paths))
        raise TooLarge(f"{option} {vocab_size} is more pieces than {names} can make: "
                       f"{characters:,} bytes of text hold at most {characters:,} characters, "
                       f"so at most {most:,} pieces with the {specials} special "
                       f"ones; use {option} {most} or less")


# ---- estimates -------------------------------------------------------------------------------

def _float_bytes() -> int:
    return backend.xp.dtype(backend.float_dtype()).itemsize


def parameter_count(cfg) -> int:
    """P, from the model's own ``parameter_shapes`` (the heads do not change it). Every layer
    has the same parameters: P is counted for one and two layers and extended to
    ``cfg.n_layers`` by arithmetic, so that a count of 10**30 layers is not listed."""
    one_head = dataclasses.replace(cfg, n_heads=1)      # any width is valid with one head

    def count(layers: int) -> int:
        shaped = dataclasses.replace(one_head, n_layers=layers)
        shapes = models.of(shaped).parameter_shapes(shaped)
        return sum(math.prod(shape) for shape in shapes.values())

    first = count(1)
    return first + (cfg.n_layers - 1) * (count(2) - first)


def state_estimate(cfg, update_freq: int = 1) -> Estimate:
    """The model state of training: parameters, gradients and Adam's moments."""
    return Estimate({"model and Adam": (4 + (update_freq > 1)) * parameter_count(cfg)
                     * _float_bytes()})


def training_estimate(cfg, *, rows: int, src_len: int, tgt_len: int, update_freq: int = 1,
                      attention: bool = True) -> Estimate:
    """The model state and one batch of ``rows`` x ``src_len`` / ``tgt_len`` positions (the
    language model: ``tgt_len`` only); ``attention=False`` leaves out the ``B H T^2`` terms."""
    state = state_estimate(cfg, update_freq).device["model and Adam"]
    device, host = models.of(cfg).batch_bytes(cfg, rows=rows, src_len=src_len, tgt_len=tgt_len,
                                              float_bytes=_float_bytes(), attention=attention)
    return Estimate({"model and Adam": state, "one batch": device},
                    {"host batches": host} if host else {})


def decoding_estimate(cfg, *, rows: int, src_len: int = 2, out_len: int | None = None,
                      params: bool = True) -> Estimate:
    """Beam search (or greedy) over ``rows`` = sentences x beam rows of ``src_len`` source
    positions and ``out_len`` output positions (default: ``min(src_len + 50, max_len)``);
    ``params=False``: the parameters are loaded already."""
    f = _float_bytes()
    out_len = min(src_len + DEFAULT_EXTRA_OUTPUT, cfg.max_len) if out_len is None else out_len
    parts = {"parameters": parameter_count(cfg) * f} if params else {}
    parts["key/value cache"] = 2 * f * cfg.n_layers * rows * (out_len + src_len) * cfg.d_model
    parts["step scores"] = 3 * f * rows * models.of(cfg).output_vocab(cfg)
    return Estimate(parts)


def sampling_estimate(cfg, *, new_tokens: int, rows: int = 1,
                      params: bool = True) -> Estimate:
    """Drawing ``new_tokens`` tokens for ``rows`` sequences at once over the model's cache."""
    f = _float_bytes()
    parts = {"parameters": parameter_count(cfg) * f} if params else {}
    parts["key/value cache"] = 2 * f * cfg.n_layers * rows * cfg.max_len * cfg.d_model
    parts["sampling step"] = SAMPLING_STEP_COPIES * 8 * rows * models.of(cfg).output_vocab(cfg)
    return Estimate(parts, {"sampled tokens": HOST_BYTES_PER_TOKEN * rows * new_tokens})


def positions_estimate(cfg) -> Estimate:
    """The sinusoid table of all ``cfg.max_len`` positions, as computed (float64) and cast."""
    return Estimate({"position table": (8 + _float_bytes()) * cfg.max_len * cfg.d_model})


# ---- the check -------------------------------------------------------------------------------

Available = tuple[int, str]     # bytes, and where the number comes from


def _shortfall(estimate: Estimate, device: Available | None,
               host: Available | None) -> tuple[int, Available] | None:
    """``(bytes needed, what is available)`` of the first memory the estimate overflows."""
    if device is not None and not backend.is_gpu():         # one memory: host and device
        need = estimate.total
        return (need, device) if need > device[0] else None
    if device is not None and sum(estimate.device.values()) > device[0]:
        return sum(estimate.device.values()), device
    if host is not None and sum(estimate.host.values()) > host[0]:
        return sum(estimate.host.values()), host
    return None


def _up_to(candidates: Sequence[int], value: int) -> Sequence[int]:
    """The candidates up to ``value``: a range stays a range (it may be huge)."""
    if isinstance(candidates, range):
        return range(candidates.start, min(candidates.stop, value + 1), candidates.step)
    return [c for c in candidates if c <= value]


def _size(candidates: Sequence[int]) -> int:
    """How many candidates there are; a range counted by arithmetic: it may hold more values
    than ``len`` can count (an option of 10**30), though indexing it works at any size."""
    if isinstance(candidates, range):
        return max(0, -(-(candidates.stop - candidates.start) // candidates.step))
    return len(candidates)


def _largest(candidates: Sequence[int], fits: Callable[[int], bool]) -> int | None:
    """The largest of the increasing ``candidates`` that fits (fitting is monotone), or None."""
    lo, hi = 0, _size(candidates) - 1
    if hi < 0 or not fits(candidates[0]):
        return None
    while lo < hi:                     # candidate lo fits; is there a larger one?
        mid = (lo + hi + 1) // 2
        if fits(candidates[mid]):
            lo = mid
        else:
            hi = mid - 1
    return candidates[lo]


def check_fits(what: str, sizes: Mapping[str, tuple[int, Sequence[int]]],
               estimate: Callable[[dict], Estimate], *, device: Available | None = None,
               host: Available | None = None, measure: bool = True) -> Estimate:
    """Raise :class:`TooLarge` if ``estimate(values)`` needs more memory than there is; return
    the estimate.

    what: the work, for the message ("training", "beam search").
    sizes: option -> (its value, the values it may take, increasing: a ``range`` or a list).
    estimate: the bytes needed for a dict option -> value.
    device, host: the memory available (default ``measure``: :func:`memory.available_memory`
        and :func:`memory.host_available_memory`); None where unknown: not checked.
    The message names the option whose value is furthest above the largest value that fits
    with the others unchanged, and that value (and the next such option, if any).
    """
    if measure:
        device = device or memory.available_memory()
        host = host or memory.host_available_memory()
    values = {option: value for option, (value, _) in sizes.items()}
    needed = estimate(values)
    short = _shortfall(needed, device, host)
    if short is None:
        return needed
    need, (available, source) = short
    fits = []                                   # (how far above, option, largest that fits)
    for option, (value, candidates) in sizes.items():
        fit = _largest(_up_to(candidates, value),
                       lambda v: _shortfall(estimate({**values, option: v}), device, host)
                       is None)
        if fit is not None:
            fits.append((value / fit, option, fit))
    head = (f"{what} needs about {human_bytes(need)} of memory ({needed.describe()}), more "
            f"than the {human_bytes(available)} available ({source})")
    if not values:
        raise TooLarge(head)
    if not fits and len(sizes) == 1:
        [(option, (_, candidates))] = sizes.items()
        raise TooLarge(f"{head}, even with {option} {candidates[0]}, its smallest: lower the "
                       f"sizes it is counted with")
    if not fits:
        raise TooLarge(f"{head}, even with any one of {', '.join(values)} at its smallest: "
                       f"lower several of them")
    fits.sort(key=lambda fit: -fit[0])          # the options furthest above what fits first
    said = " or ".join(f"{option} {fit}" for _, option, fit in fits[:2])
    raise TooLarge(f"{head}: the largest that fits, the other sizes unchanged: {said}",
                   {option: fit for _, option, fit in fits[:2]})


def check_positions(cfg, what: str, option: str, *, device: Available | None = None,
                    host: Available | None = None, measure: bool = True) -> Estimate:
    """Raise :class:`TooLarge` where the position table of ``cfg.max_len`` positions
    (:func:`positions_estimate`) needs more memory than there is, naming ``option`` (the
    ``max_len``'s) and its largest value that fits (``TooLarge.largest[option]``), the one
    whose table fits; ``what``: the work, for the message. ``device``, ``host``, ``measure``:
    the memory available, as for :func:`check_fits`."""
    return check_fits(what, {option: (cfg.max_len, range(1, cfg.max_len + 1))},
                      lambda v: positions_estimate(dataclasses.replace(cfg, max_len=v[option])),
                      device=device, host=host, measure=measure)


# ---- the model's size options ----------------------------------------------------------------

MODEL_OPTIONS = {"--layers": "n_layers", "--d-model": "d_model", "--heads": "n_heads",
                 "--d-ff": "d_ff"}


DIVISIONS = 10**6       # trial divisions at most when listing the head counts of a width


def _head_counts(d_model: int, heads: int) -> list[int]:
    """The head counts that divide ``d_model``: all of them where its square root is at most
    :data:`DIVISIONS`; for a wider model (an option of 10**30) those up to ``heads`` that so
    many divisions find, and ``heads`` itself."""
    if math.isqrt(d_model) <= DIVISIONS:
        small = [k for k in range(1, math.isqrt(d_model) + 1) if d_model % k == 0]
        return sorted(set(small + [d_model // k for k in small]))
    found = [k for k in range(1, min(heads, DIVISIONS) + 1) if d_model % k == 0]
    return found + [heads] if heads > DIVISIONS else found


def model_sizes(cfg) -> dict[str, tuple[int, Sequence[int]]]:
    """The model's size options for :func:`check_fits`, each with the values that keep the
    config valid while the others stay (a width a multiple of the heads, heads dividing it)."""
    return {"--layers": (cfg.n_layers, range(1, cfg.n_layers + 1)),
            "--d-model": (cfg.d_model, range(cfg.n_heads, cfg.d_model + 1, cfg.n_heads)),
            "--heads": (cfg.n_heads, _head_counts(cfg.d_model, cfg.n_heads)),
            "--d-ff": (cfg.d_ff, range(1, cfg.d_ff + 1))}


def with_model_sizes(cfg, values: Mapping[str, int], **changes):
    """``cfg`` with the model options of ``values`` (and ``changes``) applied."""
    fields = {name: values[option] for option, name in MODEL_OPTIONS.items() if option in values}
    return dataclasses.replace(cfg, **fields, **changes)
