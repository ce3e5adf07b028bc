"""The models, behind one interface (:class:`base.Model`), and the registry of their kinds.

The registry is the one list of the kinds of model: it maps the kind a checkpoint records
(``KIND``) to the model, and a config's class to its model, so the training loop, checkpoints and
the commands that read them never ask which model they hold (:func:`of`, :func:`get`).

    translator   the encoder-decoder Transformer ("transformer"): translation, toy tasks
    lm           the decoder-only language model ("lm")

A new model is one module (or object) with the members of ``base.Model`` that calls
:func:`register` with itself; its front end imports it. Nothing else changes.
"""

from __future__ import annotations

from minitfm.models.base import DROPOUTS, MEMBERS, Model, ModelConfig

__all__ = ["Model", "ModelConfig", "DROPOUTS", "register", "unregister", "get", "of", "kinds",
           "describe"]

_by_kind: dict[str, Model] = {}
_by_config: dict[type, Model] = {}


def register(model: Model) -> Model:
    """Add ``model`` to the registry under its ``KIND``; return it (usable as a decorator)."""
    missing = [name for name in MEMBERS if not hasattr(model, name)]
    if missing:
        raise TypeError(f"{model!r} is not a model: it lacks {', '.join(missing)} (see "
                        f"minitfm.models.base.Model)")
    kind = model.KIND
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"a model's KIND must be a non-empty string, got {kind!r}")
    if _by_kind.get(kind, model) is not model:
        raise ValueError(f"a model of kind {kind!r} is registered already: choose another KIND")
    if _by_config.get(model.Config, model) is not model:
        raise ValueError(f"{model.Config.__name__} is the config of another registered model")
    _by_kind[kind] = model
    _by_config[model.Config] = model
    return model


def unregister(kind: str) -> None:
    """Remove the model of ``kind`` (a test's own model, once the test is done)."""
    model = _by_kind.pop(kind)
    del _by_config[model.Config]


def kinds() -> list[str]:
    return list(_by_kind)


def get(kind: str) -> Model:
    """The model whose checkpoints record ``kind``."""
    if kind not in _by_kind:
        raise ValueError(f"unknown model kind {kind!r}: one of {', '.join(_by_kind)}")
    return _by_kind[kind]


def of(cfg) -> Model:
    """The model ``cfg`` configures (found by the config's class)."""
    model = _by_config.get(type(cfg))
    if model is None:
        known = ", ".join(f"{m.Config.__name__} ({k})" for k, m in _by_kind.items())
        raise TypeError(f"{type(cfg).__name__} is not the config of a registered model: pass "
                        f"one of {known}")
    return model


def describe(kind: str) -> str:
    """The kind in words, for messages; unknown kinds (a newer file) are named as such."""
    model = _by_kind.get(kind)
    return model.DESCRIPTION if model is not None else f"a model of unknown kind {kind!r}"


from minitfm.models import lm, translator  # noqa: E402  (the built-in models, registered here)

register(translator)
register(lm)
