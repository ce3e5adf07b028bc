"""The Transformer: configuration, parameters, and the loss with all its gradients.

    src (B, S) ids ──embed·√d + PE──dropout──► encoder stack ──► memory (B, S, d)
    tgt (B, T+1) ids = BOS y_1 .. y_n EOS PAD..; decoder input tgt[:, :-1], targets tgt[:, 1:]
    tgt[:, :-1] ──embed·√d + PE──dropout──► decoder stack (memory) ──► h (B, T, d)
    h at non-padding targets ──► h E^T (logits, output projection tied to the embedding)
                             ──► label-smoothed cross-entropy, averaged over target tokens

A model is a flat dict of named arrays (see ``parameter_shapes``, composed from each layer's own
declaration); gradients are a dict with the same keys. With ``share_embeddings`` one matrix "emb"
is the source embedding, the target embedding and the output projection (paper, section 3.4), and
its gradient is the sum of the gradients of its three uses.

Incremental decoding runs the same model one target position at a time: ``decoder_step`` is
``decoder_forward`` on position t, through ``embed(..., offset=t)`` and the decoder's
``stack_step``, over per-layer keys and values (``cross_kv`` computes the encoder output's once);
decode.py holds those arrays (its ``KVCache``) and the search.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

from minitfm import backend, flat
from minitfm.ids import BOS_ID, EOS_ID, PAD_ID
from minitfm.layers import decoder, dropout, embedding, encoder, linear, loss, positional
from minitfm.layers import out_part, prefixed, subdict
from minitfm.layers.attention import MASKED

KIND = "transformer"      # what a checkpoint of this model records as its kind (checkpoint.KINDS)


# The config fields that are dropout rates (here and in lm.LMConfig): residual and embedding,
# attention weights, feed-forward hidden units.
DROPOUTS = ("dropout", "attention_dropout", "relu_dropout")


def check_dropouts(cfg) -> None:
    """Refuse a config (``Config`` or ``lm.LMConfig``) whose dropout rates are not in [0, 1)."""
    for field in DROPOUTS:
        value = getattr(cfg, field)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{type(cfg).__name__}.{field} must be in [0, 1), got {value!r}")


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
    label_smoothing: float = 0.1   # eps_ls
    share_embeddings: bool = True  # one matrix for source, target and output projection
    pre_ln: bool = False           # the paper's post-LN by default
    max_len: int = 1024            # longest sequence the model accepts
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def __post_init__(self):
        for field in ("src_vocab", "tgt_vocab", "n_layers", "d_model", "d_ff", "n_heads", "max_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Config.{field} must be a positive integer, got {value!r}")
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

def parameter_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in a fixed order, composed from the layers' own
    declarations: the embedding(s), then "enc." + the encoder stack's and "dec." + the decoder
    stack's names (see encoder.py, decoder.py)."""
    d = cfg.d_model
    if cfg.share_embeddings:
        tables = {"emb": cfg.src_vocab}
    else:
        tables = {"src_emb": cfg.src_vocab, "tgt_emb": cfg.tgt_vocab}
    shapes = {name: embedding.param_shapes(vocab, d)["table"] for name, vocab in tables.items()}
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
    (see :func:`initial_values`)."""
    return initial_values(parameter_shapes(cfg), cfg.d_model, seed, dtype)


def initial_values(shapes: dict, d_model: int, seed: int = 0, dtype=None) -> dict:
    """Initial values for the parameters ``shapes`` names, by the kind of each (its name):

    - weight matrices: Xavier/Glorot uniform, U(-a, a) with a = sqrt(6 / (fan_in + fan_out)),
      applied to each d_model x d_model block of the fused projections separately (each block is
      one of the paper's W_Q, W_K, W_V);
    - token embeddings (``EMBEDDINGS``): N(0, d_model^-1/2), so that the embedding times
      sqrt(d_model) has unit scale; a learned position table ("pos_emb", lm.py): N(0, 0.02^2)
      (GPT-2's), so that at first the model sees mostly the tokens;
    - biases 0, LayerNorm gains 1 and shifts 0.
    Values are drawn on the host, in the order of ``shapes``, and copied to the active backend,
    into views of one flat buffer (:class:`minitfm.flat.FlatDict`), so whole-model passes (Adam,
    clipping) are one operation.
    """
    dtype = dtype or backend.float_dtype()
    rng = backend.host_rng(seed)
    d = d_model
    params = flat.zeros(shapes, dtype)
    for name, shape in shapes.items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "gamma":
            params[name] = 1.0
            continue
        if len(shape) == 1:
            continue
        if name in EMBEDDINGS:
            value = rng.normal(0.0, d ** -0.5, size=shape)
        elif name == "pos_emb":
            value = rng.normal(0.0, 0.02, size=shape)
        else:
            fan_in, fan_out = shape
            blocks = fan_out // d if leaf in ("w_qkv", "w_kv") else 1
            fan_out //= blocks
            a = math.sqrt(6.0 / (fan_in + fan_out))
            value = rng.uniform(-a, a, size=shape)
        params[name] = backend.to_device(value, dtype=dtype)
    return params


EMBEDDINGS = ("emb", "src_emb", "tgt_emb")     # the token embedding tables' names


def num_parameters(params: dict) -> int:
    return sum(int(v.size) for v in params.values())


# ---- input checks -------------------------------------------------------------------------

def check_params(params: dict, cfg: Config) -> None:
    """Raise a clear error if ``params`` does not fit ``cfg`` or lives on another device."""
    check_param_shapes(params, parameter_shapes(cfg))


def check_param_shapes(params: dict, shapes: dict) -> None:
    """Raise a clear error unless ``params`` holds exactly ``shapes``' names and shapes, in one
    float dtype, on the active device."""
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


def check_tokens(ids, what: str, vocab: int, cfg: Config, min_len: int = 1, max_len=None,
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
        raise ValueError(f"{what} has length {ids.shape[1]} > {max_len} (Config.max_len="
                         f"{cfg.max_len}): truncate the input or raise max_len")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"{what} holds token ids in [{lo}, {hi}], outside the vocabulary "
                         f"[0, {vocab - 1}]: was the data encoded with another vocabulary?")
    return ids


# ---- the model ----------------------------------------------------------------------------

def embedding_names(cfg: Config) -> tuple[str, str]:
    """The names of the source and target (= output projection) embedding matrices."""
    return ("emb", "emb") if cfg.share_embeddings else ("src_emb", "tgt_emb")


def padding_mask(ids, pad_id, dtype):
    """Additive mask (B, 1, 1, S): MASKED at padded keys, 0 elsewhere."""
    xp = backend.xp
    return xp.where(ids == pad_id, MASKED, 0.0).astype(dtype)[:, None, None, :]


_causal_masks: dict = {}     # (backend, T, dtype) -> mask, a constant made once


def causal_mask(length, dtype):
    """Additive mask (1, 1, T, T): MASKED where key position > query position."""
    xp = backend.xp
    key = (backend.name, length, xp.dtype(dtype).str)
    if key not in _causal_masks:
        future = xp.triu(xp.ones((length, length), dtype=bool), k=1)
        _causal_masks[key] = xp.where(future, MASKED, 0.0).astype(dtype)[None, None]
    return _causal_masks[key]


class EmbedCache(NamedTuple):
    embedding: embedding.Cache
    positions: positional.LearnedCache | None     # None: the sinusoids, a constant
    dropout: dropout.Cache | None


class ForwardCache(NamedTuple):
    """The cache of ``encoder_forward`` or ``decoder_forward``."""
    embed: EmbedCache
    stack: object           # encoder.StackCache or decoder.StackCache


def embed(ids, table, cfg, rng, offset=0, positions=None):
    """Token embedding * sqrt(d_model) + positional encoding, then dropout.

    ids (B, T) -> (B, T, d); ``offset`` is the position of ids[:, 0] (decoder_step's t);
    ``positions``: a learned position table (L, d) in place of the sinusoids (lm.py's option).
    """
    x, c_emb = embedding.forward(ids, {"table": table})
    c_pos = None
    if positions is None:
        x, _ = positional.forward(x, offset)
    else:
        x, c_pos = positional.learned_forward(x, {"table": positions}, offset)
    x, c_drop = dropout.forward(x, cfg.dropout, rng, inplace=True)
    return x, EmbedCache(c_emb, c_pos, c_drop)


def embed_backward(dx, cache: EmbedCache, dtable=None, dpositions=None):
    """The gradients of the embedding table (V, d) and of the learned position table (L, d)
    (None with the sinusoids) from dx (B, T, d). With ``dtable``, the table's is added to it (a
    table used several times sums its uses there); with ``dpositions``, the positions' is
    written into it."""
    dx, _ = dropout.backward(dx, cache.dropout)
    d_positions = None
    if cache.positions is None:
        dx, _ = positional.backward(dx, None)
    else:
        dx, g = positional.learned_backward(
            dx, cache.positions, None if dpositions is None else {"table": dpositions})
        d_positions = g["table"]
    _, grads = embedding.backward(dx, cache.embedding,
                                  None if dtable is None else {"table": dtable})
    return grads["table"], d_positions


def encoder_forward(params, cfg, src, rng=None):
    """Run the encoder. Return ``(memory (B, S, d), src_mask (B, 1, 1, S), cache)``."""
    src_name, _ = embedding_names(cfg)
    dtype = params[src_name].dtype
    src_mask = padding_mask(src, cfg.pad_id, dtype)
    x, c_emb = embed(src, params[src_name], cfg, rng)
    memory, c_enc = encoder.stack_forward(x, subdict(params, "enc."), src_mask, cfg, rng)
    return memory, src_mask, ForwardCache(c_emb, c_enc)


def decoder_forward(params, cfg, tgt_in, memory, src_mask, rng=None):
    """Run the decoder over a whole target prefix. Return ``(h (B, T, d), cache)``."""
    _, tgt_name = embedding_names(cfg)
    dtype = params[tgt_name].dtype
    t = tgt_in.shape[1]
    self_mask = causal_mask(t, dtype) + padding_mask(tgt_in, cfg.pad_id, dtype)   # (B, 1, T, T)
    y, c_emb = embed(tgt_in, params[tgt_name], cfg, rng)
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
    slot t written here; cross_k, cross_v: one (R, H, S, d_k) array per layer (``cross_kv``);
    src_mask (R, 1, 1, S). Equals row t of ``decoder_forward`` (without dropout).
    """
    _, tgt_name = embedding_names(cfg)
    x, _ = embed(tokens[:, None], params[tgt_name], cfg, None, offset=t)      # (R, 1, d)
    return decoder.stack_step(x[:, 0], subdict(params, "dec."), self_k, self_v, cross_k, cross_v,
                              src_mask, t, cfg)


def batch_tokens(batch, cfg: Config) -> int:
    """The target tokens of a batch ``(src, tgt)``: the non-padding entries of tgt[:, 1:],
    counted on the host copy."""
    tgt = backend.host_copy(batch[1], "tgt")
    return int((tgt[:, 1:] != cfg.pad_id).sum())


def output_vocab(cfg: Config) -> int:
    """The number of tokens the model chooses from at each position."""
    return cfg.tgt_vocab


def logits(params, cfg, h):
    """Output projection tied to the target embedding: h (..., d) -> (..., V)."""
    return h @ params[embedding_names(cfg)[1]].T


LOGIT_CHUNK = 1 << 24    # logits computed at once, in elements (64 MiB in float32)


def output_loss(h, table, targets, smoothing, dloss=None, dtable=None):
    """Tied output projection and label-smoothed loss, over chunks of rows.

    h (N, d) decoder states at the target positions, table (V, d) the target embedding, targets
    (N,). The logits of a chunk, h_c table^T, live only while its loss and, when ``dloss`` (the
    scale of the loss, 1 / normaliser) is given, its backward pass are computed: the loss is the
    last layer, so its backward can run right after its forward, and memory holds one
    (rows, V) chunk instead of (N, V).

    Returns ``(loss_sum, nll_sum, dh (N, d), dtable (V, d))``; the last two are None without
    dloss. ``dtable``, when given, receives the table's gradient (overwritten).
    """
    xp = backend.xp
    n, v = h.shape[0], table.shape[0]
    chunk = max(1, LOGIT_CHUNK // v)
    loss_sum = nll_sum = 0.0
    dh = None
    if dloss is not None:
        dh = xp.empty_like(h)
        if dtable is None:
            dtable = xp.empty_like(table)                                    # (V, d)
    for start in range(0, n, chunk):
        part = slice(start, start + chunk)
        z, c_out = linear.forward(h[part], {"w": table.T})                   # (rows, V)
        (l_sum, n_sum), c_loss = loss.forward(z, targets[part], smoothing)
        loss_sum, nll_sum = loss_sum + l_sum, nll_sum + n_sum
        if dloss is None:
            continue
        dz, _ = loss.backward(dloss, c_loss)                                 # (rows, V), over z
        if start == 0:                  # the first chunk writes dtable^T, the others add to it
            dh[part], _ = linear.backward(dz, c_out, {"w": dtable.T})
        else:
            dh[part], g = linear.backward(dz, c_out)
            dtable += g["w"].T
    return loss_sum, nll_sum, dh, dtable if dloss is not None else None


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


def loss_and_grads(params, cfg, src, tgt, rng=None, *, grads=True, normalizer=None, out=None):
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
    loss_sum, nll_sum, dh_sel, _ = output_loss(
        h_sel, params[tgt_name], tgt_out.reshape(-1)[rows], cfg.label_smoothing,
        1.0 / norm if grads else None, out[tgt_name] if grads else None)
    loss_sum /= norm
    nll_sum /= norm
    stats = {"loss": loss_sum, "nll": nll_sum, "tokens": n_tokens}
    if not grads:
        return stats, None

    # backward, in reverse order of the forward pass (the output layer's is done already: its
    # gradient is in out[tgt_name], to which the embeddings' scatter-adds add)
    dh = xp.zeros((b * t, d), dtype=h.dtype)
    dh[rows] = dh_sel
    dy, dmemory, _ = decoder.stack_backward(dh.reshape(b, t, d), c_tgt.stack,
                                            out_part(out, "dec."))
    embed_backward(dy, c_tgt.embed, out[tgt_name])     # output projection + target embedding
    dx, _ = encoder.stack_backward(dmemory, c_src.stack, out_part(out, "enc."))
    if src_name != tgt_name:
        out[src_name][...] = 0.0
    embed_backward(dx, c_src.embed, out[src_name])     # (+ source embedding, when shared)
    return stats, out
