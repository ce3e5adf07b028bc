"""What every model is: the interface the training loop, checkpoints and front ends use, and the
pieces of a model that are not layers (initial values, input checks), shared by every model.

A model is anything with the members of :class:`Model`: a module (``models/translator.py``,
``models/lm.py``) or an object. Its config is a frozen dataclass with ``to_dict``/``from_dict``,
``replace`` and ``d_model``; its parameters are one flat dict of named arrays; its batches are
pairs of integer arrays ``(inputs, targets)`` whose meaning is its own. The registry
(``minitfm.models``) finds a model by the kind its checkpoints record, or by its config.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Protocol

from minitfm import backend, flat

# The config fields that are dropout rates (in every config that has dropout): residual and
# embedding, attention weights, feed-forward hidden units, whole input tokens. Late dropout sets
# them all to 0.
DROPOUTS = ("dropout", "attention_dropout", "relu_dropout", "word_dropout")


class ModelConfig(Protocol):
    """What the loop reads of a config: its width (the paper's learning-rate schedule), its
    fields as JSON (checkpoints) and a copy with fields changed (late dropout)."""

    d_model: int

    def to_dict(self) -> dict: ...

    def replace(self, **changes) -> ModelConfig: ...


class Model(Protocol):
    """The interface of a model, as the shared training loop, checkpoints and front ends see it.

    Batches are ``(a, b)`` pairs of integer arrays, host (NumPy) arrays preferably: the
    translator's are ``(src, tgt)``, the language model's ``(x, y)``.
    """

    KIND: ClassVar[str]          # what its checkpoints record as their kind: the registry's key
    DESCRIPTION: ClassVar[str]   # the kind in words, for messages ("a decoder-only language model")
    Config: ClassVar[type]       # its config class (``Config.from_dict(ckpt.config)``)

    def parameter_shapes(self, cfg) -> dict[str, tuple[int, ...]]:
        """Every parameter's name and shape, in the order of checkpoints and initial values."""

    def init_params(self, cfg, seed: int = 0, dtype=None) -> dict:
        """Initial parameters, reproducibly from ``seed``, in one flat buffer."""

    def check_params(self, params: dict, cfg) -> None:
        """Raise a clear error unless ``params`` fits ``cfg`` and lives on the active device."""

    def loss_and_grads(self, params: dict, cfg, a, b, rng=None, *, grads: bool = True,
                       normalizer: float | None = None, out: dict | None = None,
                       loss_scale=None) -> tuple[dict, dict | None]:
        """``(stats, grads)`` of one batch: stats has "loss" and "nll" (0-d arrays, normalised
        by ``normalizer``, default the batch's targets) and "tokens" (an int); grads is written
        into ``out`` when given (see the gradient rule in layers/__init__.py). ``rng``: dropout
        masks (None: none). ``loss_scale``: a 0-d device array multiplying the gradients
        (mixed precision, minitfm.gradscale)."""

    def batch_tokens(self, batch: tuple, cfg) -> int:
        """The number of targets of a batch, counted on the host."""

    def output_vocab(self, cfg) -> int:
        """The number of tokens the model chooses from at each position."""

    def batch_bytes(self, cfg, *, rows: int, src_len: int, tgt_len: int, float_bytes: int,
                    attention: bool = True) -> tuple[int, int]:
        """``(device, host)`` bytes one training batch of ``rows`` rows of ``src_len`` inputs and
        ``tgt_len`` targets takes beyond the model state, for the memory check before a run
        (:mod:`minitfm.cli.limits`); ``attention=False`` leaves out the ``B H T^2`` score terms,
        which depend on the sentence lengths."""

    def logits(self, params: dict, cfg, h) -> Any:
        """The output projection of final states h (..., d) -> (..., V): where each model's
        decoding entry points end (the translator's ``decoder_step``, driven by decode.py; the
        language model's ``step``, driven by generation.py)."""


MEMBERS = ("KIND", "DESCRIPTION", "Config", "parameter_shapes", "init_params", "check_params",
           "loss_and_grads", "batch_tokens", "output_vocab", "batch_bytes", "logits")


def check_dropouts(cfg) -> None:
    """Refuse a config whose dropout rates (``DROPOUTS``) are not in [0, 1)."""
    for field in DROPOUTS:
        value = getattr(cfg, field)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{type(cfg).__name__}.{field} must be in [0, 1), got {value!r}")


def check_positive_ints(cfg, fields) -> None:
    """Refuse a config whose ``fields`` are not positive integers."""
    for field in fields:
        value = getattr(cfg, field)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{type(cfg).__name__}.{field} must be a positive integer, "
                             f"got {value!r}")


