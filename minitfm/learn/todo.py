"""The TODO of a function to write: one call the exercise's check makes of it, with every input,
cache field and output, in rows. Host-only code (text).

    # TODO: write backward. In the check's case "linear" it gets:
    #   dy           (3, 5, 7)       the gradient of the loss with respect to the forward ...
    #   cache        Cache           from the forward pass:
    #     .x         (3, 5, 6)       (..., d_in) the input (in float16 under mixed precision)
    # and returns (dx, grads):
    #   dx           (3, 5, 6)       the gradient of x
    #   grads        dict, 2 arrays  the parameters' gradients, by name:
    #     ["w"]      (6, 7)

A row holds a name, a value and words, each in a column of its own: an array by its shape (and
its type where it is not float64), a number as a reader writes it (``source.number``: 1.4286),
a type by its name (float64), a cache by its class, a dict by its size, then a row per entry.
The call is the one the check's backward pass makes (the output layer's ``forward_backward``
is called by the case's forward pass too, without ``dloss``), and the words of ``out`` say what
it is in a model: the gradient rule of ``minitfm/layers/__init__.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import textwrap

import numpy

from minitfm import backend
from minitfm.learn import source
from minitfm.learn.cases import ALL_CASES, case_sizes, constants, run_case
from minitfm.learn.exercise import Exercise
from minitfm.learn.learner import recorders, substituted
from minitfm.learn.modelcheck import model_batch, model_cases, model_loss

__all__ = ["layer_calls", "model_calls", "todo_lines", "value_text", "WIDTH"]

WIDTH = 88          # a TODO line's text, after the comment's "# "
LISTED = 6          # a dict of more entries shows its first LISTED - 1, then how many more
RULE = "the gradient rule, minitfm/layers/__init__.py"

OUTPUT_WORDS = "the gradient of the loss with respect to the forward pass's output"
PARAMETERS = {
    "out": "None in the check: return new arrays. In a model, the arrays to write the gradients "
           "into, by grads' names: overwrite and return them (" + RULE + "), or leave it: the "
           "workshop's train writes what you return there",
    "dq_out": "None in this call: return a new array. Given (self_backward and cross_backward "
              "pass views of their merged heads, and the library's read them after), write dq "
              f"there and return it ({RULE})",
    "dk_out": "as dq_out, for dk", "dv_out": "as dq_out, for dv",
    "sublayer_backward": "the sub-layer's backward: sublayer_backward(df, cache.sublayer) -> "
                         "(dh, *rest), rest its other gradients",
    "dloss": "the gradient of the loss with respect to loss_sum",
}
ADDS = ("(the table's uses sum there: the one exception to " + RULE + ")")
WORDS = {   # (exercise, parameter): words where that exercise's differ from PARAMETERS'
    ("embedding", "out"): 'None in the check: return a new array. In a model, {"table": the '
                          f'table\'s gradient array}}: add the gradient into it {ADDS} and '
                          "return it in grads, or leave it: the workshop's train adds what you "
                          "return there",
    ("inputs", "out"): 'None in the check: return new arrays. In a model, {"table"[, '
                       '"positions"]}: add the table\'s gradient into out["table"] ' + ADDS +
                       ', overwrite out["positions"], and return them in grads, or leave it: '
                       "the workshop's train does so with what you return",
    ("residual", "out"): "None in the check: return new arrays. In a model, the LayerNorm's "
                         'gradient arrays {"gamma", "beta"} (the sub-layer\'s are '
                         "sublayer_backward's to write): overwrite them and return them in "
                         f"grads ({RULE}), or leave it: the workshop's train writes what you "
                         "return there",
    ("softmax", "p"): "P, the forward pass's output (its own cache)",
    ("softmax", "scale"): "c, the scores' scale",
    ("output", "h"): "the decoder's output at the N positions that have a target: the "
                     "projection's input",
    ("output", "p"): 'the parameters: p["table"] is the token embedding E (V, d), which the '
                     "projection shares (the check's p holds the case's other arrays too)",
    ("output", "targets"): "the target ids, one a row",
    ("output", "smoothing"): "label smoothing's eps",
    ("output", "dloss"): "the gradient of the loss with respect to loss_sum. Given, as here: "
                         "the backward pass runs too; None: the forward pass alone, dh and "
                         "grads None",
    ("output", "out"): 'None in the check: return a new array. In a model, {"table": the '
                       "array to write dE into}: overwrite it and return it in grads "
                       f"({RULE}), or leave it: the workshop's train writes what you return "
                       "there",
    ("output", "loss_scale"): "None in the check and in the workshop's train; under mixed "
                              "precision, a 0-d array that multiplies dloss (the losses "
                              "returned are not scaled)",
    ("model", "dh"): "the gradient of the loss with respect to h, the decoder stack's output",
    ("model", "c_src"): "the source side's, from the forward pass:",
    ("model", "c_tgt"): "the target side's, from the forward pass:",
    ("model", "out"): "one array per parameter of the model, by its name and of its shape: "
                      "write every gradient into it, as stacks_backward returns nothing. "
                      "out[tgt_name] holds the output projection's gradient already: add the "
                      "target embedding's to it; the others hold whatever the buffer held "
                      f"(zeros in the check): overwrite them ({RULE})",
    ("model", "src_name"): "the name in out of the source embedding's table: tgt_name itself "
                           "where the model shares one table (its uses add up there)",
    ("model", "tgt_name"): "the name in out of the target embedding's table, which the output "
                           "projection shares",
}
RETURNS = {  # (exercise, function): the names of what it returns, where the case's are not
    ("output", "forward_backward"): (("loss_sum", "nll_sum"), "dh", "grads"),
}
RETURN_WORDS = {
    "loss_sum": "the label-smoothed loss, summed over the rows",
    "nll_sum": "the negative log-likelihood, summed over the rows (reported, not trained)",
    "None": "the ids are integers: no gradient",
    "rest": "what sublayer_backward returned after its dh: the sub-layer's other gradients",
}
NONE_WITHOUT_DLOSS = {"dh": "the gradient of h (None without dloss)",
                      "grads": 'the table\'s gradient dE, as {"table": dE} (None without dloss):'}


# ---- the call -----------------------------------------------------------------------------------

def layer_calls(ex: Exercise) -> dict:
    """For each function to write, a call the library makes of it in the exercise's gradient
    checks: ``(case name, bound arguments, result)``, the first the backward pass makes (after
    the case's forward pass), or else the first."""
    def run(library, case_name, functions, phase):
        case = ALL_CASES[case_name]

        def forward(*args, _forward=case.forward):
            phase["backward"] = False
            try:
                return _forward(*args)
            finally:
                phase["backward"] = True
        with constants(ex, library):
            run_case(dataclasses.replace(case, forward=forward), case_sizes(ex, case), 0,
                     library, functions)
    return _recorded(ex, run)


def model_calls(ex: Exercise) -> dict:
    """:func:`layer_calls` of the model's exercise: the calls in its model cases."""
    models = model_cases(ex)

    def run(library, case_name, functions, phase):
        with substituted(library, functions):
            model_loss(library, models[case_name], *model_batch(models[case_name], 0))
    return _recorded(ex, run)


def _recorded(ex: Exercise, run) -> dict:
    """The calls of the functions to write as ``run(library, case name, functions, phase)``
    runs each case with ``functions`` in the library's place (``phase["backward"]`` False
    while the case's forward pass runs)."""
    library = importlib.import_module(ex.module)
    found: dict = {}
    with backend.using("numpy"):
        for case_name in ex.cases:
            phase = {"backward": True}
            functions, seen = recorders(library, ex.write, lambda: phase["backward"])
            run(library, case_name, functions, phase)
            for name, made in seen.items():
                backward = [(arguments, result) for late, arguments, result in made if late]
                found.setdefault(name, (case_name, *(backward or [made[0][1:]])[0]))
    return found


# ---- the rows ------------------------------------------------------------------------------------

def _is_record(value) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def value_text(value, module: str = "") -> str:
    """A value as a row shows it (a cache of another module than ``module`` by its module's
    name too: ``linear.Cache``)."""
    if _is_record(value):
        where = type(value).__module__
        return type(value).__name__ if where == module else \
            f"{where.rsplit('.', 1)[-1]}.{type(value).__name__}"
    if isinstance(value, numpy.dtype):
        return value.name
    if isinstance(value, type) and issubclass(value, numpy.generic):
        return numpy.dtype(value).name
    if hasattr(value, "shape") and hasattr(value, "dtype") and not numpy.isscalar(value):
        kind = "" if value.dtype == numpy.float64 else f" {value.dtype}"
        return (str(tuple(int(s) for s in value.shape)) if value.ndim else "0-d array") + kind
    if value is None or isinstance(value, (bool, numpy.bool_, int, float, numpy.number)):
        return source.number(value) if value is not None else "None"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return f"dict, {len(value)} array{'s' if len(value) != 1 else ''}" if value else "{}"
    if isinstance(value, tuple) and all(isinstance(v, (int, numpy.integer)) for v in value):
        return f"tuple {tuple(int(v) for v in value)}"
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(v).__name__ for v in value})
        return f"{type(value).__name__} of {len(value)} {'/'.join(kinds)}"
    return "function" if callable(value) else type(value).__name__


