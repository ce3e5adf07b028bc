"""Label-smoothed cross-entropy, fused with its log-softmax (paper, section 5.4).

For one row of logits z (V,) with target y and smoothing eps, the smoothed target distribution
puts 1 - eps on y and spreads eps evenly over the other V - 1 classes:
    q_y = 1 - eps,    q_j = eps / (V - 1) for j != y
    log p = z - logsumexp(z)
    loss  = -sum_j q_j log p_j
          = -(1 - eps) log p_y - eps / (V - 1) * (sum_j log p_j - log p_y)
The plain negative log-likelihood -log p_y is reported beside it (perplexity = exp(mean nll)).

Backward: because sum_j q_j = 1,
    dloss/dz_j = sum_k q_k (p_j - [j = k]) = p_j - q_j
so the gradient is the softmax minus the smoothed target: no log-softmax Jacobian is ever formed.
Rows whose target is the padding id contribute nothing: zero loss and zero gradient.

The forward pass turns the logits buffer into exp(z - max(z)) in place and keeps it with the
row normalisers 1 / sum(exp); the backward pass turns that into the gradient in place, applying
the normalisation and dloss in one multiplication: a (N, V) array is allocated once, and swept as
few times as the math allows (it is the largest array of a training step). No parameters.

``forward_backward`` is the two in one call, as the output layer uses them. Fused (``--kernels
fused``, on CuPy) it is one kernel, a block of threads per row: the row's max, sums, loss and
negative log-likelihood, and its gradient written over the logits; the per-row results are then
summed. Its twin is ``forward`` then ``backward``. On NumPy (``--kernels fused``, the default
there) ``forward_backward`` runs ``forward`` and ``backward`` on blocks of rows on the worker's
threads (:mod:`minitfm.rows`), each block's logits in cache from the max to the gradient: bit
for bit the plain code. Where Numba is installed, a block is NumPy's row max and exp between
two compiled loops (``shift_rows``, ``finish_rows``: the kernel's steps, a row at a time), three
passes over the block where the plain lines make seven; the sums of a row then add in another
order (float32 rounding apart). NumPy keeps the max and the exp: Numba's are not vectorised.
"""

from __future__ import annotations

from typing import NamedTuple

from minitfm import backend, compiled, fused, paths, rows


class Cache(NamedTuple):
    e: object               # (N, V) exp(z - max z), over the logits buffer
    inv_total: object       # (N,) 1 / sum exp(z - max z)
    targets: object         # (N,) int
    smoothing: float
    keep: object            # (N,) 1.0 on non-padding rows, 0.0 on padding; None without pad_id


def forward(logits, targets, smoothing, pad_id=None):
    """logits (N, V) float, targets (N,) int. Return ``((loss_sum, nll_sum), cache)``.

    ``loss_sum`` and ``nll_sum`` are 0-d arrays summed over the non-padding rows. ``logits`` is
    overwritten (it becomes exp(logits - max), kept in the cache).
    """
    (loss, nll), cache = _row_losses(logits, targets, smoothing, pad_id)
    return (loss.sum(), nll.sum()), cache


def _row_losses(logits, targets, smoothing, pad_id):
    """``forward`` before its sums: ``((loss, nll), cache)``, loss and nll (N,) per row."""
    xp = backend.xp
    n, v = logits.shape
    z = logits
    z -= z.max(axis=1, keepdims=True)                           # stable: max(z) = 0
    z_y = z[xp.arange(n), targets]                              # (N,)
    sum_z = z.sum(axis=1) if smoothing else None                # (N,), only smoothing needs it
    e = xp.exp(z, out=z)                                        # (N, V) unnormalised softmax
    total = e.sum(axis=1)                                       # (N,)
    lse = xp.log(total)                                         # logsumexp of the shifted z
    logp_y = z_y - lse
    nll = -logp_y
    loss = (1.0 - smoothing) * nll
    if smoothing:
        off = smoothing / (v - 1)
        loss -= off * ((sum_z - v * lse) - logp_y)              # sum_{j != y} log p_j
    keep = None
    if pad_id is not None:
        keep = (targets != pad_id).astype(logits.dtype)         # (N,)
        loss = loss * keep
        nll = nll * keep
    return (loss, nll), Cache(e, 1.0 / total, targets, smoothing, keep)


