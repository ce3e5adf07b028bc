"""Train a Transformer translation model and score it with sacreBLEU: the paper's recipe end to end.

The command lives in minitfm/commands/train_wmt.py (``python train_wmt.py --help`` for its
options); installed, it is also ``minitfm-train-wmt``.
"""

import sys

from minitfm.commands import train_wmt

if __name__ == "__main__":
    sys.exit(train_wmt.main())
