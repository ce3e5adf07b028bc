"""Every fused kernel against its plain twin, on the device: ``python -m minitfm.kernelcheck``.

Each case runs one layer (or the optimizer) twice on the same seeded inputs, with
``--kernels fused`` and with the plain array code, and compares every output: the largest
difference, relative to the largest value of the plain output, must be within the case's
tolerance. The tolerances allow for sums taken in another order (a block of threads reduces a
row in a tree, the array code from left to right) and nothing more: float32 rounding of sums of
a few thousand terms (under mixed precision, a float16 rounding that such a sum tips: 2e-3).
Dropout masks must be equal, bit for bit: the kernels draw the Philox
stream the plain code draws. Every kernel of :data:`minitfm.speed.fused.KERNELS` must have run in some
case.

On CuPy's test double (no GPU) the kernels' twins run in their place, so the comparison checks
the launches' arguments and the plumbing around them; on a GPU it checks the kernels themselves.
``pytest -m gpu`` runs it (tests/test_kernels.py) and the one-shot GPU check reports its table.

``--host`` needs no GPU: the same cases on the NumPy backend, the kernels' own CUDA source
executed on the CPU (:mod:`minitfm.cudahost`, compiled by the machine's C++ compiler), where
each launch is also checked by itself: out-of-bounds reads and writes, races, barriers that
cannot release (each a fault naming the kernel, block, thread and line), the same bits in two
orders of its threads, and its outputs against its twin's on the same arguments (float32 within
1e-5 of the largest value, float16 within 2e-3, masks and integers equal).

``--case NAME`` (repeated: several) runs those cases alone, and reports the kernels they
launched; on the host only those kernels are compiled.

``--explain`` checks nothing: it runs one training update of a small translator (every dropout
on, clipping) under ``--kernels`` and ``--precision`` as a command would choose them, and says
for each layer function with a fast path which function its calls ran, and what its chooser
reads (:func:`minitfm.speed.explain`, :mod:`minitfm.speed.policy`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import os
import sys
import time
import warnings

from minitfm import backend, cudahost, flat, gradscale, optim
from minitfm.backend import philox, products
from minitfm.cli.argtypes import Parser
from minitfm.cli.reporting import report_errors
from minitfm.speed import fused, mixed, policy, rows
from minitfm.layers import attention, dropout, feedforward, layernorm, linear, loss, residual

__all__ = ["CASES", "HOST_TOLERANCES", "compare", "prepare_host", "main"]


def _rng(seed: int) -> philox.Philox:
    """The dropout generator of a case: the CuPy backend's ``backend.rng(seed, 1, 0)``, on
    either backend (the fused path draws from a Philox stream)."""
    return philox.Philox.seeded(seed, 1, 0, xp=backend.xp)


def _inputs(seed: int, *shapes, scale: float = 1.0):
    rng = backend.host_rng(seed)
    return [backend.to_device((rng.standard_normal(s) * scale).astype("float32"))
            for s in shapes]


def _dropout():
    (x, dy) = _inputs(1, (37, 129), (37, 129))
    y, cache = dropout.forward(x, 0.1, _rng(3))
    dx, _ = dropout.backward(dy, cache)
    return {"y": y, "dx": dx, "keep": cache.keep}


def _layernorm():
    x, dy, gamma, beta = _inputs(2, (5, 33, 512), (5, 33, 512), (512,), (512,))
    y, cache = layernorm.forward(x, {"gamma": gamma, "beta": beta})
    dx, grads = layernorm.backward(dy, cache)
    return {"y": y, "dx": dx, **grads}


def _attention():
    q, k, v, do = _inputs(3, (3, 4, 17, 16), (3, 4, 17, 16), (3, 4, 17, 16), (3, 4, 17, 16))
    ids = backend.to_device([[5] * 17, [5] * 12 + [0] * 5, [5] * 3 + [0] * 14])
    mask = attention.causal_mask(17, "float32") + attention.padding_mask(ids, 0, "float32")
    out = {}
    for name, m, p_drop in (("causal", mask, 0.0), ("padding", attention.padding_mask(
            ids, 0, "float32"), 0.1), ("none", None, 0.0)):
        o, cache = attention.sdpa_forward(q, k, v, m, p_drop=p_drop, rng=_rng(4))
        dq, dk, dv, _ = attention.sdpa_backward(do, cache)
        out.update({f"{name} o": o, f"{name} p": cache.p, f"{name} dq": dq, f"{name} dk": dk,
                    f"{name} dv": dv})
    return out


def _feedforward():
    x, dy, w1, b1, w2, b2 = _inputs(5, (4, 9, 64), (4, 9, 64), (64, 256), (256,), (256, 64),
                                    (64,), scale=0.3)
    p = {"w1": w1, "b1": b1, "w2": w2, "b2": b2}
    out = {}
    for p_drop in (0.0, 0.2):
        y, cache = feedforward.forward(x, p, p_drop, _rng(6))
        dx, grads = feedforward.backward(dy, cache)
        out.update({f"p={p_drop} {k}": a for k, a in {"y": y, "dx": dx, **grads}.items()})
    return out


def _residual():
    x, f, dy, gamma, beta, bias = _inputs(7, (3, 11, 96), (3, 11, 96), (3, 11, 96), (96,), (96,),
                                          (96,))
    out = {}
    for pre_ln, p_drop, b in ((False, 0.1, bias), (True, 0.1, None), (False, 0.0, bias)):
        y, cache = residual.forward(x, lambda h: (f.copy(), None), {"gamma": gamma, "beta": beta},
                                    p_drop, _rng(8), pre_ln, b)
        dx, _, grads = residual.backward(dy, cache, lambda df, c: (df.copy(), None))
        name = f"pre_ln={pre_ln} p={p_drop} bias={b is not None}"
        out.update({f"{name} {k}": a for k, a in {"y": y, "dx": dx, **grads}.items()})
    return out


def _loss():
    (z,) = _inputs(9, (45, 1000), scale=3.0)
    targets = backend.host_rng(10).integers(8, 1000, size=45)
    targets[::7] = 0                                                # padding rows
    targets = backend.to_device(targets)
    out = {}
    for smoothing, pad in ((0.1, None), (0.0, 0), (0.1, 0)):
        (l_sum, n_sum), dz = loss.forward_backward(z.copy(), targets, smoothing, 1 / 45, pad)
        out.update({f"eps={smoothing} pad={pad} {k}": a
                    for k, a in {"loss": l_sum, "nll": n_sum, "dz": dz}.items()})
    return out


def _optimizer():
    shapes = {"enc.w": (300, 70), "enc.b": (70,), "emb": (50, 16)}
    rng = backend.host_rng(11)
    params = flat.flatten({k: rng.standard_normal(s).astype("float32") for k, s in shapes.items()})
    grads = flat.flatten({k: rng.standard_normal(s).astype("float32") * 3
                          for k, s in shapes.items()})
    adam = optim.Adam(params, weight_decay=0.01)
    norms = {}
    for step in range(3):
        norms[f"norm {step}"] = gradscale.clip_grad_norm(grads, 5.0)
        adam.update(params, grads, 1e-2)
    return {"params": params.buffer, "m": adam.m.buffer, "v": adam.v.buffer, **norms}


def _loss_scaler():
    shapes = {"enc.w": (300, 70), "enc.b": (70,), "emb": (50, 16)}
    rng = backend.host_rng(12)
    params = flat.flatten({k: rng.standard_normal(s).astype("float32") for k, s in shapes.items()})
    grads = flat.zeros_like(params)
    adam, scaler = optim.Adam(params, weight_decay=0.01), gradscale.LossScaler(2.0 ** 10, 2)
    out = {}
    for step in range(5):
        grads.buffer[...] = backend.to_device(rng.standard_normal(grads.buffer.shape).astype(
            "float32")) * scaler.scale              # the gradients of a loss scaled by S
        if step == 2:
            grads["enc.b"][3] = float("inf")        # an overflow: skipped, S halved
        out[f"norm {step}"] = scaler.unscale(grads, 5.0 if step % 2 else None)
        adam.update(params, grads, 1e-2, scaler)
        out[f"state {step}"] = scaler.state.copy()
    return {**out, "params": params.buffer, "m": adam.m.buffer, "v": adam.v.buffer}


def _mixed_precision():
    """fp16: LayerNorm's and the ReLU's float16 outputs, and dY's float16 copy with db."""
    previous = products.precision()
    products.set_precision("fp16")
    try:
        x, dy, w, b, gamma, beta = _inputs(13, (6, 7, 64), (6, 7, 32), (64, 32), (32,), (64,),
                                           (64,), scale=0.5)
        h, _ = layernorm.forward(x, {"gamma": gamma, "beta": beta})
        y, cache = linear.forward(h, {"w": w, "b": b})
        dx, grads = linear.backward(dy, cache)
        p = {"w1": w, "b1": b, "w2": w.T.copy(), "b2": gamma}
        f, c_ff = feedforward.forward(x, p, 0.1, _rng(14))
        df, g_ff = feedforward.backward(x, c_ff)
        return {"y": y, "dx": dx, **grads, "ffn y": f, "ffn dx": df,
                **{f"ffn {k}": a for k, a in g_ff.items()}}
    finally:
        products.set_precision(previous)