def backward(dloss, cache: Cache):
    """Return ``(dlogits, {})``: dlogits = dloss * (p - q) (N, V), in place over the cached exp."""
    e, inv_total, targets, smoothing, keep = (cache.e, cache.inv_total, cache.targets,
                                              cache.smoothing, cache.keep)
    xp = backend.xp
    n, v = e.shape
    off = smoothing / (v - 1)
    weight = dloss if keep is None else dloss * keep            # scalar, or (N,): 0 on padding rows
    weight_col = weight if keep is None else weight[:, None]
    dz = e
    dz *= inv_total[:, None] * weight_col                       # weight * p
    if off:
        dz -= off * weight_col                                  # weight * (p - q) off the target ...
    dz[xp.arange(n), targets] -= (1.0 - smoothing - off) * weight   # ... and on it
    return dz, {}


@paths.fast
def forward_backward(logits, targets, smoothing, dloss=None, pad_id=None, loss_scale=None):
    """``forward``, then with ``dloss`` ``backward``: ``((loss_sum, nll_sum), dlogits)`` (dlogits
    None without ``dloss``), the gradient over the logits buffer. ``loss_scale``: a 0-d device
    array multiplying ``dloss`` (mixed precision's loss scale)."""
    sums, cache = forward(logits, targets, smoothing, pad_id)
    if dloss is None:
        return sums, None
    return sums, backward(dloss if loss_scale is None else dloss * loss_scale, cache)[0]


@forward_backward.chooser
def _forward_backward_path(logits, targets, smoothing, dloss=None, pad_id=None, loss_scale=None):
    if fused.active(logits):
        return _fused_forward_backward
    if rows.active(logits) or rows.compiled(logits):
        return _rows_forward_backward
    return None


# ---- fused: forward and backward in one kernel ------------------------------------------------

SOURCE = fused.BLOCK_REDUCE + r"""
// a block per row of z (N, V): loss and nll of the row into sums[row] and sums[N + row]; with
// `grad`, dz = weight * (softmax(z) - q) over z, weight = dloss (0 on a padding row)
extern "C" __global__ void smoothed_loss(float* z, const long long* targets, float* sums,
        long long n, int v, float smoothing, float off, long long pad_id, float dloss, int grad,
        const float* loss_scale, int scaled) {
    __shared__ float scratch[32];
    long long row = (long long)blockIdx.x * v;
    long long y = targets[blockIdx.x];
    float top = __int_as_float(0xff800000);
    for (int j = threadIdx.x; j < v; j += blockDim.x) top = fmaxf(top, z[row + j]);
    top = block_max(top, scratch);
    float z_y = z[row + y] - top;                         // read before the row is overwritten
    __syncthreads();
    float total = 0.0f, sum_z = 0.0f;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float shifted = z[row + j] - top;                 // max(z) = 0
        sum_z += shifted;
        float e = expf(shifted);
        z[row + j] = e;
        total += e;
    }
    total = block_sum(total, scratch);
    sum_z = block_sum(sum_z, scratch);
    float keep = (pad_id >= 0 && y == pad_id) ? 0.0f : 1.0f;
    float lse = logf(total), logp_y = z_y - lse;
    if (threadIdx.x == 0) {
        float nll = -logp_y, loss = (1.0f - smoothing) * nll;
        if (smoothing != 0.0f) loss -= off * ((sum_z - v * lse) - logp_y);
        sums[blockIdx.x] = loss * keep;
        sums[n + blockIdx.x] = nll * keep;
    }
    if (!grad) return;
    if (scaled) dloss = dloss * loss_scale[0];
    float weight = dloss * keep, c = (1.0f / total) * weight;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float d = z[row + j] * c - off * weight;
        if (j == y) d -= (1.0f - smoothing - off) * weight;
        z[row + j] = d;
    }
}
"""


def _twin(z, targets, sums, n, v, smoothing, off, pad_id, dloss, grad, loss_scale, scaled):
    (loss, nll), cache = _row_losses(z, targets, float(smoothing),
                                     None if pad_id < 0 else int(pad_id))
    sums[:int(n)], sums[int(n):] = loss, nll
    if grad:
        backward(float(dloss) * loss_scale[0] if scaled else float(dloss), cache)


KERNEL = fused.Kernel("smoothed_loss", SOURCE, _twin)