def _rows(ex: Exercise, name: str, value, words: str, indent: str, depth: int = 0) -> list:
    """The rows of one value: its own, then a cache's fields (a cache of the exercise's module
    inside it too), or a dict's entries."""
    rows = [(indent + name, value_text(value, ex.module), words)]
    if _is_record(value) and depth < 2:
        if depth == 0 or type(value).__module__ == ex.module:   # not a cache of another layer
            comments = _field_comments(type(value))
            for field in value._fields:
                rows += _rows(ex, "." + field, getattr(value, field), comments.get(field, ""),
                              indent + "  ", depth + 1)
    elif isinstance(value, dict) and value:
        items = list(value.items())
        shown = items if len(items) <= LISTED else items[:LISTED - 1]
        rows += [(f'{indent}  ["{k}"]', value_text(v, ex.module), "") for k, v in shown]
        if len(shown) < len(items):
            rows.append((indent + "  ...", f"{len(items) - len(shown)} more", ""))
    return rows


def _field_comments(cls) -> dict:
    """The comments beside a cache class's fields in the library's source: field -> words."""
    text = source.module_source(cls.__module__)
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            found = {}
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    line = lines[item.lineno - 1]
                    found[item.target.id] = line.split("#", 1)[1].strip() if "#" in line else ""
            return found
    return {}


