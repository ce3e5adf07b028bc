"""The Transformer translator: configuration, parameters, and the loss with all its gradients.

    src (B, S) ids ──inputs: embed·√d + PE, dropout──► encoder stack ──► memory (B, S, d)
    tgt (B, T+1) ids = BOS y_1 .. y_n EOS PAD..; decoder input tgt[:, :-1], targets tgt[:, 1:]
    tgt[:, :-1] ──inputs──► decoder stack (memory) ──► h (B, T, d)
    h at non-padding targets ──output: h E^T (tied to the embedding), label-smoothed
                               cross-entropy, averaged over target tokens

A model is a flat dict of named arrays (see ``parameter_shapes``, composed from each layer's own
declaration); gradients are a dict with the same keys. With ``share_embeddings`` one matrix "emb"
is the source embedding, the target embedding and the output projection (paper, section 3.4), and
its gradient is the sum of the gradients of its three uses.

Incremental decoding runs the same model one target position at a time: ``decoder_step`` is
``decoder_forward`` on position t, through the input layer at offset t and the decoder's
``stack_step``, over per-layer keys and values (``cross_kv`` computes the encoder output's once);
decode.py holds those arrays (its ``KVCache``), and decode.py and beam.py the search.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from minitfm import backend, flat
from minitfm.ids import BOS_ID, EOS_ID, PAD_ID
from minitfm.layers import decoder, encoder, inputs, out_part, output, prefixed, subdict
from minitfm.layers.attention import causal_mask, padding_mask
from minitfm.models.base import (check_dropouts, check_param_shapes, check_positive_ints,
                                 check_tokens, initial_values)

KIND = "transformer"      # what a checkpoint of this model records as its kind
DESCRIPTION = "an encoder-decoder Transformer (translation, toy tasks)"
LATER_FIELDS = {"word_dropout": 0.0}    # a checkpoint saved before these fields: their values


@dataclass(frozen=True)
class Config:
    """Every hyper-parameter of the model. The paper's values are the ``base`` preset."""

    src_vocab: int = 37000
    tgt_vocab: int = 37000
    n_layers: int = 6              # N, for the encoder and the decoder
    d_model: int = 512
    d_ff: int = 2048
    n_heads: int = 8               # h; d_k = d_v = d_model / h
    dropout: float = 0.1           # P_drop
    attention_dropout: float = 0.0  # on the attention weights (not in the paper)
    relu_dropout: float = 0.0      # on the feed-forward hidden units (not in the paper)
    word_dropout: float = 0.0      # whole input tokens' embeddings (not in the paper)
    label_smoothing: float = 0.1   # eps_ls
    share_embeddings: bool = True  # one matrix for source, target and output projection
    pre_ln: bool = False           # the paper's post-LN by default
    max_len: int = 1024            # longest sequence the model accepts
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def __post_init__(self):
        check_positive_ints(self, ("src_vocab", "tgt_vocab", "n_layers", "d_model", "d_ff",
                                   "n_heads", "max_len"))
        if self.d_model % self.n_heads:
            raise ValueError(
                f"Config.d_model={self.d_model} must be divisible by n_heads={self.n_heads} "
                f"(each head gets d_model / n_heads dimensions)")
        check_dropouts(self)
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"Config.label_smoothing must be in [0, 1), got {self.label_smoothing!r}")
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(
                f"Config.share_embeddings=True needs src_vocab == tgt_vocab, got "
                f"{self.src_vocab} and {self.tgt_vocab}: use a joint vocabulary or "
                f"share_embeddings=False")
        for field in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, field)
            if not 0 <= value < min(self.src_vocab, self.tgt_vocab):
                raise ValueError(f"Config.{field}={value} is outside the vocabulary")

    @classmethod
    def preset(cls, name: str, **overrides) -> "Config":
        """A named preset ("tiny", "toy", "small", "base", "big") with fields overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config fields {sorted(unknown)}")
        return cls(**d)


PRESETS = {
    # for gradient checks: every code path, a few hundred parameters
    "tiny": Config(src_vocab=11, tgt_vocab=11, n_layers=2, d_model=8, d_ff=12, n_heads=2,
                   dropout=0.0, label_smoothing=0.1, max_len=64),
    # for the synthetic tasks of train_toy.py on a laptop CPU
    "toy": Config(src_vocab=16, tgt_vocab=16, n_layers=2, d_model=64, d_ff=256, n_heads=4,
                  dropout=0.0, label_smoothing=0.0, max_len=256),
    # a real-translation model for a CPU (Multi30k with an 8k joint vocabulary)
    "small": Config(src_vocab=8000, tgt_vocab=8000, n_layers=3, d_model=256, d_ff=1024,
                    n_heads=4, dropout=0.1, label_smoothing=0.1),
    # the paper's base and big models (Table 3)
    "base": Config(),
    "big": Config(d_model=1024, d_ff=4096, n_heads=16, dropout=0.3),
}


# ---- parameters ---------------------------------------------------------------------------

def embedding_names(cfg: Config) -> tuple[str, str]:
    """The names of the source and target (= output projection) embedding matrices."""
    return ("emb", "emb") if cfg.share_embeddings else ("src_emb", "tgt_emb")


def parameter_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in a fixed order, composed from the layers' own
    declarations: the embedding(s), then "enc." + the encoder stack's and "dec." + the decoder
    stack's names (see encoder.py, decoder.py)."""
    vocabs = dict(zip(embedding_names(cfg), (cfg.src_vocab, cfg.tgt_vocab)))
    shapes = {name: inputs.param_shapes(vocab, cfg.d_model)["table"]
              for name, vocab in vocabs.items()}
    stacks = {**prefixed(encoder.param_shapes(cfg), "enc."),
              **prefixed(decoder.param_shapes(cfg), "dec.")}
    # Both stacks' final LayerNorms (pre-LN) come after all their layers: the order fixes the
    # initial values drawn from a seed and the order of saved checkpoints, so it stays as it was.
    final_ln = ("enc.ln.", "dec.ln.")
    shapes.update((k, v) for k, v in stacks.items() if not k.startswith(final_ln))
    shapes.update((k, v) for k, v in stacks.items() if k.startswith(final_ln))
    return shapes


