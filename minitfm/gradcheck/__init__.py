"""Finite-difference gradient checks for every layer and for the whole model.

For a layer y = f(x, params) we check its backward pass on the scalar L = sum(G * y), with G a
fixed random array (so every output element matters, each with its own weight). The analytic
gradient is ``backward(G, cache)``; the numerical one perturbs each input element in turn:

    dL/dx_i ~ (-L(x_i + 2h) + 8 L(x_i + h) - 8 L(x_i - h) + L(x_i - 2h)) / (12 h)

five-point central differences in float64, error O(h^4), and the two are compared by the
relative error

    ||analytic - numeric|| / max(||analytic||, ||numeric||)

which must not exceed 1e-6 (typical values here are 1e-10 to 1e-8).

The step balances truncation, O(h^4), large for strongly curved functions (a LayerNorm over
three features), against rounding, O(eps |L| / h), large for gradients much smaller than L:
h = 2e-5 keeps both near 1e-9 for almost every array. A ReLU's kink at 0 needs a small h (a
quotient whose points straddle it means nothing); an array whose gradient is ~1e-6 of L (a
LayerNorm shift deep in a stack, the query bias of a cross-attention over one or two source
tokens) needs a large one. So an array whose error exceeds the tolerance at 2e-5 is measured
again at 1e-4 (against rounding), then at 4e-6 (against a kink), then at 5e-4 (against the
rounding of a gradient ~1e-6 of L, where 1e-4 still loses ~2e-6), and its smallest error counts;
a wrong backward pass fails at every step (the checker's own tests hold it to that). Rounding is also why inputs keep activations at unit scale, and why attention is drawn
with d_model >= 2: a saturated softmax has gradients so small next to L that no h resolves them.

    python -m minitfm.gradcheck              # every layer and the whole models, as a table
    python -m minitfm.gradcheck layernorm    # the cases whose name contains "layernorm"
    python -m minitfm.gradcheck --directions 3   # each array along 3 random directions instead

``--directions N`` (``check_directions``) compares the analytic gradient projected on each of N
random directions u of an array with the same five-point quotient along u: four evaluations a
direction, not an element, so a whole model is checked in a tenth of the time; a gradient wrong
in one element is off along every direction by about as much as that element is wrong.

The package: ``check.py`` the checker (:class:`~minitfm.gradcheck.check.Case`: sizes, inputs,
forward, backward, tolerance; :func:`~minitfm.gradcheck.check.check_case`), ``cases.py`` the
table of cases, one row each (``CASES`` for the layers, ``MODEL_CASES`` for the whole models; a
new layer adds one row), ``__main__.py`` the command line. Exit status 1 if any check fails, 2
for a bad option (minitfm/cli/exits.py).
"""