# name -> (case, tolerance: largest |fused - plain| / max |plain| of any output)
CASES = {"dropout": (_dropout, 0.0), "layernorm": (_layernorm, 1e-5),
         "attention": (_attention, 1e-5), "feedforward": (_feedforward, 1e-5),
         "residual": (_residual, 1e-5), "loss": (_loss, 1e-5), "optimizer": (_optimizer, 1e-5),
         "loss scaler": (_loss_scaler, 1e-5), "mixed precision": (_mixed_precision, 2e-3)}


HOST_TOLERANCES = {"float32": 1e-5, "float16": 2e-3}     # a launch's outputs; others: equal


def _run(case, kernels: str, on_host: bool) -> dict:
    previous = fused.choice(), fused.on_host()
    fused.use(kernels, on_host=on_host)
    try:
        return {k: backend.to_host(a).astype("float64").reshape(-1) for k, a in case().items()}
    finally:
        fused.use(*previous)


def prepare_host() -> None:
    """Compile every kernel for the host, on all the cores at once (each is then loaded)."""
    kernels = {k.source: k for k in fused.KERNELS.values()}.values()
    workers = min(len(kernels), os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(lambda k: k.host.library, kernels):
            pass


def compare(on_host: bool = False, cases=None) -> list[dict]:
    """Every case (of ``cases``, names, where given) on the active backend (CuPy; NumPy with
    ``on_host``): ``{"case", "output", "error", "tolerance", "ok"}`` for the worst output of each
    case, and ``{"kernel", "launches", "ok"}`` for each kernel (of those they launched, with
    ``cases``; ok: it ran; on the host also ``"output"``, ``"error"``,
    ``"tolerance"``: its launches' worst output against its twin's). On the host a kernel's
    fault (:class:`minitfm.cudahost.KernelFault`) stops its case, whose row has ``"fault"``,
    the fault in words, as has the kernel's row (the case's name)."""
    before = {name: k.launches for name, k in fused.KERNELS.items()}
    for kernel in fused.KERNELS.values():
        kernel.host_errors.clear()
    rows, faults = [], {}
    for name, (case, tolerance) in CASES.items():
        if cases is not None and name not in cases:
            continue
        try:
            fused_out = _run(case, "fused", on_host)
        except cudahost.KernelFault as fault:       # on the host: the case stops, others go on
            faults.setdefault(fault.kernel, name)
            rows.append({"case": name, "output": "", "error": math.inf, "tolerance": tolerance,
                         "ok": False, "fault": str(fault)})
            continue
        plain_out = _run(case, "plain", False)
        worst, error = "", 0.0
        for key, reference in plain_out.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)     # inf - inf
                diff = abs(fused_out[key] - reference)
            diff[fused_out[key] == reference] = 0.0                 # Inf where both overflowed
            finite = abs(reference[abs(reference) < math.inf])
            relative = float(diff.max(initial=0.0)) / max(float(finite.max(initial=0.0)), 1e-30)
            if not math.isfinite(relative) or relative >= error:
                worst, error = key, relative
        rows.append({"case": name, "output": worst, "error": float(error),
                     "tolerance": tolerance, "ok": bool(error <= tolerance)})
    for name, kernel in fused.KERNELS.items():
        ran = kernel.launches - before[name]
        if cases is not None and not ran:
            continue
        row = {"kernel": name, "launches": ran, "ok": ran > 0}
        if on_host:
            worst, error, tolerance = "", 0.0, 0.0
            for (output, dtype), e in kernel.host_errors.items():    # the first failing output,
                allowed = HOST_TOLERANCES.get(dtype, 0.0)            # else the largest error
                if error <= tolerance and (not e <= allowed or e > error or not worst):
                    worst, error, tolerance = output, e, allowed
            row.update(output=worst, error=error, tolerance=tolerance,
                       ok=ran > 0 and error <= tolerance and name not in faults)
            if name in faults:
                row["fault"] = faults[name]
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = Parser(prog="python -m minitfm.kernelcheck",
                    description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", action="store_true",
                        help="no GPU: run the kernels' CUDA source on the CPU (compiled by the "
                             "machine's C++ compiler), each launch checked for faults and held "
                             "to its twin")
    parser.add_argument("--case", action="append", choices=list(CASES), metavar="NAME",
                        help="run this case alone, and check the kernels it launches (repeat "
                             f"it for several; default: all): {', '.join(CASES)}")
    parser.add_argument("--explain", action="store_true",
                        help="check nothing: say which function each layer call of one training "
                             "update runs, and what chose it")
    parser.add_argument("--kernels", choices=fused.CHOICES,
                        help="with --explain: the kernels the update runs under (default: a "
                             "command's, fused on the CPU, plain on a GPU)")
    parser.add_argument("--precision", choices=products.PRECISIONS,
                        help="with --explain: the precision of the update's products (default: "
                             "the backend's)")
    args = parser.parse_args(argv)
    if (args.kernels or args.precision) and not args.explain:
        parser.error("--kernels and --precision go with --explain")
    return report_errors(lambda: explain(args) if args.explain else run(args))


