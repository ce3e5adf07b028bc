"""Translate text with a trained checkpoint: ``python -m minitfm.translate``.

    python -m minitfm.translate --checkpoint model.npz < input.en > output.de
    python -m minitfm.translate --checkpoint model.npz --input test.en --beam 4 --lenpen 0.6
    python -m minitfm.translate --checkpoint model.npz --nbest 4 < input.en
    python -m minitfm.translate --checkpoint a.npz --ensemble b.npz < input.en > output.de

Reads one sentence per line (UTF-8, from standard input or ``--input``) and writes one
translation per line, in the same order, detokenized with the sentencepiece model stored in the
checkpoint. The search is beam search with the paper's settings by default (beam 4, length
penalty 0.6, at most source length + 50 output tokens; see :mod:`minitfm.decoding.beam`). With
``--ensemble``, more models trained with the same vocabulary decode together with the first, each
step's next-token probabilities the mean of theirs (:mod:`minitfm.decoding.ensemble`).

- An empty (or blank) line gives an empty line.
- A line longer than the model accepts (``max_len`` tokens, EOS included) is truncated, with a
  warning on standard error naming the line; translation goes on.
- With ``--nbest N`` every input line gives its N best hypotheses, best first, one per line in
  the Moses n-best format ``INDEX ||| TRANSLATION ||| SCORE`` (INDEX counts input lines from 0,
  SCORE is the length-normalised log-probability); an empty line gives one empty hypothesis.

Input is split on ``\\n`` only, and invalid UTF-8 is replaced rather than fatal (with one warning
at the end naming the lines and what the input seems to be: text in an 8-bit encoding such as
Windows-1252, or damaged lines), so the output always has exactly as many lines (or n-best groups)
as the input. Input in UTF-16 or UTF-32 (a byte-order mark, or NUL bytes in its first bytes) is
refused before anything is translated, naming the encoding and the conversion. Gzipped input
(``--input`` or standard input) is recognised by its first bytes and decompressed, as the corpora
are; a truncated one is an error. The input is read once, as it comes: ``--input`` may be a
pipe (``--input <(zcat test.en.gz)``) or ``/dev/stdin``. A line longer than 1 MiB (a file that is
not text) is an error naming the line. Standard input that is a terminal is read too, after a
note on standard error that says how to end it.

The library it runs, loading checkpoints and translating lines, is :mod:`minitfm.decoding.translation`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import BinaryIO, TextIO

from minitfm.cli import limits, options
from minitfm.cli.argtypes import Parser, positive_int
from minitfm.cli.placing import placement_defaults, select_backend
from minitfm.cli.reporting import report_errors
from minitfm.data.reading import not_utf8, open_bytes, stream_lines, text_stream
from minitfm.decoding.ensemble import Ensemble
from minitfm.models import translator as model
from minitfm.training.stops import interrupts_deferred
from minitfm.decoding.translation import (TranslateError, Translation, load_translators, translate_lines,
                                 warn)

__all__ = ["main"]


class InputLines:
    """The lines of ``--input`` (plain or gzipped) or of a byte stream, split on ``\\n`` only,
    without their line endings; invalid UTF-8 is replaced, and the line numbers collected in
    ``invalid`` for one warning at the end, which says what the input seems to be (a UTF-16 or
    UTF-32 input is refused when it is opened: ``minitfm.data.reading``)."""

    def __init__(self, path: str | None, stream: BinaryIO) -> None:
        self.path, self.stream = path, stream
        self.name = path or "standard input"
        self.invalid: list[int] = []
        self.first_invalid = b""        # the first line that is not UTF-8
        self.utf8 = False               # whether a line beyond ASCII is UTF-8
        self.gzipped = False

    def __iter__(self) -> Iterator[str]:
        if self.path is not None:                        # a file, a pipe, /dev/stdin: read once
            with open_bytes(self.path, streamed=True) as text:
                yield from self._decoded(text)
        else:
            yield from self._decoded(text_stream(self.stream, self.name))

    def _decoded(self, text: BinaryIO) -> Iterator[str]:
        self.gzipped = text.gzipped
        for line_number, raw in enumerate(stream_lines(text, self.name), start=1):
            try:
                decoded = raw.decode("utf-8")
            except UnicodeDecodeError:
                if not self.invalid:
                    self.first_invalid = raw
                self.invalid.append(line_number)
                decoded = raw.decode("utf-8", errors="replace")
            else:
                self.utf8 = self.utf8 or not raw.isascii()
            yield decoded

    def warning(self) -> str | None:
        if not self.invalid:
            return None
        shown = ", ".join(map(str, self.invalid[:10])) + (", ..." if len(self.invalid) > 10
                                                          else "")
        return (f"invalid UTF-8 replaced by U+FFFD on {len(self.invalid)} line(s) of "
                f"{self.name}: {shown}; "
                + not_utf8(self.name, self.first_invalid, self.utf8, self.gzipped))


def chunks(items: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def format_translations(results: list[list[Translation]], first_index: int,
                        nbest: bool) -> Iterator[str]:
    for index, hyps in enumerate(results, start=first_index):
        if not nbest:
            yield hyps[0][0]
            continue
        for text, score in hyps:
            yield f"{index} ||| {text} ||| {score:.4f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(
        prog="python -m minitfm.translate",
        description="Translate sentences (one per line) with a trained minitfm checkpoint.")
    p.add_argument("--checkpoint", required=True, help="checkpoint file (.npz) with a vocabulary")
    options.add_ensemble_option(p)
    p.add_argument("--input", help="input text file, plain or gzipped (default: standard input)")
    options.add_search_options(p)
    p.add_argument("--nbest", type=positive_int, default=None,
                   help="print the N best hypotheses with scores, 'INDEX ||| TEXT ||| SCORE'")
    p.add_argument("--max-len", type=positive_int, default=None,
                   help="most output tokens (default: source length + 50)")
    p.add_argument("--batch-size", type=positive_int, default=64,
                   help="sentences decoded together")
    options.add(p, "backend", defaults=placement_defaults("numpy", None))
    args = p.parse_args(argv)
    if args.nbest is not None and not args.nbest <= args.beam:
        p.error(f"--nbest must be between 1 and --beam ({args.beam}), got {args.nbest}")
    return args


def decoding_estimate(params: dict | Ensemble, cfg: model.Config, rows: int,
                      out_len: int | None = None) -> limits.Estimate:
    """The memory that decoding ``rows`` rows with the loaded model or ensemble takes: every
    member has its own cache."""
    cfgs = [c for _, c in params.members] if isinstance(params, Ensemble) else [cfg]
    return sum((limits.decoding_estimate(c, rows=rows, out_len=out_len, params=False)
                for c in cfgs), limits.Estimate())


def check_sizes(args: argparse.Namespace, params: dict | Ensemble, cfg: model.Config) -> None:
    """``--beam`` x ``--batch-size`` rows of beam search, each up to ``--max-len`` tokens (the
    model's ``max_len`` by default), fit in the memory left once the model (or ensemble) is
    loaded, before any input is read (minitfm.cli.limits); ``--nbest`` is at most ``--beam`` and
    costs nothing more."""
    longest = args.max_len or cfg.max_len        # the output's length: the model's, by default
    limits.check_fits("beam search", {
        "--beam": (args.beam, range(1, args.beam + 1)),
        "--batch-size": (args.batch_size, range(1, args.batch_size + 1)),
        "--max-len": (longest, range(1, longest + 1))},
        lambda v: decoding_estimate(params, cfg, v["--beam"] * v["--batch-size"],
                                    v["--max-len"]))


def run(args: argparse.Namespace, stdin: BinaryIO, stdout: TextIO) -> int:
    """Translate the input to ``stdout`` as it goes, a block of lines at a time: a signal stops
    it between blocks' lines, and what was printed stays (whole lines, whole n-best groups)."""
    select_backend(args.backend, "numpy")
    params, cfg, vocab = load_translators([args.checkpoint, *args.ensemble])
    if args.max_len is not None and not 1 <= args.max_len <= cfg.max_len:
        raise TranslateError(f"--max-len must be between 1 and the model's max_len "
                             f"({cfg.max_len}), got {args.max_len}")
    check_sizes(args, params, cfg)
    if args.input is None and stdin.isatty():       # else it would wait there in silence
        print("note: reading sentences from the terminal, one per line, until Ctrl-D; or give "
              "them with --input FILE or through a pipe", file=sys.stderr, flush=True)
    source = InputLines(args.input, stdin)
    done = 0
    for lines in chunks(source, 16 * args.batch_size):
        results = translate_lines(params, cfg, vocab, lines, beam=args.beam,
                                  alpha=args.lenpen, nbest=args.nbest or 1,
                                  batch_size=args.batch_size, max_len=args.max_len,
                                  first_line=done + 1, lenpen_form=args.lenpen_form,
                                  stopping=args.stopping)
        with interrupts_deferred():
            for out in format_translations(results, done, args.nbest is not None):
                stdout.write(out + "\n")
            stdout.flush()
        done += len(lines)
    if source.warning():
        warn(source.warning())
    return 0


def main(argv: list[str] | None = None, stdin: BinaryIO | None = None,
         stdout: TextIO | None = None) -> int:
    args = parse_args(argv)
    return report_errors(lambda: run(args, stdin if stdin is not None else sys.stdin.buffer,
                                     stdout if stdout is not None else sys.stdout),
                         sizes="--batch-size or --beam")


if __name__ == "__main__":
    sys.exit(main())
