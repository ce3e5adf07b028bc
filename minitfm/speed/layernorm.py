"""The fast paths of layer normalization (``minitfm/layers/layernorm.py``), chosen per call by
:mod:`minitfm.speed.policy`; the plain functions are their twins.

Fused (``--kernels fused``, on CuPy): the forward pass is one kernel, a block of threads per row
(the sums of the mean and the variance reduced in the block, rstd as sqrt(D / (sum (x - mu)^2 +
D eps)), one division fewer than the plain code's 1 / sqrt(var + eps): equal up to float32
rounding); the backward pass two: dx a block per row, dgamma and dbeta a column sum over the
rows. Under mixed precision the forward kernel also writes y in float16, for the next layer's
product.

Row passes (on NumPy, ``--kernels fused``, the default there: :mod:`minitfm.speed.rows`): blocks
of rows on the worker's threads, each block in cache through the whole pass. Where Numba is
installed, a block is one call of a compiled loop (``forward_loop``, ``backward_loop`` below,
:mod:`minitfm.speed.compiled`): a row's sums in another order, so equal to the plain code up to
float32 rounding. Without it, the plain code runs on the block: the forward pass and dx bit for
bit the plain ones. dgamma and dbeta, sums over the rows, add the blocks' partial sums (equal to
float32 rounding).
"""

from __future__ import annotations

from minitfm import backend
from minitfm.layers import layernorm
from minitfm.speed import compiled, fused, mixed, policy, rows


# ---- the fast paths' choice -------------------------------------------------------------------

@policy.fast_path(layernorm.forward)
def choose_forward(x, p, eps=layernorm.EPS):
    """One fused kernel on CuPy; on NumPy a compiled loop a block of rows, or a row pass over
    large arrays (--kernels fused)."""
    if fused.active(x, p["gamma"], p["beta"]):
        return fused_forward
    if rows.compiled(x, p["gamma"], p["beta"]) or (
            rows.active(x) and p["gamma"].dtype == p["beta"].dtype == x.dtype):
        return rows_forward
    return None


@policy.fast_path(layernorm.backward)
def choose_backward(dy, cache: layernorm.Cache, out=None):
    """Two fused kernels on CuPy; on NumPy a compiled loop a block of rows, or a row pass over
    large arrays (--kernels fused)."""
    if fused.active(dy, cache.xhat):
        return fused_backward
    if rows.compiled(dy, cache.xhat, cache.gamma) or rows.active(dy):
        return rows_backward
    return None


# ---- fused ------------------------------------------------------------------------------------

FORWARD_SOURCE = fused.BLOCK_REDUCE + fused.HALF_CONVERSIONS + r"""
extern "C" __global__ void layernorm_forward(const float* x, const float* gamma,
        const float* beta, float* y, float* xhat, float* rstd, int d, float d_eps,
        half_bits* y16, int half_out) {
    __shared__ float scratch[32];
    long long row = (long long)blockIdx.x * d;
    float s = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) s += x[row + c];
    float mu = block_sum(s, scratch) / d;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float v = x[row + c] - mu;
        xhat[row + c] = v;
        ss += v * v;
    }
    float r = sqrtf((float)d / (block_sum(ss, scratch) + d_eps));   // 1 / sqrt(var + eps)
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float v = xhat[row + c] * r;
        xhat[row + c] = v;
        v = v * gamma[c] + beta[c];
        y[row + c] = v;
        if (half_out) y16[row + c] = float_to_half(v);
    }
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}
"""


def _forward_twin(x, gamma, beta, y, xhat, rstd, d, d_eps, y16, half_out):
    y_plain, cache = layernorm.forward(x, {"gamma": gamma, "beta": beta}, float(d_eps) / int(d))
    y[...], xhat[...], rstd[...] = y_plain, cache.xhat, cache.rstd
    if half_out:
        y16[...] = mixed.half(y_plain)


FORWARD = fused.Kernel("layernorm_forward", FORWARD_SOURCE, _forward_twin)


