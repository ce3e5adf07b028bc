"""One file per layer: each exposes ``forward(...) -> (out, cache)`` and
``backward(dout, cache) -> (dinput(s), grads)``, with the math and the derivation of the backward
pass in its docstring."""
