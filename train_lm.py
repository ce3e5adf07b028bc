"""Train a decoder-only language model on a text file, and sample from it.

The command lives in minitfm/commands/train_lm.py (``python train_lm.py --help`` for its
options); installed, it is also ``minitfm-train-lm``.
"""

import sys

from minitfm.commands import train_lm

if __name__ == "__main__":
    sys.exit(train_lm.main())