def parameter_names(cfg: Config) -> list[str]:
    return list(parameter_shapes(cfg))


def init_params(cfg: Config, seed: int = 0, dtype=None) -> dict:
    """Initialise every parameter, reproducibly from ``seed`` and identically on every backend
    (see ``base.initial_values``): the embeddings N(0, d_model^-1/2)."""
    tables = {name: cfg.d_model ** -0.5 for name in embedding_names(cfg)}
    return initial_values(parameter_shapes(cfg), cfg.d_model, seed, dtype, normal=tables)


def check_params(params: dict, cfg: Config) -> None:
    """Raise a clear error if ``params`` does not fit ``cfg`` or lives on another device."""
    check_param_shapes(params, parameter_shapes(cfg))


# ---- the model ----------------------------------------------------------------------------

class ForwardCache(NamedTuple):
    """The cache of ``encoder_forward`` or ``decoder_forward``."""
    embed: inputs.Cache
    stack: object           # encoder.StackCache or decoder.StackCache


def encoder_forward(params, cfg, src, rng=None):
    """Run the encoder. Return ``(memory (B, S, d), src_mask (B, 1, 1, S), cache)``."""
    src_name, _ = embedding_names(cfg)
    dtype = params[src_name].dtype
    src_mask = padding_mask(src, cfg.pad_id, dtype)
    x, c_emb = inputs.forward(src, {"table": params[src_name]}, cfg.dropout, rng,
                              p_word=cfg.word_dropout)
    memory, c_enc = encoder.stack_forward(x, subdict(params, "enc."), src_mask, cfg, rng)
    return memory, src_mask, ForwardCache(c_emb, c_enc)


def decoder_forward(params, cfg, tgt_in, memory, src_mask, rng=None):
    """Run the decoder over a whole target prefix. Return ``(h (B, T, d), cache)``."""
    _, tgt_name = embedding_names(cfg)
    dtype = params[tgt_name].dtype
    t = tgt_in.shape[1]
    self_mask = causal_mask(t, dtype) + padding_mask(tgt_in, cfg.pad_id, dtype)   # (B, 1, T, T)
    y, c_emb = inputs.forward(tgt_in, {"table": params[tgt_name]}, cfg.dropout, rng,
                              p_word=cfg.word_dropout)
    h, c_dec = decoder.stack_forward(y, memory, subdict(params, "dec."), self_mask, src_mask,
                                     cfg, rng)
    return h, ForwardCache(c_emb, c_dec)


