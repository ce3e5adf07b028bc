"""minitfm: the Transformer of "Attention Is All You Need", from scratch on NumPy/CuPy arrays."""

__version__ = "0.1.0"
