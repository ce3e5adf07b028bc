"""The sizes every check runs at leave no coincidence for a wrong answer to pass by: in every
case of every exercise each size is its own (batch, lengths, d_model, heads, d_k, d_ff,
vocabulary, layers, rows, chunks), none is 2, none is the square of another, and neither
d_model's nor d_k's square root is 2; the output layer runs over more than one chunk, and Adam
meets gradients small enough that eps counts."""

import itertools
import math

import pytest

from minitfm.learn import adamcheck, kernels
from minitfm.learn.cases import ALL_CASES, case_sizes
from minitfm.learn.exercises import EXERCISES, by_name
from minitfm.learn.modelcheck import model_cases
from minitfm.learn.kinds import KERNEL, LAYER, MODEL, OPTIM

# what each key of a case's sizes is; the others (p, pre, causal, smoothing...) are settings
SIZES = {"b": "batch", "t": "length", "s": "source length", "d": "d_model", "h": "heads",
         "dk": "d_k", "f": "d_ff", "v": "vocabulary", "n": "layers or rows",
         "batch": "batch", "src_len": "source length", "tgt_len": "target length"}


def sizes_of(ex) -> list[tuple[str, dict]]:
    """Each case of the exercise's check: (its name, {what: size})."""
    found = []
    if ex.kind is MODEL:
        for name, case in model_cases(ex).items():
            cfg = case.cfg
            named = {SIZES[k]: v for k, v in case.sizes.items() if k in SIZES}
            named.update({"d_model": cfg.d_model, "heads": cfg.n_heads,
                          "d_k": cfg.d_model // cfg.n_heads, "d_ff": cfg.d_ff,
                          "layers": cfg.n_layers, "source vocabulary": cfg.src_vocab})
            if not cfg.share_embeddings:
                named["target vocabulary"] = cfg.tgt_vocab
            found.append((name, named))
    elif ex.kind is LAYER:
        for name in ex.cases:
            sizes = case_sizes(ex, ALL_CASES[name])
            named = {SIZES[k]: v for k, v in sizes.items() if k in SIZES}
            if "h" in sizes and "dk" in sizes and "d" not in sizes:
                named["d_model"] = sizes["h"] * sizes["dk"]
            if "LOGIT_CHUNK" in ex.constants:
                rows = ex.constants["LOGIT_CHUNK"] // sizes["v"]
                named["rows a chunk"] = rows
                named["chunks"] = math.ceil(sizes["n"] / rows)
            found.append((name, named))
    elif ex.kind is KERNEL:
        _, args, words = kernels.launch(ex)
        shapes = {a.shape for a in args if hasattr(a, "shape") and a.ndim == 2}
        for rows, cols in shapes:
            found.append((words, {"rows": rows, "columns": cols}))
    return found


def coincidences(sizes: dict) -> list[str]:
    """What in ``sizes`` ({what: size}) a wrong answer could pass by."""
    found = []
    for (a, x), (b, y) in itertools.combinations(sizes.items(), 2):
        if x == y:
            found.append(f"{a} and {b} are both {x}")
        elif x == y * y or y == x * x:
            found.append(f"{a} {x} and {b} {y}: one is the other's square")
    for what, value in sizes.items():
        if value == 2:
            found.append(f"{what} is 2")
        if what in ("d_model", "d_k") and value == 4:
            found.append(f"the square root of {what} is 2")
    return found


@pytest.mark.parametrize("ex", [e for e in EXERCISES if e.kind is not OPTIM],
                         ids=lambda e: e.name)
def test_every_size_is_its_own(ex):
    cases = sizes_of(ex)
    assert cases or ex.name == "kernel_dropout", ex.name
    for name, sizes in cases:
        assert not coincidences(sizes), (ex.name, name, coincidences(sizes))


def test_the_output_layer_runs_over_several_chunks():
    (_, sizes), = sizes_of(by_name("output"))
    assert sizes["chunks"] >= 3


def test_adam_meets_gradients_where_eps_counts():
    """eps is 1e-9 in the check, and sqrt(v_hat) is of the order of the gradients."""
    assert min(adamcheck.GRADIENT_SCALES) <= 1e-7 and max(adamcheck.GRADIENT_SCALES) >= 1.0


def test_the_property_catches_the_old_coincidences():
    """Batch 2 and d_model 4 (an embedding's scale sqrt(4) = 2 = the batch) are caught."""
    words = coincidences({"batch": 2, "length": 6, "vocabulary": 5, "d_model": 4})
    assert "batch is 2" in words and "the square root of d_model is 2" in words
    assert "batch 2 and d_model 4: one is the other's square" in words
