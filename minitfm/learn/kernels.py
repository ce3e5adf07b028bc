"""The workshop's CUDA exercises: a fused kernel of the library written by the learner in CUDA C,
executed on the CPU by :mod:`minitfm.cudahost` and held to the kernel's plain twin. Host-only
code.

The exercise file (``.cu``) is the kernel's whole translation unit as the library has it (the
helpers it calls, such as ``block_sum``), the kernel's body replaced by a TODO, and a comment
with its twin (the plain code it must equal) and the check's launch. The check compiles the file
as it is, so every line a message names is a line of the learner's file: a compiler error, an
element read or written outside its array, a race (the results depend on the order the threads
run in: the launch runs in several orders), a barrier that never releases (a deadlock), a failing
assert or ``__trap()``; what would crash the process (a stack that overflows, a pointer that
points nowhere) is a fault of its thread too, never a crash of the command. Then it
compares each output with the twin's on the same inputs, within float32 rounding of sums taken
in another order (1e-5 of the largest value; masks and integers equal), and diagnoses a wrong
one as a layer's gradient is (:mod:`minitfm.learn.diagnose`).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import numpy

from minitfm import backend, cudahost
from minitfm.speed import fused
from minitfm.learn import diagnose, learner, source, worker
from minitfm.learn.alternatives import Alternatives
from minitfm.learn.exercise import Exercise
from minitfm.learn.locate import Region
from minitfm.learn.report import ArrayResult, CaseResult, Report

__all__ = ["make", "check", "unwritten", "launch", "TODO", "kernel_of", "shapes_hint",
           "third_hint", "kernel_span", "body_of", "outputs", "learner_lines", "run_kernel"]

TODO = "// TODO: write the kernel's body"
TOLERANCE = 1e-5
SEEDS = (0, 1, 2)                   # the orders a launch runs in: natural, then two drawn
COMPILE_LIMIT = 300.0               # seconds: a compiler on a busy machine, the first time


def kernel_of(ex: Exercise) -> fused.Kernel:
    """The library's kernel of a kernel exercise (``ex.kernel``, ``minitfm.speed.<layer>.NAME``)."""
    module, name = ex.kernel.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def kernel_span(text: str, name: str) -> tuple[int, int, int]:
    """Where the kernel ``name`` is in ``text``: (start of its ``extern`` line, the index after
    its opening brace, the index of its closing brace)."""
    match = re.search(r'extern\s+"C"\s+__global__\s+void\s+' + re.escape(name) + r"\s*\(", text)
    if match is None:
        raise LookupError(f"no kernel {name} in the source")
    start = text.rfind("\n", 0, match.start()) + 1
    brace = text.index("{", match.end())
    depth, i = 0, brace
    while True:
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return start, brace + 1, i
        i += 1


def body_of(text: str, name: str) -> str:
    _, open_, close = kernel_span(text, name)
    return text[open_:close]


def launch(ex: Exercise, seed: int = 0) -> tuple[tuple, tuple, str]:
    """The check's launch of the exercise's kernel (its row's ``launch``) drawn from ``seed``:
    ``(grid, args, words)``, NumPy arrays and scalars typed as the kernel's parameters, and the
    launch in words."""
    return ex.launch(numpy.random.default_rng(seed))


def _comment(lines: list[str]) -> str:
    return "\n".join(("// " + line).rstrip() for line in lines)


