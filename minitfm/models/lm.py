"""The generative Transformer: a decoder-only language model.

The paper's decoder is "composed of a stack of N = 6 identical layers [...] In addition to the two
sub-layers in each encoder layer, the decoder inserts a third sub-layer, which performs multi-head
attention over the output of the encoder stack" (section 3.1). Without an encoder there is no
third sub-layer: each layer is the encoder's layer, self-attention then feed-forward, each in a
residual connection with LayerNorm, under the decoder's causal mask (layers/decoder_only.py):

    x (B, T) ids ──inputs: embed·√d + positions, dropout──► N x decoder-only layer (causal)
                 ──► final LayerNorm (pre-LN) ──► h (B, T, d)
    h ──output: h E^T (tied to the embedding E), cross-entropy against y (B, T), the next token
      at every position, averaged over B*T

Pre-LN with a final LayerNorm is the default (GPT-2's arrangement; it trains with larger rates);
the paper's post-LN is ``pre_ln=False``. Positions are the paper's sinusoids, or a learned table
(``learned_positions``, section 3.5's alternative; GPT's choice).

Parameter names (``parameter_shapes``), composed from the layers' declarations:
    emb                          (V, d)   token embedding = output projection
    pos_emb                      (L, d)   learned positions (only with learned_positions)
    layers.{i}.attn.{w_qkv,b_qkv,w_o,b_o}  layers.{i}.ln1.{gamma,beta}
    layers.{i}.ff.{w1,b1,w2,b2}            layers.{i}.ln2.{gamma,beta}
    layers.ln.{gamma,beta}                 (pre-LN only)
The gradient of "emb" is the sum of its two uses: the output projection's and the embedding's.

Generation runs one position at a time over a key/value cache (:class:`KVCache`): ``step`` is
row t of ``forward``, through the input layer at offset t and ``decoder_only.stack_step``;
:mod:`minitfm.decoding.generation` drives it and draws the tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from minitfm import backend, flat
from minitfm.layers import decoder_only, encoder, inputs, out_part, output, prefixed, subdict
from minitfm.models.base import (check_dropouts, check_param_shapes, check_positive_ints,
                                 check_tokens, initial_values)

KIND = "lm"              # what a checkpoint of this model records as its kind
DESCRIPTION = "a decoder-only language model (train_lm.py)"
LATER_FIELDS = {"word_dropout": 0.0}    # a checkpoint saved before these fields: their values


@dataclass(frozen=True)
class LMConfig:
    """Every hyper-parameter of the language model; named presets in ``PRESETS``."""

    vocab: int = 65                 # V: the tokenizer's size
    n_layers: int = 4               # N
    d_model: int = 128
    d_ff: int = 512
    n_heads: int = 4                # h; d_k = d_model / h
    dropout: float = 0.0            # P_drop on the embedding sum and every sub-layer output
    attention_dropout: float = 0.0  # on the attention weights
    relu_dropout: float = 0.0       # on the feed-forward hidden units
    word_dropout: float = 0.0       # whole input tokens' embeddings
    pre_ln: bool = True             # LayerNorm before each sub-layer, and one after the stack
    learned_positions: bool = False  # a learned table instead of the sinusoids
    max_len: int = 256              # the context: the longest sequence the model reads

    def __post_init__(self):
        check_positive_ints(self, ("vocab", "n_layers", "d_model", "d_ff", "n_heads", "max_len"))
        if self.d_model % self.n_heads:
            raise ValueError(
                f"LMConfig.d_model={self.d_model} must be divisible by n_heads={self.n_heads} "
                f"(each head gets d_model / n_heads dimensions)")
        check_dropouts(self)

    @classmethod
    def preset(cls, name: str, **overrides) -> LMConfig:
        """A named preset (``PRESETS``) with fields overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    def replace(self, **changes) -> LMConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LMConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown language-model config fields {sorted(unknown)}")
        return cls(**d)


Config = LMConfig        # the interface's name for it (models.base.Model)

PRESETS = {
    # for gradient checks: every code path, a few hundred parameters
    "tiny": LMConfig(vocab=11, n_layers=2, d_model=8, d_ff=12, n_heads=2, max_len=16),
    # train_lm.py's defaults: character-level tiny Shakespeare below 1.88 nats per character in
    # under a minute on a 2-core CPU (docs/results.md, "Language model"); vocab is the tokenizer's
    "cpu": LMConfig(vocab=65, n_layers=2, d_model=128, d_ff=512, n_heads=4, max_len=48),
    # nanoGPT's documented CPU recipe (4 layers, 4 heads, d 128, context 64)
    "nanogpt-cpu": LMConfig(vocab=65, n_layers=4, d_model=128, d_ff=512, n_heads=4, max_len=64),
}


