"""minitfm: the Transformer of "Attention Is All You Need", from scratch on NumPy/CuPy arrays."""

from minitfm.workers import blas

__version__ = "0.1.0"

blas.apply()            # before NumPy loads OpenBLAS, which reads its settings once (blas.py)
