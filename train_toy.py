"""Train a small Transformer on a synthetic task (copy, reverse or sort) and report exact match.

The command lives in minitfm/commands/train_toy.py (``python train_toy.py --help`` for its
options); installed, it is also ``minitfm-train-toy``.
"""

import sys

from minitfm.commands import train_toy

if __name__ == "__main__":
    sys.exit(train_toy.main())