# ---- parameters ---------------------------------------------------------------------------

def initial_values(shapes: dict, d_model: int, seed: int = 0, dtype=None,
                   normal: dict | None = None) -> dict:
    """Initial values for the parameters ``shapes`` names, by the kind of each (its name):

    - the tables ``normal`` names (token embeddings, a learned position table): N(0, std^2) with
      the std it gives (token embeddings d_model^-1/2, so that the embedding times sqrt(d_model)
      has unit scale; learned positions GPT-2's 0.02, so that at first the model sees mostly the
      tokens);
    - other weight matrices: Xavier/Glorot uniform, U(-a, a) with a = sqrt(6 / (fan_in +
      fan_out)), applied to each d_model x d_model block of the fused projections separately
      (each block is one of the paper's W_Q, W_K, W_V);
    - biases 0, LayerNorm gains 1 and shifts 0.
    Values are drawn on the host, in the order of ``shapes``, and copied to the active backend,
    into views of one flat buffer (:class:`minitfm.flat.FlatDict`), so whole-model passes (Adam,
    clipping) are one operation.
    """
    dtype = dtype or backend.float_dtype()
    normal = normal or {}
    rng = backend.host_rng(seed)
    params = flat.zeros(shapes, dtype)
    for name, shape in shapes.items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "gamma":
            params[name] = 1.0
            continue
        if len(shape) == 1:
            continue
        if name in normal:
            value = rng.normal(0.0, normal[name], size=shape)
        else:
            fan_in, fan_out = shape
            blocks = fan_out // d_model if leaf in ("w_qkv", "w_kv") else 1
            fan_out //= blocks
            a = math.sqrt(6.0 / (fan_in + fan_out))
            value = rng.uniform(-a, a, size=shape)
        params[name] = backend.to_device(value, dtype=dtype)
    return params


def num_parameters(params: dict) -> int:
    return sum(int(v.size) for v in params.values())


# ---- input checks -------------------------------------------------------------------------

def check_param_shapes(params: dict, shapes: dict) -> None:
    """Raise a clear error unless ``params`` holds exactly ``shapes``' names and shapes, in one
    float dtype, on the active device."""
    xp, first = backend.xp, next(iter(params.values()), None)
    if (len(params) == len(shapes) and isinstance(first, xp.ndarray)
            and all(type(params.get(k)) is type(first) and params[k].shape == shape
                    and params[k].dtype == first.dtype for k, shape in shapes.items())):
        return                      # the usual case, in one pass; else find what is wrong
    missing = [k for k in shapes if k not in params]
    extra = [k for k in params if k not in shapes]
    if missing or extra:
        raise ValueError(f"parameters do not match the config: missing {missing[:5]}, "
                         f"unexpected {extra[:5]}")
    dtype = None
    for name, shape in shapes.items():
        value = backend.check_array(params[name], f"parameter {name!r}")
        if tuple(value.shape) != shape:
            raise ValueError(f"parameter {name!r} has shape {tuple(value.shape)}, the config "
                             f"needs {shape}")
        if dtype is None:
            dtype = value.dtype
        elif value.dtype != dtype:
            raise TypeError(f"parameter {name!r} is {value.dtype} but the others are {dtype}: "
                            f"all parameters must share one float dtype")


def check_tokens(ids, what: str, vocab: int, cfg, min_len: int = 1, max_len=None,
                 host: bool = False):
    """Return ``ids`` after checking it is a 2-D integer array of valid token ids, of at most
    ``max_len`` positions (default ``cfg.max_len``); ``host=True``: a host (NumPy) array."""
    if not host:
        ids = backend.check_array(ids, what)
    max_len = cfg.max_len if max_len is None else max_len
    if ids.ndim != 2:
        raise ValueError(f"{what} must be a 2-D (batch, length) array of token ids, "
                         f"got shape {tuple(ids.shape)}")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{what} must hold integer token ids, got dtype {ids.dtype}")
    if ids.shape[0] == 0 or ids.shape[1] < min_len:
        raise ValueError(f"{what} has shape {tuple(ids.shape)}: it needs at least one sentence "
                         f"and at least {min_len} positions")
    if ids.shape[1] > max_len:
        raise ValueError(f"{what} has length {ids.shape[1]} > {max_len} ({type(cfg).__name__}"
                         f".max_len={cfg.max_len}): truncate the input or raise max_len")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"{what} holds token ids in [{lo}, {hi}], outside the vocabulary "
                         f"[0, {vocab - 1}]: was the data encoded with another vocabulary?")
    return ids
