"""``python -m minitfm.kernelcheck``: every fused kernel against its plain twin (see the package)."""

import sys

from minitfm.kernelcheck import main

sys.exit(main())
