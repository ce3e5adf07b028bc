"""What the workshop's tests share: an exercise written into a folder of the test's own, as the
library writes it, with mistakes planted where asked."""

import pytest

from minitfm.learn import kernels, source
from minitfm.learn.workshop import Workshop, make


def write_exercise(folder, ex, edits=None, text=None):
    """The exercise ``ex`` in ``folder`` (a workshop), its functions written with the library's
    code, ``edits`` (function -> [(old, new)]) planted in it; its path."""
    workshop = Workshop(folder)
    path = workshop.file(ex)
    if not path.exists():
        workshop.start(ex)
    text = text if text is not None else make(ex)
    if ex.kind == "kernel":
        kernel = kernels.kernel_of(ex)
        body = kernels.body_of(kernel.source, kernel.name)
        for old, new in (edits or {}).get(kernel.name, []):
            assert body.count(old) == 1, old
            body = body.replace(old, new)
        path.write_text(kernels.with_body(text, kernel.name, body), encoding="utf-8")
    else:
        path.write_text(source.filled(text, ex.module, ex.write, edits), encoding="utf-8")
    return path


@pytest.fixture
def folder(tmp_path, numpy_backend):
    return tmp_path / "workshop"