def explain(args: argparse.Namespace) -> int:
    """Print which function each route's calls ran in one training update, and why; 0."""
    import minitfm.speed
    from minitfm import tasks
    from minitfm.models import translator
    try:
        backend.use(os.environ.get("MINITFM_BACKEND", "").strip() or "numpy")
        chosen, _ = products.set_precision(args.precision)
        kernels = args.kernels or ("fused" if backend.name == "numpy" else "plain")
        fused.use(kernels)
        rows.use(backend.name == "numpy" and kernels == "fused", 1)
    except backend.BackendError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cfg = translator.Config.preset("toy", src_vocab=16, tgt_vocab=16, dropout=0.1,
                                   attention_dropout=0.1, relu_dropout=0.1)
    params = translator.init_params(cfg, seed=0)
    src, tgt = next(iter(tasks.train_batches("copy", vocab=10, length=12, batch_size=32,
                                             seed=0)(0)))
    scaler = gradscale.LossScaler() if chosen == "fp16" else None
    adam = optim.Adam(params)
    with minitfm.speed.traced() as seen:
        with mixed.half_copies(params):
            _, grads = translator.loss_and_grads(params, cfg, src, tgt, backend.rng(0, 1, 0),
                                                 loss_scale=None if scaler is None else
                                                 scaler.scale)
        if scaler is None:
            gradscale.clip_grad_norm(grads, 1.0)
        else:
            scaler.unscale(grads, 1.0)
        adam.update(params, grads, 1e-3, scaler)
    print(minitfm.speed.explain().splitlines()[0].replace("settings:", "one update of the toy "
                                                          f"translator on {backend.name}:"))
    for name, counts in seen.items():
        ran = ", ".join(f"{fn.replace('minitfm.', '')} x{n}" for fn, n in counts.most_common())
        print(f"{name.replace('minitfm.', '')}: {ran or 'not called in this update'}")
        print(f"    {policy.ROUTES[name].reads}")
    return 0



