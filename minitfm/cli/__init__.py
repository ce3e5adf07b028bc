"""The command line: what the commands share, so that all behave alike.

``train_toy.py``, ``train_wmt.py``, ``train_lm.py`` and ``python -m minitfm.translate / average /
plot`` are thin front ends over the library; the glue they have in common lives here once:

- :mod:`minitfm.cli.placing`: the backend, each worker's GPU or BLAS threads, the precision and
  the fast path;
- :mod:`minitfm.cli.runs`: a training run's directory, its model config from the options, and
  how to continue one a signal stopped;
- :mod:`minitfm.cli.reporting`: how ``main()`` reports errors and signals.

The library never imports this package.
"""