def fused_forward(x, p, eps=layernorm.EPS):
    xp = backend.xp
    x = xp.ascontiguousarray(x)
    d = x.shape[-1]
    y, xhat = xp.empty_like(x), xp.empty_like(x)
    rstd = xp.empty(x.shape[:-1] + (1,), dtype=x.dtype)
    half_out = mixed.enabled(x)             # the next layer's product reads y in float16
    y16 = xp.empty(x.shape, dtype=mixed.HALF) if half_out else y
    FORWARD((max(1, x.size // d),), (x, p["gamma"], p["beta"], y, xhat, rstd, fused.i32(d),
                                     fused.f32(d * eps), y16, fused.i32(half_out)))
    if half_out:
        mixed.remember(y, y16)
    return y, layernorm.Cache(xhat, rstd, p["gamma"])


BACKWARD_SOURCE = fused.BLOCK_REDUCE + r"""
extern "C" __global__ void layernorm_backward(const float* dy, const float* xhat,
        const float* rstd, const float* gamma, float* dx, int d) {
    __shared__ float scratch[32];
    long long row = (long long)blockIdx.x * d;
    float sg = 0.0f, sgx = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float g = dy[row + c] * gamma[c];                        // term 1
        sg += g;
        sgx += g * xhat[row + c];
    }
    float mean_g = block_sum(sg, scratch) / d, mean_gx = block_sum(sgx, scratch) / d;
    float r = rstd[blockIdx.x];
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float g = dy[row + c] * gamma[c] - mean_g;               // term 2
        dx[row + c] = (g - xhat[row + c] * mean_gx) * r;         // term 3, final scale
    }
}
"""


def _backward_twin(dy, xhat, rstd, gamma, dx, d):
    dx[...], _ = layernorm.backward(dy, layernorm.Cache(xhat, rstd, gamma))


BACKWARD = fused.Kernel("layernorm_backward", BACKWARD_SOURCE, _backward_twin)

PARAM_GRADS_SOURCE = r"""
// dgamma = sum_rows dy * xhat, dbeta = sum_rows dy: a block per 32 columns, 8 rows at a time,
// the 8 partial sums of each column added in a fixed order (the same on every run)
extern "C" __global__ void layernorm_param_grads(const float* dy, const float* xhat,
        float* dgamma, float* dbeta, long long rows, int d) {
    __shared__ float sg[8][33], sb[8][33];
    int c = blockIdx.x * 32 + (threadIdx.x & 31), lane = threadIdx.x >> 5;
    float a = 0.0f, b = 0.0f;
    if (c < d) {
        for (long long r = lane; r < rows; r += 8) {
            float g = dy[r * d + c];
            a += g * xhat[r * d + c];
            b += g;
        }
    }
    sg[lane][threadIdx.x & 31] = a;
    sb[lane][threadIdx.x & 31] = b;
    __syncthreads();
    if (lane == 0 && c < d) {
        for (int k = 1; k < 8; ++k) { a += sg[k][threadIdx.x]; b += sb[k][threadIdx.x]; }
        dgamma[c] = a;
        dbeta[c] = b;
    }
}
"""


def _param_grads_twin(dy, xhat, dgamma, dbeta, n_rows, d):
    d = int(d)
    dgamma[...] = backend.xp.einsum("ni,ni->i", dy.reshape(-1, d), xhat.reshape(-1, d))
    dy.reshape(-1, d).sum(axis=0, out=dbeta)


PARAM_GRADS = fused.Kernel("layernorm_param_grads", PARAM_GRADS_SOURCE, _param_grads_twin)


def fused_backward(dy, cache, out=None):
    xp = backend.xp
    dy = xp.ascontiguousarray(dy)
    d = dy.shape[-1]
    n_rows = dy.size // d
    dx = xp.empty_like(dy)
    BACKWARD((max(1, n_rows),), (dy, cache.xhat, cache.rstd, cache.gamma, dx, fused.i32(d)))
    grads = ({"gamma": xp.empty_like(cache.gamma), "beta": xp.empty_like(cache.gamma)}
             if out is None else {"gamma": out["gamma"], "beta": out["beta"]})
    PARAM_GRADS((-(-d // 32),), (dy, cache.xhat, grads["gamma"], grads["beta"],
                                 fused.i64(n_rows), fused.i32(d)))
    return dx, grads


# ---- row passes (CPU) -------------------------------------------------------------------------

def rows_forward(x, p, eps=layernorm.EPS, before=None):
    """``forward`` on blocks of rows, on the worker's threads: each block one call of
    ``forward_loop`` where the compiled loops run (:func:`minitfm.speed.rows.compiled`), else the plain
    code. ``before(rows)``: work of the caller's on those rows of x first, while the block is in
    cache (the residual connection's add)."""
    xp = backend.xp
    d = x.shape[-1]
    loop = rows.compiled(x, p["gamma"], p["beta"])
    x2 = x.reshape(-1, d)                                           # (N, D), a view
    if loop:
        x2, gamma, beta = (xp.ascontiguousarray(a) for a in (x2, p["gamma"], p["beta"]))
        d_eps = compiled.float32(d * eps)
    y, xhat = xp.empty_like(x2), xp.empty_like(x2)
    rstd = xp.empty((x2.shape[0], 1), dtype=x.dtype)

    def block(part):
        if before is not None:
            before(part)
        if loop:
            forward_loop(x2[part], gamma, beta, y[part], xhat[part], rstd[part], d_eps)
            return
        y[part], cache = layernorm.forward(x2[part], p, eps)
        xhat[part], rstd[part] = cache.xhat, cache.rstd

    rows.map_rows(block, x2.shape[0], 3 * d * x.itemsize)
    return y.reshape(x.shape), layernorm.Cache(xhat.reshape(x.shape),
                                               rstd.reshape(*x.shape[:-1], 1), p["gamma"])


def rows_backward(dy, cache: layernorm.Cache, out=None, after=None):
    """``backward`` on blocks of rows, on the worker's threads (``backward_loop`` or the plain
    code, as ``rows_forward``): dx row by row, dgamma and dbeta the sums of the blocks' partial
    sums, in block order. ``after(rows, dx)``: work of the caller's on those rows of dx, while
    the block is in cache."""
    xp = backend.xp
    d = dy.shape[-1]
    loop = rows.compiled(dy, cache.xhat, cache.gamma)
    dy2, xhat = dy.reshape(-1, d), cache.xhat.reshape(-1, d)        # (N, D)
    rstd, gamma = cache.rstd.reshape(-1, 1), cache.gamma
    if loop:
        dy2, xhat, rstd, gamma = (xp.ascontiguousarray(a) for a in (dy2, xhat, rstd, gamma))
    dx = xp.empty(dy2.shape, dtype=dy.dtype)

    def block(part):
        if loop:
            grads = {"gamma": xp.zeros_like(gamma), "beta": xp.zeros_like(gamma)}
            backward_loop(dy2[part], xhat[part], rstd[part], gamma, dx[part], grads["gamma"],
                          grads["beta"])
        else:
            dx[part], grads = layernorm.backward(dy2[part],
                                                 layernorm.Cache(xhat[part], rstd[part], gamma))
        if after is not None:
            after(part, dx[part])
        return grads

    partial = rows.map_rows(block, dy2.shape[0], 3 * d * dy.itemsize)
    grads = {}
    for name in ("gamma", "beta"):
        total = xp.empty_like(cache.gamma) if out is None else out[name]
        total[...] = partial[0][name]
        for more in partial[1:]:
            total += more[name]
        grads[name] = total
    return dx.reshape(dy.shape), grads


# ---- compiled loops (CPU, Numba: minitfm.speed.compiled) -----------------------------------------

@compiled.kernel
def forward_loop(x, gamma, beta, y, xhat, rstd, d_eps):
    """The forward pass on the rows of x (n, D), one after another: y and xhat (n, D), rstd
    (n, 1); ``d_eps`` is D * eps (float32), rstd = sqrt(D / (sum (x - mu)^2 + D eps)) as in
    the plain code."""
    n, d = x.shape
    size = compiled.float32(d)
    for r in range(n):
        total = compiled.float32(0.0)
        for c in range(d):
            total += x[r, c]
        mu = total / size
        squares = compiled.float32(0.0)
        for c in range(d):
            centred = x[r, c] - mu
            xhat[r, c] = centred
            squares += centred * centred
        scale = compiled.sqrt(size / (squares + d_eps))                # 1 / sqrt(var + eps)
        rstd[r, 0] = scale
        for c in range(d):
            normed = xhat[r, c] * scale
            xhat[r, c] = normed
            y[r, c] = normed * gamma[c] + beta[c]


@compiled.kernel
def backward_loop(dy, xhat, rstd, gamma, dx, dgamma, dbeta):
    """dx (n, D) for the rows of dy (n, D), one after another; each row's dy * xhat and dy
    added to dgamma and dbeta (D,)."""
    n, d = dy.shape
    size = compiled.float32(d)
    for r in range(n):
        sum_g = compiled.float32(0.0)
        sum_gx = compiled.float32(0.0)
        for c in range(d):
            g = dy[r, c] * gamma[c]                                 # term 1
            sum_g += g
            sum_gx += g * xhat[r, c]
            dgamma[c] += dy[r, c] * xhat[r, c]
            dbeta[c] += dy[r, c]
        mean_g, mean_gx, scale = sum_g / size, sum_gx / size, rstd[r, 0]
        for c in range(d):                                          # terms 2 and 3, the scale
            dx[r, c] = (dy[r, c] * gamma[c] - mean_g - xhat[r, c] * mean_gx) * scale
