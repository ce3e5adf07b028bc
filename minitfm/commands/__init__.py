"""The training commands: ``train_toy.py``, ``train_wmt.py`` and ``train_lm.py``, each a thin
front end over the library (its options, its data, the run's first and last lines).

Each runs as ``python train_wmt.py`` from a clone (the scripts at the top of the repository call
these modules), as ``minitfm-train-wmt`` once installed, or as
``python -m minitfm.commands.train_wmt``. Their shared options are declared once, in
:mod:`minitfm.cli.options`; what they share besides, in :mod:`minitfm.cli`.
"""