def make(ex: Exercise, hard: bool, exercises: list[Exercise]) -> str:
    """The exercise's ``.cu`` file: its twin's code, and the code of each function the twin
    calls, but of one another of ``exercises`` writes (its solution), of which the file gives
    what it computes (:func:`_computes`)."""
    kernel = kernel_of(ex)
    text = kernel.source.strip("\n")
    start, open_, close = kernel_span(text, kernel.name)
    before, signature = text[:start], text[start:open_]
    lines = before.rstrip("\n").splitlines()
    notes = []                                  # the library's comment above the kernel
    while lines and lines[-1].lstrip().startswith("//"):
        notes.insert(0, lines.pop())
    twin = textwrap.dedent(inspect.getsource(kernel.twin)).rstrip().splitlines()
    grid, args, words = launch(ex)
    params = [p.name for p in kernel.host.params]
    described = ", ".join(f"{name} {_describe(a)}" for name, a in zip(params, args))
    path, layer = (f"{module.replace('.', '/')}.py" for module in (kernel.twin.__module__,
                                                                    ex.module))
    head = [f"Exercise {ex.number:02d}, {ex.name}: {ex.title}.",
            f"Write the body of {kernel.name} where it says TODO. The check runs it on the CPU",
            "(minitfm.cudahost: each thread a fiber, blocks one after another, in several "
            "orders),",
            "holds each output to the kernel's twin, and names the line of this file of a fault.",
            f"  check it:  python -m minitfm.learn check {ex.name}",
            f"  a hint:    python -m minitfm.learn hint {ex.name}",
            "", f"Its twin, the plain code it must equal ({path}):", *["    " + t for t in twin]]
    for name in ex.keep:
        owner = _written_by(ex, name, exercises)
        if owner is None:
            head += ["", f"and {name} ({layer}), which it calls:",
                     *["    " + t for t in source.plain_source(ex.module, name).splitlines()]]
        else:
            head += ["", *textwrap.wrap(
                f"and {name}, which it calls: exercise {owner.number:02d} ({owner.name}) writes "
                f"it, so its code is not shown here. What it computes, from {layer}:", 94),
                *["    " + t for t in _computes(ex.module, name)]]
    head += ["", *textwrap.wrap(f"The check's launch: grid {grid}, block ({fused.THREADS},); "
                                f"{words};", 94), *textwrap.wrap(described, 94)]
    body = "\n    " + TODO + "\n"
    before = "\n".join(lines).strip("\n")
    parts = [_comment(head), "", before] if before else [_comment(head), ""]
    if not hard:
        parts.append("\n".join(notes))
    parts.append(signature + body + "}")
    return "\n".join(p for p in parts if p is not None) + "\n"


def _written_by(ex: Exercise, name: str, exercises: list[Exercise]) -> Exercise | None:
    """The exercise of another kind than ``ex`` (not a kernel's) whose learner writes function
    ``name`` of ``ex``'s module."""
    return next((e for e in exercises if e.kind is not ex.kind and e.module == ex.module
                 and name in e.write), None)


def _computes(module: str, name: str) -> list[str]:
    """What a function computes, without its code: its signature and docstring, then the
    derivation of the module's docstring."""
    code = source.plain_source(module, name)
    fn = ast.parse(code).body[0]
    end = fn.body[0].end_lineno if source.is_docstring(fn.body[0]) else fn.lineno
    return [*code.splitlines()[:end], *textwrap.dedent("\n".join(
        source.derivation(module))).splitlines()]


def _describe(value) -> str:
    if isinstance(value, numpy.ndarray):
        return f"{value.dtype} {tuple(value.shape)}"
    return f"= {source.number(value.item() if isinstance(value, numpy.generic) else value)}"


def unwritten(path: Path) -> bool:
    """Whether the kernel's body holds nothing but comments and blanks (False for a file that
    is not UTF-8: something was written there)."""
    try:
        return unwritten_text(learner.text_of(path))
    except learner.NotUTF8:
        return False


def unwritten_text(text: str) -> bool:
    """:func:`unwritten` of a ``.cu`` file's text."""
    match = re.search(r'extern\s+"C"\s+__global__\s+void\s+(\w+)', text)
    if match is None:
        return False
    try:
        body = body_of(text, match.group(1))
    except (LookupError, IndexError):
        return False
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", body, flags=re.S)
    return not code.strip()


def learner_lines(message: str, path: Path) -> str:
    """A compiler's message with the kernel's source named as the learner's file."""
    return message.replace("kernel.cu:", f"{path.name}:")


