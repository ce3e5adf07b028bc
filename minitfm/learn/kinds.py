"""The four kinds of exercise, an object each: how an exercise of the kind is made from the
library, whether its file is still as started, what its check runs, its hints and its solution.
A row of ``exercises.py`` names its kind (``kind=LAYER``); nothing else asks which kind an
exercise is.

    LAYER    a layer's backward pass (``minitfm/layers/``), held to the library's by the gradient
             checks' cases (``check.py``)
    MODEL    the whole encoder-decoder backward, every parameter's gradient (``modelcheck.py``)
    OPTIM    Adam and the paper's schedule, number for number (``adamcheck.py``)
    KERNEL   a fused CUDA kernel, run on the CPU and held to its plain twin (``kernels.py``)

Host-only code.
"""

from __future__ import annotations

import importlib
import textwrap
import time
from pathlib import Path

from minitfm import backend
from minitfm.learn import adamcheck, check, child, kernels, learner, modelcheck, source, todo
from minitfm.learn.cases import ALL_CASES, case_sizes, constants, gradients, run_case
from minitfm.learn.exercise import Exercise
from minitfm.learn.report import Report
from minitfm.learn.worker import LIMIT

__all__ = ["Kind", "LAYER", "MODEL", "OPTIM", "KERNEL", "header"]


class Kind:
    """What differs between the kinds of exercise. ``suffix``: the file's; ``reference``: whose
    results the learner's are held to, as the report says; ``trained``: whether the learner's
    passing code runs in ``train`` (a kernel's does not: train runs NumPy's plain code)."""
    name = ""
    suffix = ".py"
    reference = "the library's"
    trained = True

    def __repr__(self) -> str:
        return self.name.upper()

    def label(self, name: str) -> str:
        """How the report names one of a case's arrays."""
        return name

    def make(self, ex: Exercise, hard: bool, exercises: list[Exercise]) -> str:
        """The exercise's file, from the library's source as it is now (``exercises``: all of
        them, of which the file may speak)."""
        raise NotImplementedError

    def started(self, ex: Exercise, path: Path) -> bool:
        """Whether the file ``path`` is as started: nothing of the learner's written there yet."""
        raise NotImplementedError

    def not_written(self, ex: Exercise, path: Path) -> Report | None:
        """A report for a file that is plainly not written, read without running it."""
        return None

    def check(self, ex: Exercise, path: Path, seed: int = 0, limit: float = LIMIT,
              cancel=None) -> Report:
        """The check of the learner's file (``check.run_check`` asks :meth:`not_written` first)."""
        raise NotImplementedError

    def hint(self, ex: Exercise, k: int) -> str:
        """Hint ``k``: 1 the shapes, 2 the chain-rule step (the row's first hint), 3 the
        derivation's start (the row's second hint, or the library's)."""
        if k == 1:
            return self.shapes_hint(ex)
        if k == 2:
            return ex.hints[0]
        return self.derivation_hint(ex)

    def shapes_hint(self, ex: Exercise) -> str:
        raise NotImplementedError

    def derivation_hint(self, ex: Exercise) -> str:
        if len(ex.hints) > 1:
            return f"the derivation starts: {ex.hints[1]}"
        lines = [" ".join(line.split()) for line in source.derivation(ex.module) if line.strip()]
        return f"the derivation starts: {'; '.join(lines[:2])}"

    def solution(self, ex: Exercise) -> str:
        """The library's own code of what the learner writes."""
        return "\n".join(f"# {ex.module}, {name}:\n{source.plain_source(ex.module, name)}"
                         for name in ex.write)


def header(ex: Exercise, hard: bool) -> str:
    """The comment at the top of a Python exercise's file."""
    write = ", ".join(ex.write)
    return textwrap.dedent(f"""\
        # Exercise {ex.number:02d}, {ex.name}: {ex.title}.
        # Write the body of {write} where it says TODO; the rest is the library's own code
        # ({ex.module}){', its derivation left out (--hard)' if hard else ''}.
        #   check it:  python -m minitfm.learn check {ex.name}
        #   a hint:    python -m minitfm.learn hint {ex.name}
        """)