def run(args: argparse.Namespace) -> int:
    """Check every kernel as ``args`` say; print the table; 0 if all pass."""
    started = time.monotonic()
    try:
        backend.use("numpy" if args.host else "cupy")
        if args.host:
            if args.case is None:
                prepare_host()      # else each kernel a case launches, at its first launch
            print(f"the kernels' source on the CPU, compiled by "
                  f"{cudahost.cxx.named(*cudahost.cxx.chosen_compiler())}")
        rows = compare(on_host=args.host, cases=args.case)
    except (backend.BackendError, cudahost.BuildError, cudahost.Unsupported) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for row in rows:
        if "fault" in row and "case" in row:
            print(f"{row['case']:16} FAULT {row['fault']}")
        elif "case" in row:
            print(f"{row['case']:16} worst {row['output']:22} {row['error']:.2e} "
                  f"(tolerance {row['tolerance']:.0e}) {'ok' if row['ok'] else 'DIFFERS'}")
        else:
            line = f"kernel {row['kernel']:22} launched {row['launches']} times"
            if "error" in row and row["launches"]:
                line += (f", against its twin: worst {row['output'] or '-'} {row['error']:.2e} "
                         f"(tolerance {row['tolerance']:.0e})")
                line += "" if row["ok"] else " DIFFERS"
            if "fault" in row:
                line += f", FAULT in case {row['fault']} (above)"
            print(line + ("" if row["launches"] else ": NOT RUN by any case"))
    failed = sum(not row["ok"] for row in rows)
    print(f"{len(rows) - failed} passed, {failed} failed"
          + (f" in {time.monotonic() - started:.1f} s" if args.host else ""))
    return 1 if failed else 0
