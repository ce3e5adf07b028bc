"""``python -m minitfm.translate``: the command; its code is in :mod:`minitfm.cli.translate`."""

from minitfm.cli.translate import main

if __name__ == "__main__":
    raise SystemExit(main())
