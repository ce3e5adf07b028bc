"""Pictures of a model and a training run, as PNG files: the attention maps of every head of one
layer (:func:`attention_maps`, the softmax weights of equation (1) read from the forward pass's
caches, drawn as the paper's figures 3-5), the sinusoidal positional encoding of section 3.5,
the learning rate of equation (3) and a run's training curves, read from its JSON-lines log
(:func:`read_log`: lines that cannot be read are skipped, and named).

matplotlib is an optional dependency (the ``plot`` extra), imported only when a picture is drawn,
with the non-interactive Agg backend. The command that draws them, ``python -m minitfm.plot``,
is :mod:`minitfm.cli.plot`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from minitfm import backend, files
from minitfm.layers import positional
from minitfm.models import translator as model
from minitfm.optim import LRSchedule

__all__ = [
    "PlotError", "pyplot", "attention_maps", "plot_attention", "attention_figures",
    "plot_positional", "plot_lr_schedule", "Log", "read_log", "training_minutes", "plot_curves",
]

ATTENTION_KINDS = ("encoder", "decoder_self", "cross")


class PlotError(Exception):
    """A picture cannot be drawn (no matplotlib, an unusable log or checkpoint); says why."""


def pyplot():
    """matplotlib.pyplot with the Agg backend, or a PlotError saying how to install it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotError("plotting needs matplotlib, an optional dependency: install it with "
                        "`pip install -e '.[plot]'` (or `pip install matplotlib`)") from exc
    return plt