def cross_kv(params, cfg, memory):
    """Every decoder layer's cross-attention keys and values of memory (B, S, d), computed once
    for incremental decoding: two lists of ``cfg.n_layers`` arrays (B, H, S, d_k)."""
    return decoder.stack_cross_kv(memory, subdict(params, "dec."), cfg)


def decoder_step(params, cfg, tokens, t, self_k, self_v, cross_k, cross_v, src_mask):
    """``decoder_forward`` on position t alone: tokens (R,) at position t -> h (R, d).

    self_k, self_v: one (R, H, L, d_k) buffer per layer, slots < t filled by the earlier steps and
    slot t written here; cross_k, cross_v: one (n, H, S, d_k) array per layer (``cross_kv``) and
    src_mask (n, 1, 1, S), each row shared by R / n consecutive rows (the beams of a sentence).
    Equals row t of ``decoder_forward`` (without dropout). ``t`` may be
    ``positional.Positions``, runs of rows at different positions (``attention.self_step``).
    """
    _, tgt_name = embedding_names(cfg)
    x, _ = inputs.forward(tokens[:, None], {"table": params[tgt_name]}, offset=t)   # (R, 1, d)
    return decoder.stack_step(x[:, 0], subdict(params, "dec."), self_k, self_v, cross_k, cross_v,
                              src_mask, t, cfg)


def logits(params, cfg, h, projection=None):
    """Output projection tied to the target embedding: h (..., d) -> (..., V). ``projection``:
    the same matrix as ``output_projection`` returns it, where a caller keeps one."""
    if projection is not None:
        return output.project(h, projection)
    return output.logits(h, {"table": params[embedding_names(cfg)[1]]})


def output_projection(params, cfg):
    """The output projection E^T as one contiguous (d, V) array, made once for many decoding
    steps: the same products as ``logits``, in the layout that matrix libraries multiply
    fastest when h has few rows (up to 2.4x faster at 4 rows with OpenBLAS's AVX-512 kernels)."""
    return backend.xp.ascontiguousarray(params[embedding_names(cfg)[1]].T)


def batch_tokens(batch, cfg: Config) -> int:
    """The target tokens of a batch ``(src, tgt)``: the non-padding entries of tgt[:, 1:],
    counted on the host copy."""
    tgt = backend.host_copy(batch[1], "tgt")
    return int((tgt[:, 1:] != cfg.pad_id).sum())


def output_vocab(cfg: Config) -> int:
    """The number of tokens the model chooses from at each position."""
    return cfg.tgt_vocab


def batch_bytes(cfg: Config, *, rows: int, src_len: int, tgt_len: int, float_bytes: int,
                attention: bool = True) -> tuple[int, int]:
    """``(device, host)`` bytes of one batch: B = rows, N_s = B S and N_t = B T source and target
    tokens, f = float_bytes, L layers a stack:
    f L (6 N_s d + 2 N_s d_ff + B H S^2) for the encoder, f L (10 N_t d + 2 N_t d_ff + B H T^2
    + B H T S) for the decoder, 2 f N_t V for the logits and their gradient; nothing on the
    host beyond the batch itself."""
    n_s, n_t = rows * src_len, rows * tgt_len
    enc_scores = rows * cfg.n_heads * src_len ** 2 if attention else 0
    dec_scores = rows * cfg.n_heads * (tgt_len ** 2 + tgt_len * src_len) if attention else 0
    d, d_ff = cfg.d_model, cfg.d_ff
    device = float_bytes * (cfg.n_layers * (6 * n_s * d + 2 * n_s * d_ff + enc_scores)
                            + cfg.n_layers * (10 * n_t * d + 2 * n_t * d_ff + dec_scores)
                            + 2 * n_t * cfg.tgt_vocab)
    return device, 0


def check_batch(cfg: Config, src, tgt):
    """Check a batch on the host; return its host arrays and the flat indices of its target
    positions (non-padding entries of tgt[:, 1:]), also on the host.

    Everything here is read from the host copy of the batch, so a batch that arrives from the
    data pipeline (host arrays) is checked, and its target tokens found, without waiting for the
    device.
    """
    src, tgt = backend.host_copy(src, "src"), backend.host_copy(tgt, "tgt")
    src = check_tokens(src, "src", cfg.src_vocab, cfg, host=True)
    # the decoder reads tgt[:, :-1]: cfg.max_len positions, so tgt may hold one more (EOS)
    tgt = check_tokens(tgt, "tgt", cfg.tgt_vocab, cfg, min_len=2, max_len=cfg.max_len + 1,
                       host=True)
    if src.shape[0] != tgt.shape[0]:
        raise ValueError(f"src has {src.shape[0]} sentences but tgt has {tgt.shape[0]}")
    rows = (tgt[:, 1:] != cfg.pad_id).reshape(-1).nonzero()[0]            # (N,) on the host
    if rows.size == 0:
        raise ValueError("tgt has no target tokens (every position after BOS is padding)")
    return src, tgt, rows


