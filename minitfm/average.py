"""``python -m minitfm.average``: the command; its code is in :mod:`minitfm.cli.average`."""

from minitfm.cli.average import main

if __name__ == "__main__":
    raise SystemExit(main())
