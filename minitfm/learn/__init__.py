"""The workshop: write each backward pass of the Transformer yourself, be told what is wrong,
then train a model on your own code.

    python -m minitfm.learn list                 the exercises in reading order, and progress
    python -m minitfm.learn start                the next exercise, into ./workshop
    python -m minitfm.learn check                the current one: every gradient held to the
                                                 library's, a wrong one diagnosed
    python -m minitfm.learn watch                check at every save, on to the next as each passes
    python -m minitfm.learn hint NAME            the shapes, the chain-rule step, the derivation
    python -m minitfm.learn solution NAME        the library's own code, once it passes
    python -m minitfm.learn train                the copy task on your passing code, beside the
                                                 library's
    python -m minitfm.learn reset NAME           start over, the old attempt kept

Every exercise is made from the library's source when it is started (``source.py``): a layer's
file with its forward pass, its cache and its derivation, and its backward pass's body replaced
by a TODO naming every input, cache field and output with its shape (``todo.py``).
Twenty-one exercises, a row each (``exercises.py``, the row's fields in ``exercise.py``; their
named mistakes in ``mistakes.py``): every layer of ``minitfm/layers/`` with a backward pass,
Adam with the paper's schedule, the whole encoder-decoder backward, and four CUDA kernels, which
run on the CPU (``kernels.py``, :mod:`minitfm.cudahost`). Each kind of exercise (layer, model,
optimizer, kernel) is one object (``kinds.py``): its making, checking, hints and solution.

A check runs the learner's file in a process of its own, under a time limit (``worker.py``; what
runs there, ``child.py``, reading and loading the file with ``learner.py``; what comes back,
plain data, ``wire.py``), and judges what comes back on the checking side, where none of the learner's code
runs: the gradient checks of :mod:`minitfm.gradcheck` at sizes where no coincidence passes
(``cases.py``, ``check.py``; the whole model's and Adam's in ``modelcheck.py`` and
``adamcheck.py``), each wrong array diagnosed from the two arrays (``diagnose.py``, with what the
library gives with each mistake made, ``alternatives.py``, and where it is wrong,
``locate.py``), and the report on a screen (``report.py``). The folder and its progress:
``workshop.py``; training on the learner's code: ``train.py``; the command line, the one module
that imports the command line's package: ``__main__.py``. Host-only code: the workshop runs on
NumPy.
"""
