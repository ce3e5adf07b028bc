"""The fast paths of the label-smoothed loss (``minitfm/layers/loss.py``), chosen per call by
:mod:`minitfm.speed.policy`; the plain functions are their twins.

Fused (``--kernels fused``, on CuPy) ``forward_backward`` is one kernel, a block of threads per
row: the row's max, sums, loss and negative log-likelihood, and its gradient written over the
logits; the per-row results are then summed. Its twin is ``forward`` then ``backward``. On NumPy
(``--kernels fused``, the default there) ``forward_backward`` runs ``forward`` and ``backward``
on blocks of rows on the worker's threads (:mod:`minitfm.speed.rows`), each block's logits in
cache from the max to the gradient: bit for bit the plain code. Where Numba is installed, a block
is NumPy's row max and exp between two compiled loops (``shift_loop``, ``finish_loop``: the
kernel's steps, a row at a time), three passes over the block where the plain lines make seven;
the sums of a row then add in another order (float32 rounding apart). NumPy keeps the max and the
exp: Numba's are not vectorised.
"""

from __future__ import annotations

from minitfm import backend
from minitfm.layers import loss as loss_layer
from minitfm.speed import compiled, fused, policy, rows


@policy.fast_path(loss_layer.forward_backward)
def choose_forward_backward(logits, targets, smoothing, dloss=None, pad_id=None, loss_scale=None):
    """One fused kernel on CuPy; on NumPy compiled loops a block of rows, or a row pass over large
    arrays (--kernels fused)."""
    if fused.active(logits):
        return fused_forward_backward
    if rows.active(logits) or rows.compiled(logits):
        return rows_forward_backward
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
    (loss, nll), cache = loss_layer.row_losses(z, targets, float(smoothing),
                                               None if pad_id < 0 else int(pad_id))
    sums[:int(n)], sums[int(n):] = loss, nll
    if grad:
        loss_layer.backward(float(dloss) * loss_scale[0] if scaled else float(dloss), cache)


KERNEL = fused.Kernel("smoothed_loss", SOURCE, _twin)


def fused_forward_backward(logits, targets, smoothing, dloss=None, pad_id=None,
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

def rows_forward_backward(logits, targets, smoothing, dloss=None, pad_id=None, loss_scale=None):
    """``forward_backward`` on blocks of rows, on the worker's threads: the plain per-row
    losses and gradients of each block, then the sums of the per-row losses over all rows, as
    ``forward`` sums them."""
    xp = backend.xp
    weight = None if dloss is None else dloss if loss_scale is None else dloss * loss_scale
    if rows.compiled(logits) and logits.flags.c_contiguous:
        return loops_forward_backward(logits, targets, smoothing, weight, pad_id)

    def block(part):
        (loss, nll), cache = loss_layer.row_losses(logits[part], targets[part], smoothing, pad_id)
        if weight is not None:
            loss_layer.backward(weight, cache)             # over this block's rows of the logits
        return loss, nll

    n, v = logits.shape
    done = rows.map_rows(block, n, v * logits.itemsize)
    loss, nll = (xp.concatenate([part[i] for part in done]) for i in (0, 1))       # (N,)
    return (loss.sum(), nll.sum()), None if dloss is None else logits


def loops_forward_backward(logits, targets, smoothing, weight, pad_id):
    """``rows_forward_backward`` with the compiled loops below on each block."""
    xp, (n, v) = backend.xp, logits.shape
    targets = xp.ascontiguousarray(targets, dtype=xp.int64)
    z_y, sum_z, loss, nll = (xp.empty(n, dtype=logits.dtype) for _ in range(4))
    f32 = compiled.float32
    numbers = (f32(smoothing), f32(smoothing / (v - 1)), -1 if pad_id is None else int(pad_id),
               f32(0.0 if weight is None else weight), weight is not None)

    def block(part):
        z = logits[part]
        shift_loop(z, z.max(axis=1), targets[part], z_y[part], sum_z[part])
        xp.exp(z, out=z)
        finish_loop(z, targets[part], z_y[part], sum_z[part], *numbers, loss[part], nll[part])

    rows.map_rows(block, n, v * logits.itemsize)
    return (loss.sum(), nll.sum()), None if weight is None else logits


@compiled.kernel
def shift_loop(z, top, targets, z_y, sum_z):
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
def finish_loop(e, targets, z_y, sum_z, smoothing, off, pad_id, weight, grad, loss, nll):
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
