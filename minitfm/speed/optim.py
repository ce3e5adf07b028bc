"""The fast paths of Adam's update over flat buffers (``minitfm/optim.py``), chosen per call by
:mod:`minitfm.speed.policy`; the plain ``flat_update`` is their twin.

Fused (``--kernels fused``, on CuPy): the Adam step is one kernel over the four buffers, the
step's coefficients computed in it (in float64, as the plain code computes them on the host); its
twin is ``optim.flat_update``. On NumPy (``--kernels fused``, the default there) the flat update
runs on blocks of the buffers on the worker's threads (:mod:`minitfm.speed.rows`), bit for bit the
plain update.
"""

from __future__ import annotations

from minitfm import optim
from minitfm.speed import fused, policy, rows


@policy.fast_path(optim.flat_update)
def choose_flat_update(p, g, m, v, decays, adam: optim.Adam, lr: float, decay: float,
                       state=None):
    """One fused kernel on CuPy; a row pass over large buffers on NumPy (--kernels fused)."""
    if fused.active(p, g, m, v):
        return fused_flat_update
    if rows.active(p, g, m, v):
        return rows_flat_update
    return None


# ---- fused ------------------------------------------------------------------------------------

ADAM_SOURCE = r"""
// AdamW over flat buffers: the operations of adam_step, one element a thread
extern "C" __global__ void adam(float* p, const float* g, float* m, float* v, const bool* decays,
        long long n, int decay, float keep, double beta1, double beta2, float eps, long long step,
        double lr, const float* scaler, int scaled) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || (scaled && scaler[3] != 0.0f)) return;       // a skipped update: no change
    double t = scaled ? fmax((double)step - scaler[2], 1.0) : (double)step;
    float b1 = (float)beta1, c1 = (float)(1.0 - beta1), b2 = (float)beta2, c2 = (float)(1.0 - beta2);
    float step_size = (float)(lr / (1.0 - pow(beta1, t))), v_scale = (float)(1.0 / sqrt(1.0 - pow(beta2, t)));
    float pi = (decay && decays[i]) ? p[i] * keep : p[i], gi = g[i];
    float mi = m[i] * b1 + gi * c1, vi = v[i] * b2 + gi * gi * c2;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - mi / (sqrtf(vi) * v_scale + eps) * step_size;
}
"""


def _adam_twin(p, g, m, v, decays, n, decay, keep, b1, b2, eps, step, lr, state, scaled):
    b1, b2, step_size, v_scale, keep = optim.coefficients(
        float(b1), float(b2), int(step), float(lr), float(keep), state if scaled else None)
    optim.flat_step(p, g, m, v, decays if decay else None, keep, b1, b2, float(eps), step_size,
                    v_scale)


ADAM = fused.Kernel("adam", ADAM_SOURCE, _adam_twin)


# ---- row passes (CPU) -------------------------------------------------------------------------

def rows_flat_step(p, g, m, v, decays, keep, b1, b2, eps: float, step_size, v_scale) -> None:
    """:func:`optim.flat_step` on blocks of the buffers, on the worker's threads.

    adam_step is a dozen passes over four buffers: over whole buffers (tens of MB) each reads back
    from memory what the last one wrote, on a block it finds it in the core's cache. Element-wise,
    on blocks set by the size alone: the plain update's bits, with any number of threads.
    """
    def block(part):
        optim.flat_step(p[part], g[part], m[part], v[part],
                        None if decays is None else decays[part],
                        keep, b1, b2, eps, step_size, v_scale)

    rows.map_rows(block, p.size, 5 * p.itemsize)    # a row: p, g, m, v and adam_step's scratch


def fused_flat_update(p, g, m, v, decays, adam: optim.Adam, lr: float, decay: float,
                      state=None) -> None:
    """``optim.flat_update`` as one kernel."""
    mask = p if decays is None else decays          # p: a stand-in the kernel never reads
    ADAM(fused.grid_for(p.size), (p, g, m, v, mask, fused.i64(p.size), fused.i32(
        mask is not p), fused.f32(1.0 - decay), fused.f64(adam.beta1),
        fused.f64(adam.beta2), fused.f32(adam.eps), fused.i64(adam.step),
        fused.f64(lr), p if state is None else state, fused.i32(state is not None)))


def rows_flat_update(p, g, m, v, decays, adam: optim.Adam, lr: float, decay: float,
                     state=None) -> None:
    """``optim.flat_update`` with :func:`rows_flat_step`."""
    b1, b2, step_size, v_scale, keep = optim.coefficients(adam.beta1, adam.beta2, adam.step, lr,
                                                          1.0 - decay, state)
    rows_flat_step(p, g, m, v, decays, keep, b1, b2, adam.eps, step_size, v_scale)
