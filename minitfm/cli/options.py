"""The commands' options, one vocabulary: every option that ``train_toy.py``, ``train_wmt.py``
and ``train_lm.py`` share, and beam search's settings (``minitfm.translate``, ``train_wmt.py
--eval-only``, ``minitfm.export``), is declared here once (:data:`VOCABULARY`: its name, its
type, which checks the value before any work, its unit and its help) and means the same in each
command.

- a value's type is one of :mod:`minitfm.cli.argtypes` (integers and numbers in a range, a time with
  its unit: ``90s``, ``60m``, ``1.5h``, the time limit in one unit everywhere, a phase of a run);
  a bad value is a usage error naming the option and what it must be;
- a trainer (:class:`Trainer`) names the shared options it has and gives its defaults in a
  table (a value, a table per preset or task, or words such as ``$MINITFM_BACKEND, else numpy``);
  its help shows them;
- :func:`parse` reads a command line: an old name of a renamed option still works for this
  release and prints one line naming the new one; the defaults are filled in; every rule
  between the shared options is checked (:func:`check`), once, before any work;
- :func:`train_options` builds what the training loop is told, one
  :class:`~minitfm.training.state.TrainOptions`, from the parsed options.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from minitfm import gradscale
from minitfm.backend import products
from minitfm.decoding import beam
from minitfm.cli.argtypes import duration, integer, number, phase, positive_int, vocab_size
from minitfm.training import phases
from minitfm.training.state import TrainOptions

__all__ = ["Option", "Words", "VOCABULARY", "BEST_METRICS", "PLACEMENT", "RUN", "SEARCH",
           "SEARCH_DEFAULTS", "Trainer", "add", "add_search_options", "parse", "check",
           "train_options"]


# ---- the vocabulary --------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    """One option: ``flag`` (``--max-steps``), its type, its help (what it is, in its unit; a
    trainer's default is added to it), ``absent``: what no value means (None: the option is
    always given a default), ``aliases``: old names still read in this release."""

    flag: str
    help: str
    type: Callable | None = None
    metavar: str | None = None
    choices: tuple | None = None
    switch: bool = False                # a flag without a value (store_true)
    absent: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")


@dataclass(frozen=True)
class Words:
    """A default given in words, not as a value (the option's value stays None)."""

    text: str


FRACTION = number(0, 1, high_open=True)
C_INT_MAX = 2**31 - 1           # the BLAS libraries take their thread count as a C int
SCHEDULES = ("paper", "linear", "cosine")
KERNELS = ("plain", "fused")    # --kernels (minitfm.speed.fused.CHOICES, held equal by a test)
BEST_METRICS = {"loss": "valid_loss", "bleu": "valid_bleu", "acc": "valid_acc"}

VOCABULARY = {option.dest: option for option in [
    # the model
    Option("--preset", "the model's preset, its sizes and rates (docs/layout.md, Presets); "
                       "the defaults listed below may depend on it"),
    Option("--layers", "layers of each stack", positive_int),
    Option("--d-model", "model width", positive_int),
    Option("--heads", "attention heads", positive_int),
    Option("--d-ff", "feed-forward width", positive_int),
    Option("--dropout", "dropout on the embeddings and every sub-layer's output", FRACTION),
    Option("--label-smoothing", "label smoothing eps_ls", FRACTION),
    Option("--vocab-size", "pieces of the sentencepiece BPE vocabulary", vocab_size),
    Option("--batch-size", "sequences per batch (a language model's: blocks of --block-size "
                           "tokens)", positive_int),
    # how long
    Option("--max-steps", "training updates: the run ends after this many, or earlier at its "
                          "epoch or time limit", positive_int, aliases=("--steps",)),
    Option("--max-epochs", "stop after N passes over the training data (an epoch: the updates "
                           "that read the training data once), or at the step or time limit if "
                           "that comes first", number(0, low_open=True), "N", absent="no limit"),
    Option("--time-limit", "stop, with a checkpoint, after this much training time over all "
                           "sessions of the run: 90s, 60m, 1.5h", duration, "TIME",
           absent="no limit"),
    # the optimiser and the learning rate
    Option("--warmup", "warmup steps", integer(0)),
    Option("--lr-factor", "scales the paper's learning-rate schedule",
           number(0, low_open=True)),
    Option("--schedule", "after the warmup: the paper's inverse square root, or a linear or "
                         "cosine decay to --min-lr at the last update, or at --time-limit if "
                         "that comes first", choices=SCHEDULES),
    Option("--lr", "peak learning rate of --schedule linear or cosine",
           number(0, low_open=True),
           absent="the paper's rate at the end of the warmup, times --lr-factor"),
    Option("--min-lr", "learning rate at the end of --schedule linear or cosine", number(0)),
    Option("--cooldown", "bring the rate down linearly to 0 over this last part of the run: a "
                         "fraction (of the run, by updates or by --time-limit, whichever is "
                         "further), or a number of updates (1200steps) or epochs (8epochs), "
                         "whatever the clock", phase(), "PHASE", absent="none"),
    Option("--weight-decay", "AdamW's decoupled weight decay", number(0)),
    Option("--clip-norm", "clip the global gradient norm to this", number(0, low_open=True),
           absent="no clipping"),
    Option("--update-freq", "batches summed into one update", positive_int),
    Option("--dropout-start", "late dropout: none for this first part of the run, then the "
                              "dropouts above: a fraction (of the run, by updates or by "
                              "--time-limit, whichever is further), a number of updates "
                              "(1200steps) or epochs (8epochs), or auto: from the first "
                              "validation whose perplexity improved by less than "
                              "--dropout-start-margin on the previous one",
           phase(auto=True), "PHASE"),
    Option("--dropout-start-margin", "with --dropout-start auto: the relative improvement of "
                                     "the validation perplexity below which dropout starts",
           FRACTION, "FRACTION"),
    Option("--seed", "seeds the initialisation, dropout and the data order", integer(0)),
    # when to log, validate, save; choosing by validation
    Option("--log-every", "steps between log lines", positive_int),
    Option("--valid-every", "steps between validations; 0: only at the end", integer(0),
           aliases=("--eval-every",)),
    Option("--save-every", "steps between checkpoints; 0: at the end and on a signal",
           integer(0)),
    Option("--keep-last", "checkpoints kept, the newest", positive_int),
    Option("--best-metric", "choose by this validation result (loss: lower is better; bleu, "
                            "acc: higher). Every validation then saves a checkpoint that "
                            "records it, its log line and run.json show the best so far and its "
                            "step, and checkpoint_best.npz names the best checkpoint",
           choices=tuple(BEST_METRICS), absent="none"),
    Option("--keep-best", "also keep the checkpoints of the N best validations, which the "
                          "rotation of the last ones never deletes (needs --best-metric)",
           integer(0), "N"),
    Option("--patience", "stop after N validations (every --valid-every) without a better "
                         "--best-metric (a tie is no improvement); the run ends as done, exit "
                         "status 0; 0: never", integer(0), "N"),
    # the run directory and the console
    Option("--out", "run directory"),
    Option("--resume", "continue the run in --out from its latest checkpoint", switch=True),
    Option("--quiet", "no progress bars", switch=True),
    Option("--no-lock", "do not lock the run directory (for a file system without file locks; "
                        "then make sure no other run uses --out)", switch=True),
    Option("--checkpoint", "a checkpoint to use instead of training (train_wmt.py --eval-only, "
                           "train_lm.py --sample)", absent="none"),
    # where a worker runs, and how it computes
    Option("--backend", "array backend", choices=("numpy", "cupy", "auto")),
    Option("--threads", "BLAS threads per worker on the CPU", integer(1, C_INT_MAX), "N"),
    Option("--precision", "matrix products: tf32 on a GPU's tensor cores (compute capability "
                          "8.0 or higher; batched products, attention's, stay float32), plain "
                          "fp32, or fp16: mixed precision, float16 operands summed in float32 "
                          "with float32 master weights and a dynamic loss scale (on the CPU "
                          "too, slowly)", choices=products.PRECISIONS,
           absent="tf32 on such a GPU, else fp32"),
    Option("--loss-scale", f"fp16: the initial loss scale, halved at every update whose "
                           f"gradients overflow (skipped) and doubled after "
                           f"{gradscale.GROWTH_INTERVAL} finite ones",
           number(0, low_open=True), "S"),
    Option("--kernels", "fused: on a GPU, fused kernels (softmax, LayerNorm, dropout, loss, "
                        "Adam ... each in one launch); on the CPU, the row passes (the same "
                        "layers, block by block on every thread of the worker); plain: the "
                        "plain array code alone",
           choices=KERNELS, absent="$MINITFM_KERNELS, else fused on the CPU; plain on a "
                                   "GPU until a GPU run has shown every kernel equal to its "
                                   "plain twin"),
    # beam search (beam.py's module docstring says what each does)
    Option("--beam", "beam size", positive_int),
    Option("--lenpen", "length penalty alpha: a finished translation Y scores "
                       "log P(Y) / lp(|Y|)", number(0)),
    Option("--lenpen-form", "lp: gnmt, ((5 + |Y|) / 6)^alpha, the paper's; power, |Y|^alpha, as "
                            "CTranslate2, fairseq and Marian (|Y| counts the EOS)",
           choices=beam.LENGTH_PENALTIES),
    Option("--stopping", "when a sentence is done: exact, once no live hypothesis can beat the "
                         "best finished one (the N best with --nbest) within the length limit; "
                         "first-k, once --beam hypotheses have finished; auto, exact with "
                         "--lenpen 0 and first-k otherwise, as chosen on validation",
           choices=beam.STOPPING_RULES),
]}
PLACEMENT = ("backend", "threads", "precision", "loss_scale", "kernels")
SEARCH = ("beam", "lenpen", "lenpen_form", "stopping")
SEARCH_DEFAULTS = {"beam": 4, "lenpen": 0.6, "lenpen_form": "gnmt", "stopping": "auto"}
RUN = ("out", "resume", "quiet", "no_lock")


def _default_words(value) -> str:
    if isinstance(value, Words):
        return f": {value.text}"
    return f" {value:g}" if isinstance(value, float) else f" {value}"


def add(group, *names: str, defaults: Mapping = {}, choices: Mapping = {},
        values: bool = False) -> None:
    """Add the options ``names`` (keys of :data:`VOCABULARY`) to ``group`` (a parser or an
    argument group), each with the default words of ``defaults`` (a value, a :class:`Words`)
    or its ``absent`` words, and ``choices`` where a command allows only some; its old names
    too (hidden from the help). ``values``: the defaults that are values are argparse's too
    (for a command without a :class:`Trainer`, which fills them in after parsing)."""
    for name in names:
        option = VOCABULARY[name]
        default = defaults.get(name, None if option.absent is None else Words(option.absent))
        kwargs = ({"action": "store_true"} if option.switch else
                  {"type": option.type, "metavar": option.metavar,
                   "choices": choices.get(name, option.choices)})
        help = option.help if option.switch or default is None else \
            f"{option.help} (default{_default_words(default)})"
        if values and default is not None and not isinstance(default, Words):
            kwargs["default"] = default
        group.add_argument(option.flag, **kwargs, help=help)
        for alias in option.aliases:
            group.add_argument(alias, **kwargs, dest=option.dest, default=argparse.SUPPRESS,
                               help=argparse.SUPPRESS, action=_Renamed, new=option.flag)


def add_search_options(group) -> None:
    """Beam search's settings (:data:`SEARCH`), with their defaults, for a command that decodes
    (``minitfm.translate``, ``minitfm.export``)."""
    add(group, *SEARCH, defaults=SEARCH_DEFAULTS, values=True)


def add_ensemble_option(group) -> None:
    """``--ensemble CKPT ...``: more checkpoints decoded with ``--checkpoint`` as one ensemble
    (``minitfm.translate``, ``train_wmt.py --eval-only``)."""
    group.add_argument("--ensemble", nargs="+", default=[], metavar="CKPT",
                       help="more checkpoints, trained with the same vocabulary, decoded "
                            "together with --checkpoint: each step's next-token probabilities "
                            "are the mean of the models'")


class _Renamed(argparse.Action):
    """An old name of the option ``new``: stores its value as ``new`` does, and says so in
    one line."""

    def __init__(self, option_strings, dest, new: str, **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"note: {option_string} is now {self.new} (the old name works in this release)",
              file=sys.stderr, flush=True)
        setattr(namespace, self.dest, values)


# ---- a trainer's options ---------------------------------------------------------------------

@dataclass(frozen=True)
class Trainer:
    """The shared options a trainer has, and its defaults: ``defaults`` by option (a value or
    :class:`Words`); ``by``, an option whose value picks a row of ``varying`` (a table of
    defaults per preset or task); ``choices`` where it allows only some of an option's;
    ``defining``, the options a resumed run may not change."""

    shared: tuple[str, ...]
    defaults: Mapping = field(default_factory=dict)
    by: str | None = None
    varying: Mapping[str, Mapping] = field(default_factory=dict)
    choices: Mapping[str, tuple] = field(default_factory=dict)
    defining: tuple[str, ...] = ()

    def add_options(self, group, names: Sequence[str]) -> None:
        """Add the shared options ``names`` (of ``self.shared``) to ``group``."""
        unknown = sorted(set(names) - set(self.shared))
        if unknown:
            raise ValueError(f"{unknown} are not among this trainer's shared options")
        per_row = {name: Words(f"per {self.by}") for row in self.varying.values() for name in row}
        add(group, *names, defaults={**self.defaults, **per_row}, choices=self.choices)

    def table(self) -> str:
        """The defaults per preset or task, for the end of --help ("" without such a table)."""
        if not self.varying:
            return ""
        lines = [f"defaults per {self.by}:"]
        for key, row in self.varying.items():
            lines.append(f"  {key:7}  " + ", ".join(
                f"--{name.replace('_', '-')}{_default_words(value)}"
                for name, value in row.items()))
        return "\n".join(lines)


def parse(parser: argparse.ArgumentParser, trainer: Trainer,
          argv: Sequence[str] | None) -> argparse.Namespace:
    """The options of ``argv``: parsed, the trainer's defaults filled in where none was given,
    and checked (:func:`check`); a bad one ends the command with a usage error (status 2)."""
    args = parser.parse_args(argv)
    given = {name for name in trainer.shared if getattr(args, name, None) not in (None, False)}
    if trainer.by and getattr(args, trainer.by) is None:     # the preset or task first: the
        setattr(args, trainer.by, trainer.defaults[trainer.by])   # row of defaults it picks
    row = trainer.varying.get(getattr(args, trainer.by), {}) if trainer.by else {}
    for name, value in {**trainer.defaults, **row}.items():
        if getattr(args, name, None) is None and not isinstance(value, Words):
            setattr(args, name, value)
    check(parser, args, given)
    return args


def check(parser: argparse.ArgumentParser, args: argparse.Namespace, given: set[str]) -> None:
    """The rules between the shared options (``given``: the options on the command line)."""
    def get(name: str):
        return getattr(args, name, None)

    if get("best_metric") is None:
        for name in ("keep_best", "patience"):
            if get(name):
                parser.error(f"--{name.replace('_', '-')} ranks validations by --best-metric: "
                             f"give that too (e.g. --best-metric loss)")
    if get("patience") and not get("valid_every"):
        parser.error("--patience counts validations: give --valid-every N (> 0)")
    if get("dropout_start") == phases.AUTO and not get("valid_every"):
        parser.error("--dropout-start auto decides at validations: give --valid-every N (> 0)")
    schedule = get("schedule") or "paper"
    if schedule == "paper":
        if "lr" in given:
            parser.error("--lr is the peak of --schedule linear or cosine; scale the paper's "
                         "schedule with --lr-factor")
        if get("warmup") is not None and get("warmup") < 1:
            parser.error("--schedule paper needs --warmup >= 1")
        return
    if get("warmup") >= get("max_steps"):
        parser.error(f"--warmup {get('warmup')} must be below --max-steps {get('max_steps')}: "
                     f"the {schedule} decay ends at the last update")
    if get("lr") is not None and get("min_lr") > get("lr"):
        parser.error(f"--min-lr {get('min_lr'):g} is above --lr {get('lr'):g}")


def train_options(args: argparse.Namespace, trainer: Trainer) -> TrainOptions:
    """What the training loop is told: the parsed shared options of ``args``, in one object."""
    names = {f.name for f in dataclasses.fields(TrainOptions)}
    values = {name: getattr(args, name) for name in trainer.shared
              if name in names and getattr(args, name, None) is not None}
    values["best_metric"] = BEST_METRICS.get(getattr(args, "best_metric", None))
    return TrainOptions(**values, out_dir=args.out, progress=not args.quiet,
                        command=dict(vars(args)), defining=trainer.defining)
