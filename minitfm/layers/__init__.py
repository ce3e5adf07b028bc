"""One file per layer: each exposes ``forward(...) -> (out, cache)`` and
``backward(dout, cache) -> (dinput(s), grads)``, with the math and the derivation of the backward
pass in its docstring. Layers hold no state: everything the backward pass needs is in the cache.

Parameters are flat dicts with dotted names; a layer sees the slice of its own names
(``subdict(params, "enc.0.")``) and returns gradients under the same local names, which the caller
puts back under its prefix (``prefixed(grads, "enc.0.")``).
"""


def subdict(params, prefix):
    """The entries of ``params`` whose names start with ``prefix``, with the prefix removed."""
    n = len(prefix)
    return {k[n:]: v for k, v in params.items() if k.startswith(prefix)}


def prefixed(grads, prefix):
    """``grads`` with ``prefix`` put in front of every name."""
    return {prefix + k: v for k, v in grads.items()}