def run_kernel(payload: dict, channel) -> dict:
    """The learner's side of a kernel check (run in a process of its own by :func:`check`):
    the kernel's text as the check read it (the lines its faults name) compiled, a phase of
    its own under the compiler's limit, and launched in several orders; its outputs, or its
    fault."""
    ex, path = payload["exercise"], Path(payload["path"])
    mine = cudahost.HostKernel(payload["text"], kernel_of(ex).name)
    channel.phase("compile", payload["compile_limit"])
    try:
        mine.library
    except cudahost.CompilerError as exc:       # the machine's setting, not the learner's code
        return {"compiler": str(exc)}
    except (cudahost.BuildError, cudahost.Unsupported) as exc:
        return {"error": learner_lines(str(exc), path)}
    channel.phase("run", payload["limit"] + 1.0)     # the launch's own limit comes first
    grid, args, _ = launch(ex, payload["seed"])
    try:
        cudahost.checked_launch(mine, grid, (fused.THREADS,), args, seeds=SEEDS,
                                time_limit=payload["limit"])
    except cudahost.KernelFault as exc:
        return {"fault": {"what": exc.what, "line": exc.line, "timed_out": exc.timed_out,
                          "block": list(exc.block) if exc.block is not None else None,
                          "thread": list(exc.thread) if exc.thread is not None else None}}
    except (TypeError, ValueError) as exc:
        return {"error": str(exc)}
    return {"outputs": {name: a for name, a, _ in outputs(kernel_of(ex), args, args)}}


def check(ex: Exercise, path: Path, seed: int = 0, limit: float = worker.LIMIT, cancel=None):
    """Compile and run the learner's kernel in a process of its own, and compare its outputs
    with the twin's here (see the module's docstring): a Report. A compiler that is not there
    or does not work is a :class:`cudahost.CompilerError` (a setting to change, not a verdict
    on the kernel), found here where it can be, else in that process; the kernel cache's folder
    is chosen here first, so that a warning about it is said once."""
    path = Path(path)
    try:
        text = learner.text_of(path)
    except learner.NotUTF8 as exc:
        return Report(ex, path, "error", message=f"{path.name}, line {exc.lineno}: {exc.msg}")
    cudahost.cxx.check_compiler()
    cudahost.build.cache_dir()
    outcome = worker.run(run_kernel, {"exercise": ex, "path": str(path), "text": text,
                                      "seed": seed, "limit": limit,
                                      "compile_limit": COMPILE_LIMIT},
                         limit=limit, cancel=cancel)
    if outcome.status == "cancelled":
        return Report(ex, path, "cancelled")
    if not outcome.done:
        return Report(ex, path, "fail", message=worker.outcome_words(outcome, "your kernel"))
    mine = outcome.value if isinstance(outcome.value, dict) else {}
    if "compiler" in mine:
        raise cudahost.CompilerError(str(mine["compiler"]))
    if "error" in mine:
        return Report(ex, path, "error", message=str(mine["error"]))
    grid, args, words = launch(ex, seed)
    result = CaseResult(f"the check's launch: grid {grid}, block ({fused.THREADS},); {words}",
                        {})
    if "fault" in mine:
        result.problem = _fault_words(mine["fault"], path, text)
        return Report(ex, path, "fail", [result])
    with backend.using("numpy"):
        _compare(ex, seed, grid, args, mine.get("outputs", {}), result)
    return Report(ex, path, "pass" if result.ok else "fail", [result])


def _compare(ex: Exercise, seed: int, grid: tuple, args: tuple, yours: dict,
             result: CaseResult) -> None:
    """Each output of the learner's kernel (``yours``, name -> array) held to the twin's on
    the launch ``grid``, ``args`` drawn from ``seed``, its verdict and diagnosis added to
    ``result``."""
    kernel = kernel_of(ex)
    reference = tuple(a.copy() if isinstance(a, numpy.ndarray) else a for a in args)
    kernel.run_twin(*reference)
    alternatives = None
    for name, _, r in outputs(kernel, args, reference):
        a = yours.get(name)
        if not isinstance(a, numpy.ndarray) or a.shape != r.shape or a.dtype != r.dtype:
            item = ArrayResult(name, float("inf"), False)
            item.diagnosis = "no output came back for it"
            result.arrays.append(item)
            continue
        error = cudahost.compare_outputs(a, r)
        allowed = TOLERANCE if a.dtype.kind == "f" else 0.0
        item = ArrayResult(name, error, error <= allowed)
        result.arrays.append(item)
        if not item.ok:
            item.first = diagnose.first_wrong(a, r, max(allowed, 1e-12)) \
                if a.dtype.kind == "f" else _first_unequal(a, r)
            if alternatives is None:        # two mistakes at once: a compile each, spared
                alternatives = Alternatives(_mistaken(ex, kernel, grid, seed), ex.mistakes,
                                            pairs=False, regions=_regions(kernel, args),
                                            same=TOLERANCE)
            if a.dtype.kind == "f":
                item.diagnosis = diagnose.diagnose(
                    name, a, r, known=diagnose.quantities({}, ex.quantities), noun="output",
                    **alternatives.about(name, r, yours))


