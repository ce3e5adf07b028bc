"""How often the host waits for the GPU: device-to-host copies and random generators, per phase.

A GPU is fast only while the host keeps queueing work and never waits: every device-to-host copy
(``float()`` of a device number, ``.get()``, ``.tolist()``, a boolean mask, printing) waits until
the device has finished all the work queued before it. This benchmark runs the library on the
strict CuPy double of the tests (``tests/cupy_double``, which counts every such copy and every
random generator CuPy would create) and prints the counts of each phase beside its budget:

    python benchmarks/bench_syncs.py            # CuPy 14 rules; --rules 13 for CuPy 13's

The counts are properties of the code, the same on any machine, and on a real GPU: the double
runs on NumPy, but counts where CuPy would copy. The budgets are asserted by tests/test_syncs.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rules", choices=("14", "13"), default="14", help="CuPy release's rules")
    args = p.parse_args(argv)
    os.environ["CUPY_DOUBLE_RULES"] = args.rules
    sys.path[:0] = [str(ROOT / "tests" / "cupy_double"), str(ROOT)]
    import cupy
    import numpy as np

    from minitfm import backend, checkpoint, flat, optim
    from minitfm.decoding import beam, decode, generation
    from minitfm.training.validation import evaluate
    from tests.trainrun import train
    from minitfm.models import lm, translator
    from tests.test_train import CFG, epoch_batches, options, ragged_batch
    assert hasattr(cupy, "_double"), "the CuPy double was not found"
    backend.use("cupy")
    counted = cupy._double

    def count(run) -> tuple[int, int]:
        with counted.counting() as seen:
            run()
        return seen.device_to_host, seen.generators

    rows = []   # (phase, per, copies, budget, generators)

    def training(steps, log_every):
        return count(lambda: train(CFG, epoch_batches,
                                   options(max_steps=steps, log_every=log_every)))
    base, gens = training(4, 4)
    more, _ = training(12, 12)
    rows.append(("training update", "update", (more - base) / 8, "0", gens))
    few, _ = training(12, 12)
    many, _ = training(12, 4)
    rows.append(("log line", "line", (many - few) / 2, "<= 1", 0))

    params = translator.init_params(CFG, 0)
    batches = [ragged_batch(seed) for seed in range(5)]
    copies, gens = count(lambda: evaluate(params, CFG, batches))
    rows.append(("validation", "batch", copies / len(batches), "<= 1", gens))

    flat_params = flat.flatten(params)
    adam = optim.Adam(flat_params)
    with tempfile.TemporaryDirectory() as directory:
        copies, gens = count(lambda: checkpoint.save(
            Path(directory) / "c.npz", flat_params, optimizer_state=adam.state_dict(), step=1,
            config=CFG.to_dict(), vocab_id=None))
    rows.append(("checkpoint", "checkpoint", copies, "3 (one per flat buffer)", gens))

    src, _ = ragged_batch(3)
    steps = 12
    copies, gens = count(lambda: decode.greedy(params, CFG, src, max_len=steps))
    rows.append(("greedy decoding", "step", copies / steps, "<= 1", gens))
    copies, gens = count(lambda: beam.beam_search(params, CFG, src, beam=4, max_len=steps))
    rows.append(("beam search, beam 4", "step", copies / steps, "<= 1", gens))

    cfg = lm.LMConfig(vocab=11, n_layers=1, d_model=8, n_heads=2, d_ff=16, max_len=16)
    lm_params = lm.init_params(cfg, 0)
    tokens = 24
    copies, gens = count(lambda: list(generation.generate(
        lm_params, cfg, np.array([[3, 4, 5]]), tokens, temperature=0.8, top_k=5, top_p=0.9,
        seed=1)))
    rows.append(("sampling (top-k, top-p)", "token", copies / tokens, "<= 1", gens))

    print(f"device-to-host copies on the CuPy double (CuPy {args.rules} rules)")
    print(f"{'phase':<26}{'copies per':>22}{'budget':>26}{'generators':>12}")
    for phase, per, copies, budget, gens in rows:
        print(f"{phase:<26}{f'{copies:.2f} per {per}':>22}{budget:>26}{gens:>12}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
