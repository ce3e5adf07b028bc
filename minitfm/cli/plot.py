"""Pictures of a model and a training run, as PNG files: ``python -m minitfm.plot``, over
:mod:`minitfm.plotting`.

    python -m minitfm.plot attention --checkpoint model.npz --source "A man rides a bike." \\
        [--target "Ein Mann fährt Fahrrad."] [--layer -1] [--out-dir plots]
    python -m minitfm.plot positional [--d-model 512] [--length 100] [--out pe.png]
    python -m minitfm.plot lr [--d-model 512] [--warmup 4000 8000] [--steps 100000] [--out lr.png]
    python -m minitfm.plot curves run/log.jsonl [more.jsonl ...] [--out curves.png]

- ``attention``: every head of one layer, for the encoder self-attention, the decoder
  self-attention and the encoder-decoder (cross) attention of one sentence pair, with the tokens
  on the axes (as the paper's figures 3-5). Without ``--target`` the model's own translation is
  used. Row i of a map is query position i; its entries are the softmax weights of equation (1),
  read from the forward pass's caches.
- ``positional``: the sinusoidal encoding matrix of section 3.5, positions against dimensions.
- ``lr``: the learning rate of equation (3), lrate = d_model^-0.5 * min(step^-0.5,
  step * warmup^-1.5), for each combination of ``--d-model`` and ``--warmup``.
- ``curves``: training loss, validation loss and validation metrics (BLEU, accuracy) against the
  step, from the JSON-lines log of a training run (one object per line with "step", and "loss"
  or "valid_loss" / "valid_bleu" / ...); keys that are missing are skipped, and so are lines that
  cannot be read (cut short by a crash, not JSON, without a step), each named in a warning.

matplotlib is an optional dependency (the ``plot`` extra), imported only when a picture is drawn,
with the non-interactive Agg backend.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minitfm import backend
from minitfm.cli.argtypes import Parser, integer, number, positive_int
from minitfm.cli.reporting import report_errors
from minitfm.plotting import (PlotError, attention_figures, plot_curves, plot_lr_schedule,
                              plot_positional, pyplot, read_log)

__all__ = ["main"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(prog="python -m minitfm.plot",
               description="Draw PNG pictures of a model or a training run.")
    sub = p.add_subparsers(dest="command", required=True)

    a = sub.add_parser("attention", help="attention heat-maps of every head of one layer")
    a.add_argument("--checkpoint", required=True, help="checkpoint with a vocabulary")
    a.add_argument("--source", required=True, help="source sentence")
    a.add_argument("--target", help="target sentence (default: the model's translation)")
    a.add_argument("--layer", type=integer(), default=-1, help="layer, from 0; negative from the end")
    a.add_argument("--beam", type=positive_int, default=4, help="beam size when translating")
    a.add_argument("--out-dir", default=".", help="directory for the three PNG files")
    a.add_argument("--backend", choices=["numpy", "cupy", "auto"], default=None)

    pe = sub.add_parser("positional", help="the sinusoidal positional-encoding matrix")
    pe.add_argument("--d-model", type=positive_int, default=512)
    pe.add_argument("--length", type=positive_int, default=100)
    pe.add_argument("--out", default="positional.png")

    lr = sub.add_parser("lr", help="the learning-rate schedule of equation (3)")
    lr.add_argument("--d-model", type=positive_int, nargs="+", default=[512])
    lr.add_argument("--warmup", type=positive_int, nargs="+", default=[4000])
    lr.add_argument("--steps", type=positive_int, default=100_000)
    lr.add_argument("--factor", type=number(0, low_open=True), default=1.0)
    lr.add_argument("--out", default="lr.png")

    c = sub.add_parser("curves", help="loss and validation curves from JSON-lines logs")
    c.add_argument("logs", nargs="+", help="log.jsonl files of training runs")
    c.add_argument("--out", default="curves.png")
    c.add_argument("--x", choices=("step", "minutes"), default="step",
                   help="the horizontal axis: the step, or the training minutes")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> list[str]:
    if args.command == "positional":
        return [plot_positional(args.out, args.d_model, args.length)]
    if args.command == "lr":
        return [plot_lr_schedule(args.out, args.d_model, args.warmup, args.steps, args.factor)]
    if args.command == "curves":
        logs = {}
        for path in args.logs:
            log = read_log(path)
            warning = log.warning(path)
            if warning:
                print(warning, file=sys.stderr, flush=True)
            logs[Path(path).parent.name or path] = log.records
        return [plot_curves(logs, args.out, args.x)]
    from minitfm.checkpoint import CheckpointError
    from minitfm.decoding.translation import TranslateError, load_translator
    if args.backend is not None:
        backend.use(args.backend)
    pyplot()                                        # fail before loading a model
    try:
        params, cfg, vocab = load_translator(args.checkpoint)
    except (TranslateError, CheckpointError) as exc:
        raise PlotError(str(exc)) from exc
    return attention_figures(params, cfg, vocab, args.source, args.target, args.layer,
                             args.out_dir, args.beam)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def draw() -> int:
        for path in run(args):
            print(path)
        return 0
    return report_errors(draw)


if __name__ == "__main__":
    sys.exit(main())
