"""The command line of :mod:`minitfm.export`; ``python -m minitfm.export --help``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from minitfm.cli import limits, options
from minitfm.cli.argtypes import Parser, positive_int
from minitfm.cli.reporting import report_errors
from minitfm.export import source
from minitfm.export.source import ExportError

EXAMPLES = """examples:
  python -m minitfm.export run/checkpoint_00010000.npz --to ctranslate2 --out model-ct2
  python -m minitfm.export model.npz --to ctranslate2 --lenpen-form power --lenpen 1 --out model-ct2
  python -m minitfm.export model.npz --to ctranslate2 --quantization int8 --out model-ct2-int8
  python -m minitfm.export model.npz --to safetensors --out model.safetensors
  python -m minitfm.export model.safetensors --from safetensors --out model.npz
"""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = Parser(
        prog="python -m minitfm.export", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Export a minitfm checkpoint to CTranslate2 or safetensors, or import a "
                    "safetensors file back into a checkpoint (weights only).")
    p.add_argument("input", help="a minitfm checkpoint (.npz), or with --from safetensors a "
                                 ".safetensors file written by this command")
    direction = p.add_mutually_exclusive_group(required=True)
    direction.add_argument("--to", choices=("ctranslate2", "safetensors"))
    direction.add_argument("--from", dest="source", choices=("safetensors",),
                           help="import: write the model of INPUT as a minitfm checkpoint")
    p.add_argument("--out", required=True, help="the model directory (ctranslate2) or file "
                                                "(safetensors, or .npz with --from)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    ct2 = p.add_argument_group("ctranslate2")
    ct2.add_argument("--quantization", help="weight type: int8, int8_float32, int16 (CPU), "
                     "float16, int8_float16, bfloat16 (GPU); default float32")
    search = p.add_argument_group(
        "search", "minitfm's beam search settings, written into decoding.json as the "
                  "CTranslate2 call that searches alike (a warning where none does)")
    options.add_search_options(search)
    search.add_argument("--max-len", type=positive_int,
                        help="most output tokens (default: the model's max_len)")
    return p.parse_args(argv)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def check_positions(loaded: source.Loaded) -> None:
    """Refuse, before it is computed, a sinusoid table (``max_len`` x ``d_model``, which
    CTranslate2 takes whole) that cannot be held in memory (:func:`limits.check_positions`); a
    learned table is loaded already."""
    cfg = loaded.config
    if getattr(cfg, "learned_positions", False):
        return
    try:
        limits.check_positions(cfg, f"the model's position table (max_len {cfg.max_len} x "
                                    f"d_model {cfg.d_model}), which CTranslate2 takes whole,",
                               "max_len")
    except limits.TooLarge as exc:
        largest = exc.largest.get("max_len")
        most = f", {largest} at most here" if largest else ""
        raise ExportError(f"{exc}. max_len is the longest sentence the model reads, in "
                          f"positions, fixed when it was trained: export a model trained with a "
                          f"smaller --max-len{most} (train_wmt.py; 1024 by default)") from exc


def run(args: argparse.Namespace) -> int:
    if args.source == "safetensors":
        from minitfm.export import safetensors
        if os.path.lexists(args.out) and not args.force:
            raise ExportError(f"{args.out} exists already: choose another output or pass "
                              f"--force to replace it")
        loaded = safetensors.import_file(args.input, args.out)
        print(f"wrote {args.out}: {loaded.kind} model, step {loaded.step}, weights only (it "
              f"translates, samples and starts fine-tuning; resuming needs the optimizer state)")
        return 0
    loaded = source.read_checkpoint(args.input)
    if args.to == "safetensors":
        from minitfm.export import safetensors
        with source.output_file(args.out, args.force) as tmp:
            safetensors.export(loaded, tmp)
        print(f"wrote {args.out}: {len(loaded.params)} tensors, {loaded.kind} model")
        return 0
    from minitfm.export import ctranslate2
    check_positions(loaded)
    with source.output_directory(args.out, args.force) as tmp:
        settings = ctranslate2.export(loaded, tmp, quantization=args.quantization,
                                      beam=args.beam, alpha=args.lenpen, max_len=args.max_len,
                                      lenpen_form=args.lenpen_form, stopping=args.stopping,
                                      warn=_warn)
    kind = "ctranslate2.Translator" if settings["method"] == "translate_batch" \
        else "ctranslate2.Generator"
    print(f"wrote {args.out} ({settings['quantization']}); decode as minitfm does with\n"
          f"  {kind}({args.out!r}).{ctranslate2.call_example(settings)}\n"
          f"(recorded in {os.path.join(args.out, ctranslate2.DECODING_FILE)})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return report_errors(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
