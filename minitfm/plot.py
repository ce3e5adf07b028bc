"""``python -m minitfm.plot``: the command; its code is in :mod:`minitfm.cli.plot`."""

from minitfm.cli.plot import main

if __name__ == "__main__":
    raise SystemExit(main())
