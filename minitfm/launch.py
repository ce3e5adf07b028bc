"""``python -m minitfm.launch``: the command; its code is in :mod:`minitfm.cli.launch`."""

from minitfm.cli.launch import main

if __name__ == "__main__":
    raise SystemExit(main())