class PythonKind(Kind):
    """An exercise in Python: the library's module with the functions to write blanked, each
    holding a TODO made from one call of the check (``todo.py``), run in a process of its own
    by ``task`` (``child.py``) and judged on the checking side by ``judge``."""
    task = None
    judge = None

    def calls(self, ex: Exercise) -> dict:
        """For each function to write, the call of the check its TODO describes."""
        return {}

    def make(self, ex, hard, exercises):
        todos = {name: todo.todo_lines(ex, name, call) for name, call in self.calls(ex).items()}
        for name, words in ex.todo.items():
            todos[name] = [line for w in words for line in textwrap.wrap(w, todo.WIDTH)] + \
                [f"Check it: python -m minitfm.learn check {ex.name}"]
        return source.blanked(ex.module, ex.write, ex.keep, hard=hard, todos=todos,
                              header=header(ex, hard), borrow=ex.borrow)

    def started(self, ex, path):
        try:
            left = learner.unwritten(path, ex.write)
        except SyntaxError:
            return False
        return len(left) == len(ex.write)

    def not_written(self, ex, path):
        try:
            left, missing = learner.unwritten(path, ex.write), learner.undefined(path, ex.write)
        except SyntaxError:
            return None                     # the child's load says where
        if missing and len(missing) == len(ex.write):
            return Report(ex, path, "not written", message=f"not written yet: {path.name} "
                          f"defines no {', '.join(missing)} (empty, or deleted: `python -m "
                          f"minitfm.learn reset {ex.name}` gives a fresh copy)")
        if len(left) + len(missing) == len(ex.write):
            return Report(ex, path, "not written", message=f"not written yet: {path.name} still "
                          f"holds the TODO of {', '.join(left)}")
        return None

    def check(self, ex, path, seed=0, limit=LIMIT, cancel=None):
        return check.run_in_child(ex, path, self.task, self.judge, seed, limit, cancel)


class LayerKind(PythonKind):
    name = "layer"
    task = staticmethod(child.layer)
    judge = staticmethod(check.check_layer)

    def label(self, name):
        """dx, dgamma, d(enc.0.ln1.gamma)."""
        return f"d{name}" if name.isidentifier() else f"d({name})"

    def calls(self, ex):
        return todo.layer_calls(ex)

    def shapes_hint(self, ex):
        """Each gradient has the shape of what it differentiates: the shapes of the first case."""
        library = importlib.import_module(ex.module)
        case = ALL_CASES[ex.cases[0]]
        with backend.using("numpy"), constants(ex, library):
            arrays, _, _, result = run_case(case, case_sizes(ex, case), 0, library, {})
        grads = gradients(case, result)
        pairs = "; ".join(f"{name} {todo.value_text(arrays[name])} -> d{name} "
                          f"{todo.value_text(g)}"
                          for name, g in grads.items())
        return (f"in the case \"{case.name}\": {pairs}. A gradient has the shape of what it "
                f"differentiates; where a parameter meets every row, its gradient sums over the "
                f"rows")


class ModelKind(LayerKind):
    name = "model"
    task = staticmethod(child.model)
    judge = staticmethod(modelcheck.check_model)

    def calls(self, ex):
        return todo.model_calls(ex)

    def shapes_hint(self, ex):
        return ("out holds one array per parameter, of the parameter's shape: write each "
                "gradient there (out[tgt_name] holds the output projection's already, and the "
                "embeddings' backward passes add to it)")


class OptimKind(PythonKind):
    name = "optim"
    task = staticmethod(child.optim)
    judge = staticmethod(adamcheck.check_optim)

    def shapes_hint(self, ex):
        return ("m, v and p keep their shapes; the step size and v's scale are numbers: "
                "coefficients returns (b1, b2, step_size, v_scale, keep), with lr m_hat / "
                "(sqrt(v_hat) + eps) == step_size * m / (sqrt(v) * v_scale + eps)")


class KernelKind(Kind):
    name = "kernel"
    suffix = ".cu"
    reference = "the twin's"
    trained = False

    def make(self, ex, hard, exercises):
        return kernels.make(ex, hard, exercises)

    def started(self, ex, path):
        return kernels.unwritten(path)

    def not_written(self, ex, path):
        if kernels.unwritten(path):
            return Report(ex, path, "not written", message=f"not written yet: the body of the "
                          f"kernel in {path.name} holds only the TODO")
        return None

    def check(self, ex, path, seed=0, limit=LIMIT, cancel=None):
        started = time.perf_counter()
        report = kernels.check(ex, path, seed, limit, cancel)
        report.seconds = time.perf_counter() - started
        return report

    def shapes_hint(self, ex):
        return kernels.shapes_hint(ex)

    def derivation_hint(self, ex):
        return kernels.third_hint(ex)

    def solution(self, ex):
        kernel = kernels.kernel_of(ex)
        return f"// {ex.kernel}.source, the kernel {kernel.name}:\n{kernel.source.strip(chr(10))}"


LAYER, MODEL, OPTIM, KERNEL = LayerKind(), ModelKind(), OptimKind(), KernelKind()
