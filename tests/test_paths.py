"""The choice of a layer call's path (minitfm/paths.py): the plain function where the chooser
says None, the fast one it names otherwise, with the call's own arguments; the plain function
stays reachable (``.plain``, ``__wrapped__``, its source)."""

import inspect

import pytest

from minitfm import paths


def make(calls: list):
    """A function with a fast path beside it; ``calls`` records which ran, with what."""

    @paths.fast
    def forward(x, p, scale=1.0):
        """The plain code."""
        calls.append(("plain", x, p, scale))
        return x * p * scale

    def fast_forward(x, p, scale=1.0):
        calls.append(("fast", x, p, scale))
        return x * p * scale

    @forward.chooser
    def _forward_path(x, p, scale=1.0):
        calls.append(("choose", x, p, scale))
        return fast_forward if x > 10 else None

    return forward, fast_forward, _forward_path


def test_the_plain_function_runs_where_the_chooser_says_none():
    calls = []
    forward, _, _ = make(calls)
    assert forward(2, 3, scale=0.5) == 3.0
    assert calls == [("choose", 2, 3, 0.5), ("plain", 2, 3, 0.5)]


def test_the_fast_function_runs_where_the_chooser_names_it():
    calls = []
    forward, _, _ = make(calls)
    assert forward(20, 3) == 60
    assert calls == [("choose", 20, 3, 1.0), ("fast", 20, 3, 1.0)]


def test_path_names_what_a_call_would_run_without_running_it():
    calls = []
    forward, fast_forward, _ = make(calls)
    assert forward.path(20, 3) is fast_forward
    assert forward.path(2, 3) is forward.plain
    assert [c[0] for c in calls] == ["choose", "choose"]


def test_the_plain_function_is_reachable():
    forward, _, chooser = make([])
    assert forward.plain is forward.__wrapped__
    assert forward.choose is chooser
    assert forward.__name__ == "forward" and forward.__doc__ == "The plain code."
    assert list(inspect.signature(forward).parameters) == ["x", "p", "scale"]
    source = inspect.getsource(forward)
    assert source.lstrip().startswith("@paths.fast\n") and "calls.append((\"plain\"" in source
    assert "fast_forward" not in source


def test_without_a_chooser_every_call_runs_the_plain_code():
    @paths.fast
    def backward(dy):
        return -dy

    assert backward.choose is None
    assert backward(3) == -3 and backward.path(3) is backward.plain


def test_errors_of_either_path_reach_the_caller():
    @paths.fast
    def forward(x):
        raise ValueError("plain")

    @forward.chooser
    def _path(x):
        return fast if x else None

    def fast(x):
        raise KeyError("fast")

    with pytest.raises(ValueError, match="plain"):
        forward(0)
    with pytest.raises(KeyError, match="fast"):
        forward(1)
