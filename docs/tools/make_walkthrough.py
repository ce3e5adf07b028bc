"""Write docs/walkthrough.ipynb (without outputs: the site executes it when it builds).

The notebook is kept as this script so that a change to it is a readable diff; run
``python docs/tools/make_walkthrough.py`` after editing, and commit both.
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    ("md", r"""# Walkthrough: one attention head, by hand

This notebook computes one head of scaled dot-product attention (the paper's equation 1) on tiny
arrays, then its backward pass by hand, then checks the hand-made gradients twice: against finite
differences, and against the library's own layer, `minitfm.layers.attention`. It runs in a few
seconds on a CPU, and it was executed when this site was built.

Open it yourself (`jupyter lab docs/walkthrough.ipynb`), change a number — a size, a seed, a
mask — and run it again: every check below must still hold."""),
    ("code", r"""import numpy as np

np.set_printoptions(precision=4, suppress=True)
T, S, d_k = 3, 4, 2                 # 3 queries attend over 4 keys, head size 2
rng = np.random.default_rng(0)
Q = rng.standard_normal((T, d_k))
K = rng.standard_normal((S, d_k))
V = rng.standard_normal((S, d_k))
M = np.zeros((T, S))
M[:, -1] = -1e9                     # the last key is padding: no query may look at it"""),
    ("md", r"""## Forward

$$
S = \frac{QK^{\top}}{\sqrt{d_k}} + M, \qquad P = \mathrm{softmax}_{\text{rows}}(S), \qquad O = PV .
$$

The softmax subtracts each row's maximum first: the result is the same, and $e^{x}$ never
overflows."""),
    ("code", r"""def forward(Q, K, V, M):
    scores = Q @ K.T / np.sqrt(d_k) + M              # (T, S)
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    P = e / e.sum(axis=1, keepdims=True)             # (T, S), rows sum to 1
    return P @ V, P                                  # O (T, d_k)

O, P = forward(Q, K, V, M)
print("P =\n", P)
print("O =\n", O)"""),
    ("md", r"""The padded key's column of $P$ is exactly zero: $e^{-10^9}$ underflows to 0.

## Backward, by hand

Take the scalar $\mathcal{L} = \sum_{ij} G_{ij} O_{ij}$ for a fixed random $G$, so that
$dO = G$. Then, from the [gradients page](gradients.md#layer-attention):

$$
dV = P^{\top} dO, \quad dP = dO\,V^{\top}, \quad
dS = P \odot \big(dP - \mathrm{rowsum}(dP \odot P)\big), \quad
dQ = \frac{dS\,K}{\sqrt{d_k}}, \quad dK = \frac{dS^{\top} Q}{\sqrt{d_k}} .
$$"""),
    ("code", r"""G = rng.standard_normal((T, d_k))         # dL/dO

def backward(dO, P, Q, K, V):
    dV = P.T @ dO                                         # (S, d_k)
    dP = dO @ V.T                                         # (T, S)
    dS = P * (dP - (dP * P).sum(axis=1, keepdims=True))   # the softmax's Jacobian, applied
    dQ = dS @ K / np.sqrt(d_k)                            # (T, d_k)
    dK = dS.T @ Q / np.sqrt(d_k)                          # (S, d_k)
    return dQ, dK, dV

dQ, dK, dV = backward(G, P, Q, K, V)
print("dK =\n", dK)"""),
    ("md", r"""The last row of $dK$ and of $dV$ is zero: the padded key got no weight, so it gets no
gradient.

## Check 1: finite differences

Perturb each entry of $Q$, $K$ and $V$ in turn by $\pm h$ and difference the loss (central
differences, error $O(h^2)$, in float64):"""),
    ("code", r"""def loss(Q, K, V):
    return float((forward(Q, K, V, M)[0] * G).sum())

def numerical(name, h=1e-6):
    arrays = {"Q": Q.copy(), "K": K.copy(), "V": V.copy()}
    x = arrays[name]
    grad = np.zeros_like(x)
    for i in np.ndindex(*x.shape):
        old = x[i]
        x[i] = old + h
        up = loss(**arrays)
        x[i] = old - h
        down = loss(**arrays)
        x[i] = old
        grad[i] = (up - down) / (2 * h)
    return grad

def relative_error(a, n):
    return np.linalg.norm(a - n) / max(np.linalg.norm(a), np.linalg.norm(n))

for name, analytic in [("Q", dQ), ("K", dK), ("V", dV)]:
    error = relative_error(analytic, numerical(name))
    print(f"d{name}: relative error {error:.1e}")
    assert error < 1e-7, name"""),
    ("md", r"""Errors near $10^{-10}$: the hand-made backward pass is right. To see what a wrong one looks
like, drop the softmax's second term, $-\mathrm{rowsum}(dP\odot P)$, and check again:"""),
    ("code", r"""dP = G @ V.T
wrong_dS = P * dP                          # the rowsum term forgotten
wrong_dQ = wrong_dS @ K / np.sqrt(d_k)
print(f"dQ without the rowsum term: relative error {relative_error(wrong_dQ, numerical('Q')):.1e}")"""),
    ("md", r"""## Check 2: the library's layer

`attention.sdpa_forward` and `sdpa_backward` work on batches of heads, `(B, H, T, d_k)`; one
batch element and one head are our arrays with two leading axes of size 1. Its mask is additive,
like `M`."""),
    ("code", r"""from minitfm import backend
from minitfm.layers import attention

backend.use("numpy")
lib_O, cache = attention.sdpa_forward(Q[None, None], K[None, None], V[None, None], M[None, None])
lib_dQ, lib_dK, lib_dV, grads = attention.sdpa_backward(G[None, None], cache)
for name, mine, theirs in [("O", O, lib_O), ("dQ", dQ, lib_dQ), ("dK", dK, lib_dK), ("dV", dV, lib_dV)]:
    print(f"{name}: largest difference {np.abs(mine - theirs[0, 0]).max():.1e}")
    assert np.allclose(mine, theirs[0, 0], rtol=1e-12, atol=1e-14), name"""),
    ("md", r"""The library's layer computes the same numbers. The same check, with the library's
five-point differences, on random shapes and masks, with dropout and with several heads:

```bash
python -m minitfm.gradcheck attention
```"""),
]


def main() -> None:
    cells = [new_markdown_cell(text) if kind == "md" else new_code_cell(text)
             for kind, text in CELLS]
    notebook = new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"}})
    path = Path(__file__).resolve().parent.parent / "walkthrough.ipynb"
    nbformat.write(notebook, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