# ---- parameters ---------------------------------------------------------------------------

def parameter_shapes(cfg: LMConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in a fixed order: the embedding, the learned positions
    (when chosen), then "layers." + the decoder-only stack's names (see decoder_only.py)."""
    table = inputs.param_shapes(cfg.vocab, cfg.d_model,
                                cfg.max_len if cfg.learned_positions else None)
    shapes = {_NAMES[k]: v for k, v in table.items()}
    shapes.update(prefixed(decoder_only.param_shapes(cfg), "layers."))
    return shapes


_NAMES = {"table": "emb", "positions": "pos_emb"}      # the input layer's, in this model


def parameter_names(cfg: LMConfig) -> list[str]:
    return list(parameter_shapes(cfg))


def init_params(cfg: LMConfig, seed: int = 0, dtype=None) -> dict:
    """Initial parameters, reproducibly from ``seed``, by the rules of ``base.initial_values``:
    the embedding N(0, d_model^-1/2), learned positions N(0, 0.02^2)."""
    return initial_values(parameter_shapes(cfg), cfg.d_model, seed, dtype,
                          normal={"emb": cfg.d_model ** -0.5, "pos_emb": 0.02})


def check_params(params: dict, cfg: LMConfig) -> None:
    """Raise a clear error if ``params`` does not fit ``cfg`` or lives on another device."""
    check_param_shapes(params, parameter_shapes(cfg))


def _inputs(tree: dict) -> dict:
    """The input layer's arrays of ``tree`` (parameters or gradients), under its names."""
    return {local: tree[name] for local, name in _NAMES.items() if name in tree}


# ---- the model ----------------------------------------------------------------------------

class ForwardCache(NamedTuple):
    embed: inputs.Cache
    stack: encoder.StackCache         # the decoder-only stack is the encoder's (decoder_only.py)


def forward(params, cfg: LMConfig, x, rng=None):
    """x (B, T) ids -> ``(h (B, T, d), cache)``: the final states, before the output projection."""
    x, c_emb = inputs.forward(x, _inputs(params), cfg.dropout, rng, p_word=cfg.word_dropout)
    h, c_stack = decoder_only.stack_forward(x, subdict(params, "layers."), cfg, rng)
    return h, ForwardCache(c_emb, c_stack)


def logits(params, cfg: LMConfig, h):
    """The output projection tied to the embedding: h (..., d) -> (..., V)."""
    return output.logits(h, {"table": params["emb"]})


def batch_tokens(batch, cfg: LMConfig) -> int:
    """The targets of a batch ``(x, y)``: every position predicts one (there is no padding)."""
    return int(batch[1].size)


def output_vocab(cfg: LMConfig) -> int:
    """The number of tokens the model chooses from at each position."""
    return cfg.vocab


HOST_BYTES_PER_TOKEN = 20       # train_lm's host blocks: int64 indices and windows, int32 x and y


def batch_bytes(cfg: LMConfig, *, rows: int, src_len: int, tgt_len: int, float_bytes: int,
                attention: bool = True) -> tuple[int, int]:
    """``(device, host)`` bytes of one batch of ``rows`` blocks of ``tgt_len`` tokens
    (``src_len``: unused, there is no source); N = rows x tgt_len, f = float_bytes:
    f L (6 N d + 2 N d_ff + B H T^2) + 2 f N V on the device (the layers' activations, the
    logits and their gradient), and the host blocks."""
    n = rows * tgt_len
    scores = rows * cfg.n_heads * tgt_len ** 2 if attention else 0
    device = float_bytes * (cfg.n_layers * (6 * n * cfg.d_model + 2 * n * cfg.d_ff + scores)
                            + 2 * n * cfg.vocab)
    return device, HOST_BYTES_PER_TOKEN * n


def check_blocks(cfg: LMConfig, x, y):
    """Check a batch ``(x, y)`` on the host (as the translator's ``check_batch`` does); return
    host arrays."""
    x, y = backend.host_copy(x, "x"), backend.host_copy(y, "y")
    x = check_tokens(x, "x", cfg.vocab, cfg, host=True)
    y = check_tokens(y, "y", cfg.vocab, cfg, host=True)
    if x.shape != y.shape:
        raise ValueError(f"x has shape {tuple(x.shape)} but y has {tuple(y.shape)}: y holds the "
                         f"next token of every position of x")
    return x, y


def loss_and_grads(params, cfg: LMConfig, x, y, rng=None, *, grads=True, normalizer=None,
                   out=None, loss_scale=None):
    """The cross-entropy of predicting ``y`` from ``x`` and, unless ``grads=False``, the gradient
    of every parameter.

    x (B, T): input ids; y (B, T): the next token at each position (x shifted by one). Host
        (NumPy) arrays are best: they are checked on the host, then copied to the device.
    rng: a generator from ``backend.rng(...)`` for dropout, or None for no dropout (evaluation).
    normalizer: the loss is summed over the B*T targets and divided by this (default B*T; pass
        the target count of a whole accumulated update to make gradient accumulation exact).
    out: a dict of arrays with the keys and shapes of ``params`` into which the gradients are
        written, overwriting it; default: new arrays, in one flat buffer (:mod:`minitfm.flat`).
    loss_scale: a 0-d device array multiplying the gradients (mixed precision's loss scale).

    Returns ``(stats, grads)`` as the translator's ``loss_and_grads`` does: stats has "loss" and
    "nll" (the same number: no label smoothing) as 0-d arrays of the backend, and "tokens" (B*T,
    an int); grads is a dict with the keys of ``params`` (None when ``grads=False``).
    """
    check_params(params, cfg)
    x, y = check_blocks(cfg, x, y)
    x, y = backend.to_device(x), backend.to_device(y)
    h, cache = forward(params, cfg, x, rng)                               # (B, T, d)
    b, t, d = h.shape
    n_tokens = b * t
    norm = float(normalizer) if normalizer is not None else float(n_tokens)
    if grads and out is None:
        out = flat.zeros_like(params)
    (loss_sum, _), dh, _ = output.forward_backward(
        h.reshape(n_tokens, d), {"table": params["emb"]}, y.reshape(-1), 0.0,
        1.0 / norm if grads else None, {"table": out["emb"]} if grads else None,  # writes emb
        loss_scale)
    loss_sum /= norm
    stats = {"loss": loss_sum, "nll": loss_sum, "tokens": n_tokens}
    if not grads:
        return stats, None
    dx, _ = decoder_only.stack_backward(dh.reshape(b, t, d), cache.stack,
                                        out_part(out, "layers."))
    # the input embedding's gradient adds to the output projection's in out["emb"]
    inputs.backward(dx, cache.embed, _inputs(out))
    return stats, out


# ---- incremental decoding -----------------------------------------------------------------

@dataclass
class KVCache:
    """Each layer's self-attention keys and values: ``k[i]``, ``v[i]`` (R, H, L, d_k), one row
    per sequence; slots < t hold positions 0..t-1 once step t runs."""

    k: list
    v: list

    @property
    def capacity(self) -> int:
        return int(self.k[0].shape[2])


def init_cache(cfg: LMConfig, rows: int, dtype=None) -> KVCache:
    """Empty buffers for ``rows`` sequences of up to ``cfg.max_len`` positions."""
    xp = backend.xp
    shape = (rows, cfg.n_heads, cfg.max_len, cfg.d_model // cfg.n_heads)
    dtype = dtype or backend.float_dtype()
    return KVCache(k=[xp.zeros(shape, dtype=dtype) for _ in range(cfg.n_layers)],
                   v=[xp.zeros(shape, dtype=dtype) for _ in range(cfg.n_layers)])


def step(params, cfg: LMConfig, cache: KVCache, tokens, t: int):
    """``forward`` and ``logits`` on position t alone: tokens (R,) at position t -> logits (R, V).

    Writes position t's keys and values into slot t of every layer's buffers; slots < t must hold
    the earlier positions'. Equals row t of the full forward pass (without dropout).
    """
    if not 0 <= t < cache.capacity:
        raise ValueError(f"position {t} is outside the cache of {cache.capacity} positions")
    x, _ = inputs.forward(tokens[:, None], _inputs(params), offset=t)     # (R, 1, d)
    x = decoder_only.stack_step(x[:, 0], subdict(params, "layers."), cache.k, cache.v, t, cfg)
    return logits(params, cfg, x)                                         # (R, V)
