"""Cleaning a parallel training corpus, the way Moses' ``clean-corpus-n.perl`` does.

Web-crawled and automatically aligned corpora (Common Crawl above all) hold empty lines, huge
lines, and pairs whose sides have nothing to do with each other. The standard filter drops a pair
when, after collapsing whitespace,

- either side is empty                                       -> ``"empty"``
- either side has fewer than ``min_len`` tokens              -> ``"too_short"``
- either side has more than ``max_len`` tokens               -> ``"too_long"``
- one side has more than ``max_ratio`` times the tokens of the other -> ``"ratio"``
- a token is longer than ``max_word_chars`` characters       -> ``"long_word"``

where a token is a whitespace-separated word, checked in that order (a pair is counted under the
first reason that applies). Defaults: ``max_ratio=9`` is Moses' default; ``max_len=250`` and
``max_word_chars=1000`` are the values usual for WMT (Moses has no default length limits). The
fairseq WMT14 recipe instead filters with ratio 1.5 on subword tokens after BPE; pass
``max_ratio=1.5`` for that stricter filter. Only training data is cleaned: test sets are scored
as released.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

from .reading import DataError

__all__ = ["CleanOptions", "CleanReport", "DROP_REASONS", "clean_parallel", "drop_reason",
           "normalize_space"]

DROP_REASONS = ("empty", "too_short", "too_long", "ratio", "long_word")


@dataclass(frozen=True)
class CleanOptions:
    """Limits of :func:`clean_parallel`; the defaults are Moses' ratio and the usual WMT lengths."""

    min_len: int = 1
    max_len: int = 250
    max_ratio: float = 9.0
    max_word_chars: int = 1000

    def __post_init__(self) -> None:
        if not 1 <= self.min_len <= self.max_len:
            raise DataError(f"clean options: need 1 <= min_len <= max_len, got min_len="
                            f"{self.min_len}, max_len={self.max_len}")
        if self.max_ratio < 1:
            raise DataError(f"clean options: max_ratio must be >= 1, got {self.max_ratio}")
        if self.max_word_chars < 1:
            raise DataError(f"clean options: max_word_chars must be >= 1, got "
                            f"{self.max_word_chars}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CleanReport:
    """How many pairs were kept, and how many were dropped for each reason of ``DROP_REASONS``."""

    kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))

    @property
    def total(self) -> int:
        return self.kept + sum(self.dropped.values())

    def add(self, reason: str | None) -> None:
        if reason is None:
            self.kept += 1
        else:
            self.dropped[reason] += 1

    def summary(self) -> str:
        reasons = ", ".join(f"{name} {count}" for name, count in self.dropped.items() if count)
        text = f"kept {self.kept} of {self.total} pairs"
        return text + (f" (dropped: {reasons})" if reasons else "")

    def to_dict(self) -> dict:
        return {"kept": self.kept, "dropped": dict(self.dropped)}


def normalize_space(line: str) -> str:
    """Strip ``line`` and collapse every run of whitespace to one space."""
    return " ".join(line.split())


def drop_reason(src: str, tgt: str, options: CleanOptions) -> str | None:
    """Why to drop the pair ``(src, tgt)``: one of ``DROP_REASONS``, or None to keep it."""
    src_words, tgt_words = src.split(), tgt.split()
    n_src, n_tgt = len(src_words), len(tgt_words)
    if n_src == 0 or n_tgt == 0:
        return "empty"
    if min(n_src, n_tgt) < options.min_len:
        return "too_short"
    if max(n_src, n_tgt) > options.max_len:
        return "too_long"
    if max(n_src, n_tgt) > options.max_ratio * min(n_src, n_tgt):
        return "ratio"
    if max(map(len, src_words + tgt_words)) > options.max_word_chars:
        return "long_word"
    return None


Cleaned = tuple[list[str], list[str], CleanReport]


def clean_parallel(src: Sequence[str], tgt: Sequence[str],
                   options: CleanOptions = CleanOptions()) -> Cleaned:
    """Filter aligned sentences; returns the kept pairs (whitespace-normalized) and a report."""
    if len(src) != len(tgt):
        raise DataError(f"clean_parallel: {len(src)} source but {len(tgt)} target sentences; "
                        "the two sides must be aligned")
    kept_src, kept_tgt, report = [], [], CleanReport()
    for src_line, tgt_line in zip(src, tgt):
        src_line, tgt_line = normalize_space(src_line), normalize_space(tgt_line)
        reason = drop_reason(src_line, tgt_line, options)
        report.add(reason)
        if reason is None:
            kept_src.append(src_line)
            kept_tgt.append(tgt_line)
    return kept_src, kept_tgt, report


def filter_pairs(pairs: Iterable[tuple[str, str]], options: CleanOptions | None,
                 report: CleanReport) -> Iterator[tuple[str, str]]:
    """Yield the pairs that pass cleaning (all of them when ``options`` is None), counting in ``report``."""
    for src, tgt in pairs:
        if options is not None:
            src, tgt = normalize_space(src), normalize_space(tgt)
            reason = drop_reason(src, tgt, options)
            report.add(reason)
            if reason is not None:
                continue
        else:
            report.add(None)
        yield src, tgt
