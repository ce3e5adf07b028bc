"""The command line, a package of its own: the library never imports it.

``train_toy.py``, ``train_wmt.py``, ``train_lm.py`` (their code in :mod:`minitfm.commands`) and
``python -m minitfm.translate / average / plot / launch`` are thin front ends over the library;
what they have in common lives here once, so that all behave alike:

- :mod:`minitfm.cli.options`: the one vocabulary of options, each declared once, and the one
  object that carries them into the library; :mod:`minitfm.cli.argtypes`, the values' types;
- :mod:`minitfm.cli.exits`: the one table of exit statuses; :mod:`minitfm.cli.reporting`, how
  ``main()`` reports errors and signals;
- :mod:`minitfm.cli.limits`: sizes checked against the libraries' limits and the memory, before
  any work;
- :mod:`minitfm.cli.placing`: the backend, each worker's GPU or BLAS threads, the precision and
  the fast path; :mod:`minitfm.cli.runs`, a training run's directory, its model config from the
  options, and how to continue one a signal stopped.

And the commands' front ends: :mod:`minitfm.cli.translate`, :mod:`minitfm.cli.average`,
:mod:`minitfm.cli.plot` (over :mod:`minitfm.decoding.translation`, :mod:`minitfm.averaging`,
:mod:`minitfm.plotting`), :mod:`minitfm.cli.launch` (``mpiexec``, with a closed terminal that
saves) and :mod:`minitfm.cli.wmt` (the translation recipe ``train_wmt.py`` runs). The modules
``minitfm.translate``, ``average``, ``plot`` and ``launch`` only run them, so that ``python -m``
names the command.
"""
