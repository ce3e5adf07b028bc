import pytest

from minitfm.models import DROPOUTS


def every_run_but_dropout(cases):
    """The whole-model cases as parameters of a check that runs on every ``pytest``, those with
    fixed dropout masks behind the slow marker (CI runs them, and there the checks of many
    batches draw ten of each): dropout is checked on every run in each layer, and in the
    stacks with masks drawn at random (tests/layers/test_gradients.py)."""
    return [pytest.param(case, id=case.name, marks=pytest.mark.slow
                         if any(getattr(case.cfg, name) for name in DROPOUTS) else ())
            for case in cases]
