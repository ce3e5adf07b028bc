"""The scaled, masked softmax of attention's scores (paper, equation 1: softmax(Q K^T / sqrt(d_k))).

Forward, for each row s of the scores (a query's S keys; T rows per batch element and head)
    z = s * c + m                    c = 1 / sqrt(d_k), m the additive mask's row (attention.py)
    P_i = exp(z_i - max z) / sum_j exp(z_j - max z)
Subtracting the row's max changes nothing in exact arithmetic (it cancels between numerator and
denominator) and keeps exp from overflowing; a masked key (m = -1e9) gets exactly 0.

Backward, dP given (m is a constant: no gradient)
    dP_j/dz_i = P_j (1[i = j] - P_i)                      the softmax's Jacobian
    dz_i = sum_j dP_j P_j (1[i = j] - P_i) = P_i (dP_i - sum_j dP_j P_j)
    ds_i = c dz_i                    attention folds 1/sqrt(d_k) in here, once for dQ and dK
Both passes work in place: the forward overwrites the scores with P, the backward dP with ds.

Fused (``--kernels fused``): on CuPy one kernel each way, a block of threads per row, twins of
the plain lines. On NumPy, where Numba is installed (:mod:`minitfm.compiled`, chosen by the row
passes: :func:`minitfm.rows.compiled`), the forward is a compiled loop for the scale, mask, max
and shift, NumPy's exp (vectorised, where Numba's is scalar code), and a second loop for the sum
and the division; the backward is one loop. A row's sums are taken in another order than
NumPy's, so they equal the plain code up to float32 rounding (the tolerance its test states).
"""

from __future__ import annotations

from minitfm import backend, compiled, fused, paths, rows


@paths.fast
def forward(s, scale, mask=None):
    """P = softmax(s * scale + mask) over the last axis, in place on the scores s; ``mask``
    broadcasts to s."""
    s *= scale
    if mask is not None:
        s += mask
    s -= s.max(axis=-1, keepdims=True)
    p = backend.xp.exp(s, out=s)
    p /= p.sum(axis=-1, keepdims=True)
    return p


@paths.fast
def backward(dp, p, scale):
    """dS = P * (dP - rowsum(dP * P)) * scale, in place on dP."""
    dp -= backend.xp.einsum("...ts,...ts->...t", dp, p)[..., None]     # rowsum(dP * P), one pass
    ds = dp
    ds *= p                                         # dS = P * (dP - rowsum(dP * P))
    ds *= scale                                     # fold 1/sqrt(d_k) in once for dQ and dK
    return ds


# ---- the fast paths' choice -------------------------------------------------------------------

def _path(fused_pass, loops_pass, s, *others):
    """The fast pass for scores s (and ``others``, the mask or P; None: no array): the CUDA
    kernel, the compiled loops (4-D arrays), or None, the plain lines (beam search's 5-D scores
    among them). A row pass asks before it splits the work (``forward.path``): on its blocks the
    layers run their plain code."""
    arrays = (s, *(a for a in others if a is not None))
    if s.ndim != 4:
        return None
    if fused.active(*arrays):
        return fused_pass
    if rows.compiled(*arrays) and all(a.ndim == 4 for a in arrays):
        return loops_pass
    return None


@forward.chooser
def _forward_path(s, scale, mask=None):
    return _path(fused_forward, loops_forward, s, mask)


@backward.chooser
def _backward_path(dp, p, scale):
    return _path(fused_backward, loops_backward, dp, p)


# ---- compiled loops (CPU, Numba: minitfm.compiled) ---------------------------------------------

def loops_forward(s, scale, mask=None):
    """``forward`` by the loops below and NumPy's exp, on 4-D float32 scores."""
    xp, f32 = backend.xp, compiled.float32
    # no mask: s stands in, never read
    m = s if mask is None else xp.broadcast_to(mask, s.shape)
    shift_rows(s, m, mask is not None, f32(scale))
    xp.exp(s, out=s)
    normalize_rows(s)
    return s


def loops_backward(dp, p, scale):
    """``backward`` by the loop below, on 4-D float32 arrays."""
    backward_rows(dp, p, compiled.float32(scale))
    return dp


@compiled.kernel
def shift_rows(s, mask, has_mask, scale):
    """z = s * scale + mask, then z - max z, a row at a time, in place on s (B, H, T, S)."""
    nb, nh, nt, ns = s.shape
    for b in range(nb):
        for h in range(nh):
            for t in range(nt):
                top = compiled.float32(-compiled.inf)
                for j in range(ns):
                    z = s[b, h, t, j] * scale
                    if has_mask:
                        z = z + mask[b, h, t, j]
                    s[b, h, t, j] = z
                    top = max(top, z)
                for j in range(ns):
                    s[b, h, t, j] = s[b, h, t, j] - top


