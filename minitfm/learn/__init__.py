"""The workshop: write each backward pass of the Transformer yourself, be told what is wrong,
then train a model on your own code.

    python -m minitfm.learn list                 the exercises in reading order, and progress
    python -m minitfm.learn start                the next exercise, into ./workshop
    python -m minitfm.learn check                the current one: every gradient held to finite
                                                 differences, a wrong one diagnosed
    python -m minitfm.learn watch                check at every save, on to the next as each passes
    python -m minitfm.learn hint NAME            the shapes, the chain-rule step, the derivation
    python -m minitfm.learn solution NAME        the library's own code, once it passes
    python -m minitfm.learn train                the copy task on your passing code, beside the
                                                 library's
    python -m minitfm.learn reset NAME           start over, the old attempt kept

Every exercise is made from the library's source when it is started (``source.py``): a layer's
file with its forward pass, its cache and its derivation, and its backward pass's body replaced
by a TODO naming every input, cache field and output with its shape. Twenty-one exercises
(``exercises.py``): every layer of ``minitfm/layers/`` with a backward pass, Adam with the
paper's schedule, the whole encoder-decoder backward, and four CUDA kernels, which run on the
CPU (``kernels.py``, :mod:`minitfm.cudahost`). A check (``check.py``) runs the gradient checks of
:mod:`minitfm.gradcheck` with the learner's code in place of the library's (``learner.py``: the
learner's file loaded and put in place; the whole model's and Adam's checks in
``modelcheck.py`` and ``adamcheck.py``) and diagnoses each wrong gradient from the two arrays
(``diagnose.py``): a constant factor and which, a transpose, a sum missing over an axis, a term
of the derivation missing or with the wrong sign, the wrong cache field. The folder and its progress: ``workshop.py``; training on the learner's code:
``train.py``. Host-only code: the workshop runs on NumPy.
"""