def _fused_forward_backward(logits, targets, smoothing, dloss=None, pad_id=None,
                            loss_scale=None):
    xp = backend.xp
    n, v = logits.shape
    sums = xp.empty(2 * n, dtype=logits.dtype)
    scale = sums if loss_scale is None else loss_scale.reshape(1)     # sums: not read
    KERNEL((n,), (logits, xp.ascontiguousarray(targets, dtype=xp.int64), sums, fused.i64(n),
                  fused.i32(v), fused.f32(smoothing), fused.f32(smoothing / (v - 1)),
                  fused.i64(-1 if pad_id is None else pad_id),
                  fused.f32(0.0 if dloss is None else dloss), fused.i32(dloss is not None),
                  scale, fused.i32(loss_scale is not None)))
    total = sums.reshape(2, n).sum(axis=1)                                   # (2,)
    return (total[0], total[1]), None if dloss is None else logits


# ---- row passes (CPU) -------------------------------------------------------------------------

def _rows_forward_backward(logits, targets, smoothing, dloss=None, pad_id=None, loss_scale=None):
    """``forward_backward`` on blocks of rows, on the worker's threads: the plain per-row
    losses and gradients of each block, then the sums of the per-row losses over all rows, as
    ``forward`` sums them."""
    xp = backend.xp
    weight = None if dloss is None else dloss if loss_scale is None else dloss * loss_scale
    if rows.compiled(logits) and logits.flags.c_contiguous:
        return _compiled_forward_backward(logits, targets, smoothing, weight, pad_id)

    def block(part):
        (loss, nll), cache = _row_losses(logits[part], targets[part], smoothing, pad_id)
        if weight is not None:
            backward(weight, cache)             # over this block's rows of the logits
        return loss, nll

    n, v = logits.shape
    done = rows.map_rows(block, n, v * logits.itemsize)
    loss, nll = (xp.concatenate([part[i] for part in done]) for i in (0, 1))       # (N,)
    return (loss.sum(), nll.sum()), None if dloss is None else logits


def _compiled_forward_backward(logits, targets, smoothing, weight, pad_id):
    """``_rows_forward_backward`` with the compiled loops below on each block."""
    xp, (n, v) = backend.xp, logits.shape
    targets = xp.ascontiguousarray(targets, dtype=xp.int64)
    z_y, sum_z, loss, nll = (xp.empty(n, dtype=logits.dtype) for _ in range(4))
    f32 = compiled.float32
    numbers = (f32(smoothing), f32(smoothing / (v - 1)), -1 if pad_id is None else int(pad_id),
               f32(0.0 if weight is None else weight), weight is not None)

    def block(part):
        z = logits[part]
        shift_rows(z, z.max(axis=1), targets[part], z_y[part], sum_z[part])
        xp.exp(z, out=z)
        finish_rows(z, targets[part], z_y[part], sum_z[part], *numbers, loss[part], nll[part])

    rows.map_rows(block, n, v * logits.itemsize)
    return (loss.sum(), nll.sum()), None if weight is None else logits


@compiled.kernel
def shift_rows(z, top, targets, z_y, sum_z):
    """z -= its row's max ``top``, in place over rows (n, V); the row's shifted target logit
    into z_y, its sum into sum_z."""
    n, v = z.shape
    for r in range(n):
        total = compiled.float32(0.0)
        for j in range(v):
            shifted = z[r, j] - top[r]
            z[r, j] = shifted
            total += shifted
        sum_z[r] = total
        z_y[r] = z[r, targets[r]]


@compiled.kernel
def finish_rows(e, targets, z_y, sum_z, smoothing, off, pad_id, weight, grad, loss, nll):
    """After the exp, e (n, V) = exp(z - max): each row's loss and nll (``_row_losses``' lines,
    0 where the target is ``pad_id``), and with ``grad`` the gradient over e in place,
    weight * (softmax - q) (``backward``'s lines)."""
    n, v = e.shape
    one, size = compiled.float32(1.0), compiled.float32(v)
    for r in range(n):
        total = compiled.float32(0.0)
        for j in range(v):
            total += e[r, j]
        keep = compiled.float32(0.0) if targets[r] == pad_id else one
        lse = compiled.log(total)                       # logsumexp of the shifted z
        logp_y = z_y[r] - lse
        row_loss = (one - smoothing) * -logp_y
        if smoothing != 0:
            row_loss -= off * ((sum_z[r] - size * lse) - logp_y)    # sum_{j != y} log p_j
        loss[r], nll[r] = row_loss * keep, -logp_y * keep
        if grad:
            w = weight * keep
            p_scale, q_off = (one / total) * w, off * w
            for j in range(v):
                e[r, j] = e[r, j] * p_scale - q_off             # weight * (p - q) off the target
            e[r, targets[r]] -= (one - smoothing - off) * w     # ... and on it