@compiled.kernel
def normalize_rows(e):
    """P = e / rowsum(e), in place on e (B, H, T, S)."""
    nb, nh, nt, ns = e.shape
    for b in range(nb):
        for h in range(nh):
            for t in range(nt):
                total = compiled.float32(0.0)
                for j in range(ns):
                    total += e[b, h, t, j]
                for j in range(ns):
                    e[b, h, t, j] = e[b, h, t, j] / total


@compiled.kernel
def backward_rows(dp, p, scale):
    """dS = P * (dP - rowsum(dP * P)) * scale, a row at a time, in place on dP (B, H, T, S)."""
    nb, nh, nt, ns = dp.shape
    for b in range(nb):
        for h in range(nh):
            for t in range(nt):
                dot = compiled.float32(0.0)
                for j in range(ns):
                    dot += dp[b, h, t, j] * p[b, h, t, j]
                for j in range(ns):
                    dp[b, h, t, j] = (dp[b, h, t, j] - dot) * p[b, h, t, j] * scale


# ---- fused: one CUDA kernel each way ---------------------------------------------------------

FORWARD_SOURCE = fused.BLOCK_REDUCE + r"""
// scores s (rows of `cols`; row r = (b, h, t) of (B, H, T)) -> softmax(s * scale + mask), in
// place; the mask element of (b, h, t, j) is mask[b*mb + h*mh + t*mt + j*mj] (0 strides where
// it broadcasts), no mask when has_mask is 0
extern "C" __global__ void softmax_forward(float* s, const float* mask, int cols, int heads,
        int steps, long long mb, long long mh, long long mt, long long mj, int has_mask,
        float scale) {
    __shared__ float scratch[32];
    long long r = blockIdx.x, row = r * cols;
    long long m0 = (r / ((long long)heads * steps)) * mb + ((r / steps) % heads) * mh
                   + (r % steps) * mt;
    float top = __int_as_float(0xff800000);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = s[row + j] * scale;
        if (has_mask) v = v + mask[m0 + j * mj];
        s[row + j] = v;
        top = fmaxf(top, v);
    }
    top = block_max(top, scratch);
    float total = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float e = expf(s[row + j] - top);
        s[row + j] = e;
        total += e;
    }
    total = block_sum(total, scratch);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s[row + j] = s[row + j] / total;
}
"""


def _forward_twin(s, mask, cols, heads, steps, mb, mh, mt, mj, has_mask, scale):
    forward(s, float(scale), mask if has_mask else None)     # the mask broadcasts as its strides


FORWARD = fused.Kernel("softmax_forward", FORWARD_SOURCE, _forward_twin)


def fused_forward(s, scale, mask=None):
    """``forward`` as one kernel launch, on 4-D scores (B, H, T, S)."""
    xp, (b, h, t, cols) = backend.xp, s.shape
    strides = (0, 0, 0, 0)              # no mask (has_mask 0): s stands in, never read
    if mask is not None:
        mask = xp.ascontiguousarray(mask)
        strides = tuple(st // mask.dtype.itemsize for st in xp.broadcast_to(mask, s.shape).strides)
    FORWARD((b * h * t,), (s, s if mask is None else mask, fused.i32(cols), fused.i32(h),
                           fused.i32(t), *map(fused.i64, strides), fused.i32(mask is not None),
                           fused.f32(scale)))
    return s


BACKWARD_SOURCE = fused.BLOCK_REDUCE + r"""
// dS = P * (dP - rowsum(dP * P)) * scale, in place over dP, a block per row
extern "C" __global__ void softmax_backward(float* dp, const float* p, int cols, float scale) {
    __shared__ float scratch[32];
    long long row = (long long)blockIdx.x * cols;
    float dot = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) dot += dp[row + j] * p[row + j];
    dot = block_sum(dot, scratch);
    for (int j = threadIdx.x; j < cols; j += blockDim.x)
        dp[row + j] = (dp[row + j] - dot) * p[row + j] * scale;
}
"""


def _backward_twin(dp, p, cols, scale):
    backward(dp, p, float(scale))


BACKWARD = fused.Kernel("softmax_backward", BACKWARD_SOURCE, _backward_twin)


def fused_backward(dp, p, scale):
    """``backward`` as one kernel launch."""
    BACKWARD((p.size // p.shape[-1],), (dp, p, fused.i32(p.shape[-1]), fused.f32(scale)))
    return dp