def _save(fig, path) -> str:
    """Write the figure whole or not at all (``files.replacing``), in the format its name's
    suffix says (none: matplotlib's default format, whose suffix is added, as savefig does)."""
    plt = pyplot()
    path = Path(path)
    if not path.suffix:
        path = path.with_suffix("." + plt.rcParams["savefig.format"])
    try:
        with files.replacing(path) as tmp:        # whole or not at all, even on Ctrl-C
            fig.savefig(tmp, format=path.suffix[1:], dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return str(path)


# ---- attention -------------------------------------------------------------------------------

def attention_maps(params: dict, cfg: model.Config, src, tgt_in) -> dict[str, list]:
    """Attention probabilities of one forward pass (no dropout), on the host.

    src (B, S) and tgt_in (B, T) token ids (tgt_in starts with BOS). Returns
    ``{"encoder": [(B, H, S, S) per layer], "decoder_self": [(B, H, T, T) ...],
    "cross": [(B, H, T, S) ...]}``: the ``p`` of each attention's scaled dot-product cache.
    """
    memory, src_mask, enc = model.encoder_forward(params, cfg, backend.to_device(src))
    _, dec = model.decoder_forward(params, cfg, backend.to_device(tgt_in), memory, src_mask)
    return {"encoder": [backend.to_host(layer.self_attn.sublayer.attention.p)
                        for layer in enc.stack.layers],
            "decoder_self": [backend.to_host(layer.self_attn.sublayer.attention.p)
                             for layer in dec.stack.layers],
            "cross": [backend.to_host(layer.cross_attn.sublayer.attention.p)
                      for layer in dec.stack.layers]}


def plot_attention(maps, rows: Sequence[str], cols: Sequence[str], path, title: str = "") -> str:
    """One heat-map per head of ``maps`` (H, len(rows), len(cols)), queries down, keys across."""
    plt = pyplot()
    heads = len(maps)
    ncols = min(4, heads)
    nrows = math.ceil(heads / ncols)
    size = max(2.5, 0.28 * max(len(rows), len(cols)))
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, size * nrows), squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= heads:
            ax.axis("off")
            continue
        ax.imshow(maps[h], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_title(f"head {h + 1}", fontsize=9)
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def _pair(params, cfg, vocab, source: str, target: str | None, beam: int):
    """Source ids (with EOS), decoder input ids (BOS + target) and the labels of both."""
    from minitfm.decoding import batched
    src_ids = vocab.encode([source])[0][:cfg.max_len - 1]
    if not src_ids:
        raise PlotError("the source sentence is empty")
    if target is None:
        tgt_ids = batched.translate_ids(params, cfg, [src_ids], beam=beam)[0][0][0]
    else:
        tgt_ids = vocab.encode([target])[0]
    tgt_ids = tgt_ids[:cfg.max_len - 1]
    src_labels = _labels(vocab, src_ids) + ["</s>"]
    tgt_labels = ["<s>"] + _labels(vocab, tgt_ids)
    return src_ids + [cfg.eos_id], [cfg.bos_id] + tgt_ids, src_labels, tgt_labels


def _labels(vocab, ids: list[int]) -> list[str]:
    """One axis label per token: its subword piece ("▁" marks a word start)."""
    text = vocab.decode([ids])[0]
    if vocab.encode([text])[0] == list(ids):          # the usual segmentation of its text
        return vocab.pieces(text)
    return [vocab.decode([[i]])[0] or "▁" for i in ids]


def attention_figures(params, cfg, vocab, source: str, target: str | None, layer: int,
                      out_dir, beam: int = 4) -> list[str]:
    """Write the three attention pictures of ``layer`` for a sentence pair; return their paths."""
    if not -cfg.n_layers <= layer < cfg.n_layers:
        raise PlotError(f"--layer must be in [{-cfg.n_layers}, {cfg.n_layers - 1}] for a model "
                        f"with {cfg.n_layers} layers, got {layer}")
    layer %= cfg.n_layers
    src, tgt_in, src_labels, tgt_labels = _pair(params, cfg, vocab, source, target, beam)
    maps = attention_maps(params, cfg, [src], [tgt_in])
    axes = {"encoder": (src_labels, src_labels), "decoder_self": (tgt_labels, tgt_labels),
            "cross": (tgt_labels, src_labels)}
    titles = {"encoder": "encoder self-attention", "decoder_self": "decoder self-attention",
              "cross": "encoder-decoder attention"}
    return [plot_attention(maps[kind][layer][0], *axes[kind],
                           Path(out_dir) / f"attention_{kind}_layer{layer}.png",
                           f"{titles[kind]}, layer {layer}") for kind in ATTENTION_KINDS]


# ---- positional encoding and learning rate ---------------------------------------------------

def plot_positional(path, d_model: int = 512, length: int = 100) -> str:
    plt = pyplot()
    pe = backend.to_host(positional.encoding(length, d_model, backend.xp.float64))   # (T, d)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    image = ax.imshow(pe, cmap="RdBu", vmin=-1.0, vmax=1.0, aspect="auto")
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    ax.set_title(f"sinusoidal positional encoding, d_model = {d_model}")
    fig.colorbar(image, ax=ax)
    return _save(fig, path)


def plot_lr_schedule(path, d_models: Sequence[int] = (512,), warmups: Sequence[int] = (4000,),
                     steps: int = 100_000, factor: float = 1.0) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    grid = range(1, steps + 1, max(1, steps // 2000))
    for d_model in d_models:
        for warmup in warmups:
            schedule = LRSchedule(d_model, warmup, factor)
            ax.plot(list(grid), [schedule(s) for s in grid],
                    label=f"d_model={d_model}, warmup={warmup}")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title("lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)")
    ax.legend()
    return _save(fig, path)


# ---- training curves -------------------------------------------------------------------------

class Log(NamedTuple):
    """A training log as read: its records, and the lines skipped, ``(line number, why)``."""

    records: list[dict]
    skipped: list[tuple[int, str]]

    def warning(self, path) -> str | None:
        """One line naming the skipped lines of ``path`` and why, or None if none was."""
        if not self.skipped:
            return None
        shown = ", ".join(f"line {line} ({why})" for line, why in self.skipped[:5])
        more = f", and {len(self.skipped) - 5} more" if len(self.skipped) > 5 else ""
        count = len(self.skipped)
        return (f"warning: {path}: skipped {count} line{'s' if count > 1 else ''} that could "
                f"not be read: {shown}{more}; the curves are drawn without "
                f"{'them' if count > 1 else 'it'}")


def read_log(path) -> Log:
    """The JSON objects of a JSON-lines log that have a numeric "step", and the lines skipped
    (blank lines aside): a line cut short by a crash, one that is not JSON or not UTF-8, an
    object without a step."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        files.raise_if_read_failed(path, exc)   # the disk failed the read: the log not judged
        raise PlotError(f"cannot read training log {path}: {exc.strerror or exc}") from exc
    records, skipped = [], []
    lines = data.split(b"\n")
    for line_number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        ended = line_number < len(lines)            # the last piece has no line end after it
        try:
            record = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            skipped.append((line_number, "not UTF-8"))
            continue
        except ValueError:
            skipped.append((line_number, "not JSON" if ended else "cut short: no line end"))
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), (int, float)):
            records.append(record)
        else:
            skipped.append((line_number, 'no numeric "step"'))
    return Log(records, skipped)


def training_minutes(records: Sequence[dict]) -> dict[int, float]:
    """Each logged step's training time in minutes: a record's own ``elapsed`` (seconds), else that
    of the last record before it that has one (a validation is logged right after its step)."""
    minutes, last = {}, 0.0
    for r in sorted(records, key=lambda r: (r["step"], "elapsed" not in r)):
        if isinstance(r.get("elapsed"), (int, float)):
            last = r["elapsed"] / 60.0
        minutes.setdefault(r["step"], last)
    return minutes


def _series(records: Sequence[dict], key: str,
            minutes: dict[int, float] | None = None) -> tuple[list, list]:
    """``(xs, values)`` of ``key``: x the step, or with ``minutes`` (training_minutes) its time."""
    points = [(r["step"], r[key]) for r in records
              if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    if minutes is not None:
        points = [(minutes[step], value) for step, value in points]
    return [s for s, _ in points], [v for _, v in points]


def _metric_panels(logs: dict[str, list[dict]]) -> list[tuple[str, list[str]]]:
    """One panel per validation metric; ``valid_M_*`` variants (``valid_bleu_beam4``) join
    ``valid_M``'s panel."""
    keys = sorted({k for records in logs.values() for r in records for k in r
                   if k.startswith("valid_") and k not in ("valid_loss", "valid_nll", "valid_ppl")})
    panels: dict[str, list[str]] = {}
    for key in keys:
        base = next((b for b in panels if key.startswith(b + "_")), key)
        panels.setdefault(base, []).append(key)
    return list(panels.items())


def plot_curves(logs: dict[str, list[dict]], path, x: str = "step") -> str:
    """Loss, validation metrics and learning rate against the step (``x="minutes"``: the training
    minutes), for logs ``{name: records}``."""
    panels = [("loss", ["loss", "valid_loss"])] + _metric_panels(logs)
    if any("lr" in r for records in logs.values() for r in records):
        panels.append(("learning rate", ["lr"]))
    if not any(_series(records, "loss")[0] or _series(records, "valid_loss")[0]
               for records in logs.values()):
        raise PlotError("the training logs have no \"loss\" or \"valid_loss\" values to plot")
    minutes = {name: training_minutes(records) if x == "minutes" else None
               for name, records in logs.items()}
    plt = pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 3 * len(panels)), sharex=True,
                             squeeze=False)
    for ax, (label, keys) in zip(axes[:, 0], panels):
        for name, records in logs.items():
            for key in keys:
                xs, values = _series(records, key, minutes[name])
                if xs:
                    style = "o-" if key.startswith("valid_") else "-"
                    ax.plot(xs, values, style, markersize=3,
                            label=f"{name}: {key}" if len(logs) > 1 else key)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("training minutes" if x == "minutes" else "step")
    return _save(fig, path)
