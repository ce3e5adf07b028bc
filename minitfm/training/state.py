"""What a training run is told, and where it stands.

:class:`TrainOptions` is how to train: the trainers' shared options, one field per option of
the same name (``--max-steps`` is ``max_steps``, ``--time-limit`` is ``time_limit``, in
seconds), built once from the parsed command line (``minitfm.cli.options.train_options``) and
carried unchanged into the loop. The commands check every option before any work
(:mod:`minitfm.cli.options`); a program that builds its own options is trusted with them.

:class:`TrainState` is where a run stands: everything a checkpoint stores (the parameters,
Adam's moments, the step, the seed, the data position ``(epoch, batches consumed in it)``, the
tokens, the training time, the validation record), plus what the caller reads back (the latest
validation, how the run ended).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minitfm.gradscale import INITIAL_SCALE, LossScaler
from minitfm.optim import Adam
from minitfm.training.validation import Record

__all__ = ["TrainOptions", "TrainState", "CONFIG_FIELDS", "config_field"]

# The model options whose config field has another name (``--layers`` sets ``n_layers``); the
# others (``--d-model``, ``--d-ff``, ``--dropout``, ...) set the field of their own name.
CONFIG_FIELDS = {"layers": "n_layers", "heads": "n_heads"}


def config_field(option: str) -> str:
    """The config field that the model option ``option`` (a ``TrainOptions.command`` key) sets."""
    return CONFIG_FIELDS.get(option, option)


@dataclass(frozen=True)
class TrainOptions:
    """How to train; the model itself is described by its config."""

    max_steps: int                      # updates, counted from the first one
    out_dir: str | None = None          # checkpoints and log.jsonl; None: keep nothing on disk
    resume: bool = False                # continue from the latest checkpoint in out_dir
    seed: int = 0                       # parameter init, dropout masks (and the caller's data)
    max_epochs: float | None = None     # ... or fewer updates: this many passes over the data
    time_limit: float | None = None     # seconds of training, over all sessions of the run
    # the learning rate (optim.py): the paper's schedule times lr_factor, or a warm-up to lr
    # then a linear or cosine decay to min_lr; a cool-down (a phase) brings it to 0 at the end
    schedule: str = "paper"
    lr: float | None = None             # peak of a decay; None: the paper's rate at the end of
    lr_factor: float = 1.0              # the warm-up, times lr_factor
    min_lr: float = 0.0
    warmup: int = 4000
    cooldown: float | str | None = None
    weight_decay: float = 0.0           # AdamW's decoupled weight decay (optim.Adam)
    clip_norm: float | None = None      # global gradient-norm clipping; None: no clipping
    update_freq: int = 1                # batches summed into one update (per worker)
    dropout_start: float | str = 0.0    # late dropout: a phase (phases.py) or "auto": from the
    dropout_start_margin: float = 0.02  # validation whose perplexity improved by less than this
    log_every: int = 10                 # steps between log lines
    valid_every: int = 0                # steps between validations; 0: only at the end
    save_every: int = 0                 # steps between checkpoints; 0: only at the end
    keep_last: int = 5                  # checkpoints kept in out_dir
    best_metric: str | None = None      # choose by this validation result (validation.py)
    keep_best: int = 0                  # the checkpoints of the best validations, also kept
    patience: int = 0                   # stop after this many validations without improvement
    progress: bool = True               # tqdm bar and validation messages on the console
    loss_scale: float = INITIAL_SCALE   # mixed precision (--precision fp16): the initial scale
    command: dict = field(default_factory=dict)   # every option as given: run.json's "args"
    defining: tuple[str, ...] = ()      # the options of command a resumed run may not change


@dataclass
class TrainState:
    """Where a run stands: everything a checkpoint stores, plus what the caller reads back."""

    params: dict
    optimizer: Adam | None
    seed: int
    step: int = 0                 # updates done
    epoch: int = 0                # data position: the epoch being read ...
    batches_done: int = 0         # ... and how many of its batches are consumed
    tokens: int = 0               # target tokens trained on so far
    elapsed: float = 0.0          # training seconds so far, over all sessions of the run
    valid: dict = field(default_factory=dict)   # the latest validation results
    last_checkpoint: str | None = None
    spared_step: int | None = None   # a checkpoint rotation keeps besides (the last good one
                                     # while the loss is high: divergence.DivergenceWatch)
    interrupted: bool = False     # stopped by a signal (a checkpoint was saved if out_dir is set)
    stop_signal: int | None = None   # which: SIGINT (also a KeyboardInterrupt raised in code),
                                     # SIGTERM or SIGHUP
    out_of_time: bool = False     # stopped by the time limit (likewise)
    out_of_patience: bool = False   # stopped by patience (likewise)
    record: Record = field(default_factory=Record)   # judged so far
    grads: dict | None = field(default=None, repr=False)     # flat gradient buffers, reused by
    scratch: dict | None = field(default=None, repr=False)   # every update (loop.accumulate)
    scaler: LossScaler | None = None    # mixed precision's loss scale (--precision fp16)
