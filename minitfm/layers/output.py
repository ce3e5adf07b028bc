"""The output layer of both models: the projection tied to the token embedding, then the
label-smoothed cross-entropy (paper, sections 3.4 and 5.4), over chunks of rows.

Forward, for the states h (N, d) at the positions that have a target, and the embedding E (V, d)
    z = h E^T                       linear.py with w = E^T: (N, V) logits
    loss_sum, nll_sum = loss(z)     loss.py, against targets (N,)
Backward, with dloss the scale of the loss (1 / normaliser)
    dz = loss'(dloss)               (N, V)
    dh = dz E,   dE = dz^T h        linear.py's backward with w = E^T

The logits are the largest arrays of a training step, (N, V). The loss is the last layer, so its
backward can run right after its forward: ``forward_backward`` computes the logits of one chunk
of rows, its loss and (when ``dloss`` is given) its gradients, then drops them; memory holds one
(rows, V) chunk instead of (N, V). This is why this layer has one function for both passes instead
of ``forward`` and ``backward`` (the contract in layers/__init__.py names it).

Parameters: "table" (V, d), the token embedding (the model adds this use's gradient to the
embedding's other uses).
"""

from __future__ import annotations

from minitfm import backend
from minitfm.layers import linear, loss

LOGIT_CHUNK = 1 << 24    # logits computed at once, in elements (64 MiB in float32)


def logits(h, p):
    """The projection alone, for decoding: h (..., d) -> (..., V)."""
    return project(h, p["table"].T)


def project(h, w):
    """h (..., d) @ w (d, V), the table's transpose or a contiguous copy of it kept for many
    decoding steps."""
    return h @ w


def forward_backward(h, p, targets, smoothing, dloss=None, out=None, loss_scale=None):
    """h (N, d), targets (N,). Return ``((loss_sum, nll_sum), dh (N, d), {"table": dE})``;
    ``dh`` and the gradients are None without ``dloss``. With ``out``, dE is written into
    ``out["table"]`` (overwriting it). ``loss_scale``: a 0-d array on the device that multiplies
    ``dloss`` (mixed precision's loss scale; the losses returned are not scaled)."""
    xp = backend.xp
    table = p["table"]
    n, v = h.shape[0], table.shape[0]
    chunk = max(1, LOGIT_CHUNK // v)
    loss_sum = nll_sum = 0.0
    dh = dtable = None
    if dloss is not None:
        dh = xp.empty_like(h)
        dtable = xp.empty_like(table) if out is None else out["table"]       # (V, d)
    for start in range(0, n, chunk):
        part = slice(start, start + chunk)
        z, c_out = linear.forward(h[part], {"w": table.T})                   # (rows, V)
        (l_sum, n_sum), dz = loss.forward_backward(z, targets[part], smoothing, dloss,
                                                   loss_scale=loss_scale)
        loss_sum, nll_sum = loss_sum + l_sum, nll_sum + n_sum
        if dloss is None:
            continue
        if start == 0:                  # the first chunk writes dtable^T, the others add to it
            dh[part], _ = linear.backward(dz, c_out, {"w": dtable.T})
        else:
            dh[part], g = linear.backward(dz, c_out)
            dtable += g["w"].T
    return (loss_sum, nll_sum), dh, None if dloss is None else {"table": dtable}
