"""``python -m minitfm.gradcheck [ONLY]``: every gradient check of the table, or those whose name
contains ONLY, as a table; exit status 1 if one fails."""

from __future__ import annotations

import argparse
import math
import sys

from minitfm import backend, gradcheck
from minitfm.cli import exits, options
from minitfm.cli.placing import placement_defaults, select_backend
from minitfm.cli.reporting import report_errors
from minitfm.cli.exits import UsageError
from minitfm.gradcheck.cases import CASES, MODEL_CASES
from minitfm.gradcheck.check import STEP, TOLERANCE, check_case
from minitfm.cli.argtypes import Parser, integer, number


def main(argv=None) -> int:
    args = parse_args(argv)
    return report_errors(lambda: run(args))


def parse_args(argv) -> argparse.Namespace:
    parser = Parser(prog="python -m minitfm.gradcheck",
                    description=gradcheck.__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("only", nargs="?", default="", help="check only cases whose name contains this")
    parser.add_argument("--seed", type=integer(0), default=0, help="seeds the inputs (default 0)")
    parser.add_argument("--tolerance", type=number(0, low_open=True), default=TOLERANCE,
                        help=f"the largest relative error that passes (default {TOLERANCE:g})")
    parser.add_argument("--directions", type=integer(1), metavar="N",
                        help="check each array along N random directions, four evaluations a "
                             "direction, instead of element by element (a fraction of the cost: "
                             "a quick check on a slow device)")
    options.add(parser, "backend", defaults=placement_defaults("numpy", None))
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    """The checks as ``args`` say: 0 when all pass, 1 (a run-time failure) when one fails."""
    select_backend(args.backend, "numpy")

    rows = [c for c in CASES + MODEL_CASES if args.only.lower() in c.name.lower()]
    if not rows:
        raise UsageError(f"no check matches {args.only!r}")
    width = max(len(c.name) for c in rows)
    along = (f" along {args.directions} random direction{'s' if args.directions > 1 else ''} "
             f"of each array" if args.directions else "")
    print(f"backend {backend.name}, float64 five-point central differences (h={STEP:g}){along}, "
          f"tolerance {args.tolerance:g}\n")
    print(f"{'layer':<{width}}  {'worst relative error':>20}  {'worst input':<14} result")
    failed = 0
    for case in rows:
        errors = check_case(case, args.seed, directions=args.directions)
        worst = max(errors, key=errors.get)
        ok = errors[worst] <= args.tolerance and all(math.isfinite(e) for e in errors.values())
        failed += not ok
        result = "pass" if ok else "FAIL"
        print(f"{case.name:<{width}}  {errors[worst]:>20.2e}  {worst:<14} {result}")
    print(f"\n{len(rows) - failed} passed, {failed} failed")
    return exits.FAILED if failed else exits.DONE


if __name__ == "__main__":
    sys.exit(main())