def _table(items: list) -> list[str]:
    """Rows (name, value, words) in three columns, the words wrapped in theirs; a string is a
    line of its own, wrapped."""
    rows = [item for item in items if not isinstance(item, str)]
    name_w = max((len(r[0]) for r in rows), default=0)
    value_w = max((len(r[1]) for r in rows), default=0)
    lead = name_w + value_w + 4
    lines = []
    for item in items:
        if isinstance(item, str):
            lines += textwrap.wrap(item, WIDTH, break_on_hyphens=False)
            continue
        name, value, words = item
        wrapped = textwrap.wrap(words, max(WIDTH - lead, 28), break_on_hyphens=False) or [""]
        lines.append(f"{name:<{name_w}}  {value:<{value_w}}  {wrapped[0]}".rstrip())
        lines += [" " * lead + w for w in wrapped[1:]]
    return lines


# ---- the TODO ------------------------------------------------------------------------------------

def todo_lines(ex: Exercise, name: str, call) -> list[str]:
    """The TODO of function ``name``: every input, cache field and output of one call of the
    check (``call``, as :func:`layer_calls` gives it), and how to check it."""
    case_name, arguments, result = call
    items: list = [f"TODO: write {name}. In the check's case \"{case_name}\" it gets:"]
    for k, (param, value) in enumerate(arguments.items()):
        words = WORDS.get((ex.name, param)) or PARAMETERS.get(param) or (
            OUTPUT_WORDS if k == 0 and name.endswith("backward") else "")
        if _is_record(value) and not words:
            words = "from the forward pass:"
        items += _rows(ex, param, value, words, "  ")
    items += _returned(ex, name, ALL_CASES[case_name], arguments, result)
    items.append(f"Check it: python -m minitfm.learn check {ex.name}")
    return _table(items)


def _names(ex: Exercise, name: str, case, arguments, result):
    """The names of what a call returns, in the shape of ``result``."""
    if (ex.name, name) in RETURNS:
        return RETURNS[(ex.name, name)]
    inputs = [f"d{n}" if n else "None" for n in case.d_inputs]
    if not isinstance(result, tuple):
        return inputs[0] if len(inputs) == 1 else "result"
    if "sublayer_backward" in arguments and len(result) >= 2:
        return ("dx", *["rest"] * (len(result) - 2), "grads")
    if len(result) == len(inputs) + 1 and isinstance(result[-1], dict):
        return (*inputs, "grads")
    return tuple(f"result[{k}]" for k in range(len(result)))


def _returned(ex: Exercise, name: str, case, arguments, result) -> list:
    """The TODO's lines on what the call returns: a heading, then a row of each thing."""
    if result is None:
        return ["and returns None: every gradient is written into out."]
    names = _names(ex, name, case, arguments, result)
    if not isinstance(names, tuple):
        return [f"and returns {names}:", *_returned_rows(ex, names, result, case)]
    form = ", ".join(f"({', '.join(n)})" if isinstance(n, tuple) else
                     "*rest" if n == "rest" else n for n in dict.fromkeys(names))
    items: list = [f"and returns ({form}):"]
    for n, value in zip(names, result):
        for sub, v in (zip(n, value) if isinstance(n, tuple) else [(n, value)]):
            items += _returned_rows(ex, sub, v, case)
    return items


def _returned_rows(ex: Exercise, name: str, value, case) -> list:
    if ex.name == "output" and name in NONE_WITHOUT_DLOSS:
        words = NONE_WITHOUT_DLOSS[name]
    elif name == "grads":
        words = "the parameters' gradients, by name:" if value else "no parameters"
    elif name.startswith("d") and name[1:] in case.d_inputs:
        words = f"the gradient of {name[1:]}"
    else:
        words = RETURN_WORDS.get(name, "")
    if isinstance(value, (float, numpy.floating)):      # its value is the check's, not a rule
        return [("  " + name, "number", words)]
    return _rows(ex, name, value, words, "  ")