def loss_and_grads(params, cfg, src, tgt, rng=None, *, grads=True, normalizer=None, out=None,
                   loss_scale=None):
    """The label-smoothed loss of a batch and, unless ``grads=False``, the gradients of every parameter.

    src (B, S): source ids, padded with ``cfg.pad_id``.
    tgt (B, T+1): BOS, target ids, EOS, then padding; the decoder reads tgt[:, :-1] and predicts
        tgt[:, 1:].
    Host (NumPy) arrays are best: they are checked, and their target tokens counted, on the host,
    then copied to the device; device arrays are copied to the host for that first.
    rng: a generator from ``backend.rng(...)`` for dropout, or None for no dropout (evaluation).
    normalizer: the loss is summed over target tokens and divided by this (default: the number of
        non-padding target tokens of this batch; pass the token count of a whole accumulated
        update to make gradient accumulation exact).
    out: a dict of arrays with the keys and shapes of ``params`` (e.g. ``flat.zeros_like(params)``)
        into which the gradients are written, overwriting it; default: new arrays, in one flat
        buffer (:mod:`minitfm.flat`).
    loss_scale: a 0-d device array the gradients are multiplied by (mixed precision's loss
        scale, minitfm.gradscale); the stats are not scaled.

    Returns ``(stats, grads)``: stats has "loss" (normalised label-smoothed loss) and "nll"
    (normalised negative log-likelihood) as 0-d arrays of the backend -- ``float()`` reads them,
    waiting for the device only then -- and "tokens" (non-padding targets, an int); grads is a
    dict with the keys of ``params`` (None when ``grads=False``).
    """
    xp = backend.xp
    check_params(params, cfg)
    src_name, tgt_name = embedding_names(cfg)
    src, tgt, rows = check_batch(cfg, src, tgt)
    n_tokens = int(rows.size)
    src, tgt, rows = backend.to_device(src), backend.to_device(tgt), backend.to_device(rows)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]

    memory, src_mask, c_src = encoder_forward(params, cfg, src, rng)
    h, c_tgt = decoder_forward(params, cfg, tgt_in, memory, src_mask, rng)   # (B, T, d)

    # logits only where there is a target to predict: never a (B*T, V) array of padding rows
    b, t, d = h.shape
    norm = float(normalizer) if normalizer is not None else float(n_tokens)
    if grads and out is None:
        out = flat.zeros_like(params)
    h_sel = h.reshape(b * t, d)[rows]                                     # (N, d)
    (loss_sum, nll_sum), dh_sel, _ = output.forward_backward(
        h_sel, {"table": params[tgt_name]}, tgt_out.reshape(-1)[rows], cfg.label_smoothing,
        1.0 / norm if grads else None, {"table": out[tgt_name]} if grads else None, loss_scale)
    loss_sum /= norm
    nll_sum /= norm
    stats = {"loss": loss_sum, "nll": nll_sum, "tokens": n_tokens}
    if not grads:
        return stats, None
    dh = xp.zeros((b * t, d), dtype=h.dtype)
    dh[rows] = dh_sel
    stacks_backward(dh.reshape(b, t, d), c_src, c_tgt, out, src_name, tgt_name)
    return stats, out


def stacks_backward(dh, c_src, c_tgt, out, src_name, tgt_name) -> None:
    """The backward pass from dh (B, T, d), the gradient of the decoder's output, in reverse
    order of the forward pass, into ``out``. The output layer's backward is done already: its
    gradient is in out[tgt_name], to which the embeddings' scatter-adds add."""
    dy, dmemory, _ = decoder.stack_backward(dh, c_tgt.stack, out_part(out, "dec."))
    inputs.backward(dy, c_tgt.embed, {"table": out[tgt_name]})   # output projection + target
    dx, _ = encoder.stack_backward(dmemory, c_src.stack, out_part(out, "enc."))
    if src_name != tgt_name:
        out[src_name][...] = 0.0
    inputs.backward(dx, c_src.embed, {"table": out[src_name]})   # (+ source, when shared)