def outputs(kernel, args, reference) -> list:
    """The arrays the kernel writes: (name, the learner's, the twin's)."""
    written, seen, found = _written(kernel), set(), []
    for param, a, r in zip(kernel.host.params, args, reference):
        if isinstance(a, numpy.ndarray) and param.name in written and id(a) not in seen:
            seen.add(id(a))
            found.append((param.name, a, r))
    return found


def _mistaken(ex: Exercise, kernel, grid, seed):
    """The outputs of the library's kernel with named mistakes made, for the diagnosis (an
    error where they do not apply)."""
    def run(mistakes) -> dict:
        text = kernel.source
        for mistake in mistakes:
            if text.count(mistake.old) != 1:
                raise LookupError(f"{kernel.name} has {text.count(mistake.old)} copies of "
                                  f"{mistake.old!r}")
            text = text.replace(mistake.old, mistake.new)
        _, args, _ = launch(ex, seed)
        cudahost.HostKernel(text, kernel.name)(grid, (fused.THREADS,), args)
        return {name: a for name, a, _ in outputs(kernel, args, args)}
    return run


def _regions(kernel, args) -> list[Region]:
    """The launch's masks, for the diagnosis: where a bool array (dropout's keep) is false and
    true, and the rows whose target is the padding id."""
    named = {p.name: a for p, a in zip(kernel.host.params, args)}
    found = []
    for name, a in named.items():
        if isinstance(a, numpy.ndarray) and a.dtype == bool:
            found += [Region(f"where {name} is false (the element dropped)", ~a),
                      Region(f"where {name} is true (the element kept)", a)]
    if isinstance(named.get("targets"), numpy.ndarray) and "pad_id" in named:
        padding = named["targets"] == int(named["pad_id"])
        found += [Region("on the padding rows (target = pad_id)", padding),
                  Region("off the padding rows (target != pad_id)", ~padding)]
    return found


def _written(kernel) -> set[str]:
    """The parameters a kernel writes: its non-const pointers."""
    return {p.name for p in kernel.host.params if p.pointer and not p.const}


def _first_unequal(a, r):
    off = numpy.argwhere(a != r)
    if not off.size:
        return None
    index = tuple(int(i) for i in off[0])
    return index, float(a[index]), float(r[index])


def _fault_words(fault: dict, path: Path, text: str) -> str:
    """A fault of the learner's kernel (:func:`run_kernel`'s), at its line."""
    where = []
    if fault.get("block") is not None:
        where.append(f"block {tuple(fault['block'])}")
    if fault.get("thread") is not None:
        where.append(f"thread {tuple(fault['thread'])}")
    lines = text.splitlines()
    line = int(fault.get("line") or 0)
    out = f"{fault.get('what')}" + (f" ({', '.join(where)})" if where else "")
    if fault.get("timed_out"):
        out += "; it was stopped at the time limit (--time-limit)"
    if 0 < line <= len(lines):
        out = f"{path.name}, line {line}: " + out + f"\n    {lines[line - 1].strip()}"
    return out


def shapes_hint(ex: Exercise) -> str:
    kernel = kernel_of(ex)
    grid, args, words = launch(ex)
    return (f"{words}; blockIdx.x runs over grid {grid}, threadIdx.x over 0..{fused.THREADS - 1}; "
            + ", ".join(f"{p.name} {_describe(a)}" for p, a in zip(kernel.host.params, args)))


def third_hint(ex: Exercise) -> str:
    """The first line of the library's kernel body: how it starts."""
    body = body_of(kernel_of(ex).source, kernel_of(ex).name)
    first = next((line.strip() for line in body.splitlines() if line.strip()), "")
    return f"the library's kernel starts: {first}"
