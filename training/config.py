"""The run's configuration: typed dataclasses with defaults, YAML files for values, dotted overrides.

    python train.py --config crnn.yaml optim.lr=3e-4 data.train=[datasets/a,datasets/b]

Unknown keys and values of the wrong type are errors that name the full key. Plain dataclasses rather
than Hydra or OmegaConf: the whole schema reads in one file, needs no dependency, and its checks
(types, ranges, repeated YAML keys) give errors in this project's words.

A value means what it was typed as (`1e-3` is a number, `017` is refused; training/config_yaml.py reads
the YAML). `~` in a path key is the home folder, in files and on the command line alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from data.alphabet import load_alphabet
from data.augment import AUGMENTATIONS, LEVELS
from data.codec import CTCCodec
from data.label_index import INDEX_CACHE_WORDS
from data.lmdb_dataset import UNKNOWN_CHARACTERS
from data.transforms import Preprocessing, PreprocessingError
from models import check_model_config, setting_defaults
from training.config_yaml import (
    OTHER_KEYS,
    ConfigError,
    apply_overrides,
    apply_values,
    expand_paths,
    read_config_file,
    resolve_config_path,
    schema_fields,
)
from training.optim import OPTIMIZERS, SCHEDULES
from utils.checks import not_one_of, out_of_range
from utils.precision import PRECISIONS

RESUMABLE = "may_change_on_resume"
BOUND_TO = "a_checkpoint_loaded_into_a_run_needs_the_same_value"
PATH = "is_a_path"  # a file or folder: `~` is expanded, and an empty value is refused
RESUME_WORDS = ("auto", "none")  # what train.resume takes besides a checkpoint's path
# train.init_alphabet's choices: which characters a run started from a checkpoint reads (training/alphabet_policy.py)
INIT_ALPHABETS = ("new", "union")


def resumable(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING) -> Any:
    """A field that may change when a run is continued: how long it runs, how often it logs, evaluates
    and saves, how it is spread over processes and devices. Every other field (data, model,
    optimiser, batch, seed) defines the run, and a folder holding a run refuses another value."""
    return field(default=default, default_factory=factory, metadata={RESUMABLE: True})


def bound_to(part: str, default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING) -> Any:
    """A field that a checkpoint's `part` depends on: "model" (its weights fit no other value: the
    architecture and its sizes, the input's channels and height) or "optimizer" (its optimizer state).
    A checkpoint loaded into a run whose value differs is refused (training.checkpoint.check_config):
    for its model part by train.resume and train.init_from, for its optimizer part by train.resume."""
    return field(default=default, default_factory=factory, metadata={BOUND_TO: part})


def path_field(
    default: Any = dataclasses.MISSING,
    *,
    factory: Any = dataclasses.MISSING,
    may_change: bool = False,
    words: tuple[str, ...] = (),
) -> Any:
    """A field naming a file or folder (or a list of them). `words`: values that are settings, not paths
    (`auto`, `none`, `off`); the empty value is refused unless it is one of them."""
    return field(default=default, default_factory=factory, metadata={PATH: words, RESUMABLE: may_change})


@dataclass
class DataConfig:
    train: list[str] = path_field(factory=lambda: ["datasets/synth/train"])  # LMDB folders
    val: list[str] = path_field(factory=lambda: ["datasets/synth/val"], may_change=True)
    # Sets read at every validation beside data.val but never choosing best.pt: what a fine-tune must not
    # forget (the synthetic val, the benchmark of the domain the start came from). With train.init_from, the
    # run's end says what the start read on each set and what best.pt reads (training/forgetting.py).
    retain: list[str] = path_field(factory=list, may_change=True)
    # Share of each global batch drawn from each data.train entry, e.g. [0.5, 0.5] for MJSynth +
    # SynthText; empty: one shuffle of all of them together (each in proportion to its size).
    train_ratios: list[float] = field(default_factory=list)
    # The characters the model reads: the characters themselves, or a .txt file with one per line.
    alphabet: str = "0123456789abcdefghijklmnopqrstuvwxyz"
    fold_case: bool = True  # lowercase labels before encoding (for a case-insensitive alphabet)
    # A training label with characters outside the alphabet ("$10", "Direction?"): drop the sample, or
    # remove those characters and train on the rest, as the benchmarks' protocol scores them (real data
    # is full of punctuation a 36-character model cannot emit). Validation then scores them that way too.
    # One of data/lmdb_dataset.py's UNKNOWN_CHARACTERS.
    unknown_characters: str = "drop"
    img_height: int = bound_to("model", 32)
    img_width: int = 100
    keep_aspect: bool = False  # resize to the height, keep the aspect ratio, pad the right side
    # With keep_aspect, widen a crop narrower than img_width by up to this factor before padding (1: its
    # aspect ratio kept). A single letter stretched to 128 px is a blob; padded whole, a word has few frames.
    max_stretch: float = 1.0
    # The resize filter: one of data/transforms.py's INTERPOLATIONS (Pillow's, and cv2.resize's opencv_linear).
    interpolation: str = "bilinear"
    # Normalisation, torchvision's (pixels / 255 - mean) / std: one value for every channel or one per
    # channel. 0.5 and 0.5 map pixels to [-1, 1]. Stored with the rest of the preprocessing in every
    # checkpoint, which is what evaluation, prediction and export then apply.
    mean: list[float] = field(default_factory=lambda: [0.5])
    std: list[float] = field(default_factory=lambda: [0.5])
    # With keep_aspect, evaluation pads each image only to the next multiple of this many pixels
    # and batches images of equal width (faster, same results for any batching); 0: pad to img_width.
    eval_width_step: int = resumable(8)
    # Data-loader worker processes per training process; auto: what keeps a GPU fed, resolved at start-up
    # on each machine (utils/distributed.py's loader_workers), and kept as `auto` in checkpoints.
    num_workers: int | Literal["auto"] = resumable(2)
    # Training-time augmentation: a level of data/augment.py's LEVELS; the `augment` section overrides
    # single probabilities. Never applied in validation, evaluation or prediction.
    augment: str = "light"
    # Where the usable-sample index of each LMDB is cached (data/label_index.py), so that a restart
    # need not read every label again (~40 s for 14.4 M): auto ($XDG_CACHE_HOME or ~/.cache, then
    # crnn-ocr/lmdb-index), a folder, or off. Never the dataset's own folder; safe to delete any time.
    index_cache: str = path_field("auto", may_change=True, words=INDEX_CACHE_WORDS)


@dataclass
class ModelConfig:
    arch: str = bound_to("model", "crnn")  # an architecture registered in models/ (models.register_model)
    in_channels: int = bound_to("model", 1)  # 1: grayscale, 3: RGB (data/transforms.py's COLORS)
    hidden_size: int = bound_to("model", 256)
    # BatchNorm statistics over the global batch instead of each process's slice: a run on N
    # processes then computes what one process would with the same global batch. Costs two small
    # all-reduces per BatchNorm layer; worth it when the per-process batch is small.
    sync_bn: bool = False
    # Every other key of the section is the architecture's own setting, passed to its constructor by
    # name: e.g. the CRNN's `channels`, its backbone's seven convolution widths (default: the paper's).
    # models.check_model_config refuses a name the constructor does not take.
    settings: dict[str, Any] = field(default_factory=dict, metadata={OTHER_KEYS: True, BOUND_TO: "model"})


@dataclass
class OptimConfig:
    name: str = bound_to("optimizer", "adam")  # an entry of training/optim.py's OPTIMIZERS
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 100
    schedule: str = "cosine"  # after the warm-up: an entry of training/optim.py's SCHEDULES
    min_lr_ratio: float = 0.05  # the cosine and wsd schedules end at lr * min_lr_ratio
    decay_share: float = 0.2  # the wsd schedule decays over this share of the steps after the warm-up
    grad_clip: float = 5.0  # max global gradient norm; 0 disables clipping
    # Validate and save an exponential moving average of the weights with this decay per step; 0: off
    ema_decay: float = 0.0


@dataclass
class TrainConfig:
    batch_size: int = 32  # global: across all processes; each takes batch_size / world_size
    max_steps: int = resumable(1000)  # optimizer steps
    # Minutes the training loop may take on this machine: fewer steps than max_steps when they would not fit,
    # the learning-rate schedule fitted to them, planned from the pace of the first steps and again every
    # 100 steps (training/time_budget.py); null: max_steps, however long they take
    max_minutes: float | None = resumable(None)
    eval_every: int = resumable(250)
    log_every: int = resumable(50)
    eval_batch_size: int = resumable(128)  # global, like batch_size
    out_dir: str = path_field("runs/crnn", may_change=True)
    seed: int = 0
    precision: str = resumable("auto")  # one of utils/precision.py's PRECISIONS (fp16 on CUDA only)
    channels_last: bool = resumable(True)
    # torch.compile the training step's model (the first steps then take minutes to compile). It
    # speeds up GPUs; on a CPU the step is the convolutions' own time and it gained nothing (docs/performance.md).
    compile: bool = resumable(False)
    tensorboard: bool = resumable(True)  # scalars and decoded validation samples in out_dir/tensorboard (rank 0)
    threads: int = resumable(0)  # CPU threads per process; 0: OMP_NUM_THREADS if set, else cores / processes
    save_every: int = resumable(250)  # steps between full checkpoints (also written at the end and when stopped)
    keep_checkpoints: int = resumable(3)  # the newest K numbered checkpoints are kept; best.pt is kept apart
    # auto: continue from the newest valid checkpoint in out_dir, if any; none: start afresh;
    # or the path of a checkpoint to continue from (model, optimizer, scheduler, data position, RNG).
    resume: str = path_field("auto", may_change=True, words=RESUME_WORDS)
    overwrite: bool = resumable(False)  # start afresh in an out_dir that holds another run, deleting its checkpoints
    # a checkpoint whose weights start this run (its optimizer is not used); empty: none
    init_from: str = path_field("", may_change=True, words=("",))
    # With train.init_from: the first N steps train the sequence model and classifier only, the backbone's
    # weights and BatchNorm statistics held as the start had them (models: every architecture's `backbone`),
    # so that the new head's first, large gradients do not reach the features the start learned.
    freeze_backbone_steps: int = 0
    # The alphabet of a run started from init_from, one of INIT_ALPHABETS. new: data.alphabet's characters, the
    # checkpoint's rows moved to them by character, the rest dropped; union: the checkpoint's alphabet (less its
    # capitals under data.fold_case), then the characters of data.alphabet it lacks. A resume reads it from the
    # run's own checkpoint.
    init_alphabet: str = resumable("new")
    max_nonfinite_steps: int = resumable(20)  # consecutive steps skipped for a NaN/inf gradient before the run stops
    # The sanity check of a recipe that does not learn: train on the first N batches, unaugmented, until the
    # model reads them all or max_steps, and exit 0 or 1 (training/overfit.py); 0: train as usual
    overfit_batches: int = 0
    # At the end of the run, fit best.pt's confidence to data.val: a temperature stored in best.pt, which eval.sh,
    # predict.py and the exports apply (training/calibration.py, docs/evaluation.md#calibrated-confidence)
    calibrate: bool = resumable(True)


# The `augment` section: a key per entry of data/augment.py's AUGMENTATIONS, a probability (0 to 1) that
# overrides data.augment's level for that transform; null: the level's. Made from the table, so that an
# augmentation a fork adds there is a key here without a line in this file.
AugmentConfig = dataclasses.make_dataclass(
    "AugmentConfig", [(step.name, float | None, field(default=None)) for step in AUGMENTATIONS]
)
AugmentConfig.__module__ = __name__  # where pickle looks for it (make_dataclass would say `types`)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    # Physical GPU of each local rank on a shared server (local rank i uses device_ids[i]);
    # empty: local rank i uses cuda:i. CUDA_VISIBLE_DEVICES does the same from outside.
    device_ids: list[int] = resumable(factory=list)


class ConfigFileOption(argparse.Action):
    """`--config FILE` of every command, refused when given twice: argparse would keep the second file
    and drop every value of the first without a word."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        value: Any,
        option_string: str | None = None,
    ) -> None:
        if getattr(self, "given", None) is not None:
            raise ConfigError(
                f"--config is given twice ({self.given}, then {value}); a second file would replace the "
                f"first: give one, and override its keys on the command line (e.g. optim.lr=3e-4)"
            )
        self.given = value
        setattr(namespace, self.dest, value)


def load_config(path: str | None, overrides: list[str]) -> Config:
    """Defaults, then the YAML file's values, then `key=value` overrides (values read as in a file)."""
    config = Config()
    if path:
        config_path = resolve_config_path(path)
        apply_values(config, read_config_file(config_path), prefix="", source=str(config_path))
    apply_overrides(config, overrides)
    expand_paths(config, path_keys())
    return config


def path_keys() -> dict[str, tuple[str, ...]]:
    """Every key naming a file or folder, with the words it takes besides a path."""
    return {key: item.metadata[PATH] for key, item in leaf_fields().items() if PATH in item.metadata}


def validate(config: Config) -> None:
    """Checks that need no processes (the alphabet file is the one file read): wrong choices and keys that
    contradict each other fail before anything starts. Each part checks one kind of thing; the first
    problem found is the error."""
    check_choices(config)
    check_ranges(config)
    try:  # the preprocessing's keys are checked by the one check of a preprocessing, which names them
        Preprocessing.from_config(config)
    except PreprocessingError as error:
        raise ConfigError(str(error)) from None
    check_datasets(config)
    if config.train.resume not in RESUME_WORDS and config.train.init_from:
        raise ConfigError(
            "train.resume names a checkpoint and train.init_from is set: resume continues a run,"
            " init_from starts one; keep one of them"
        )
    if config.train.freeze_backbone_steps and not config.train.init_from:
        raise ConfigError(
            f"train.freeze_backbone_steps={config.train.freeze_backbone_steps} without train.init_from: a backbone"
            f" freshly initialised has nothing to keep; set train.init_from=CHECKPOINT, or leave the key at 0"
        )
    check_case_folding(config)
    try:
        check_model_config(config.model)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def check_choices(config: Config) -> None:
    """Each key that names an entry of a table, against the table of the module that makes the choice."""
    choices = {
        "optim.name": (config.optim.name, tuple(OPTIMIZERS)),
        "optim.schedule": (config.optim.schedule, tuple(SCHEDULES)),
        "train.precision": (config.train.precision, PRECISIONS),
        "data.augment": (config.data.augment, LEVELS),
        "data.unknown_characters": (config.data.unknown_characters, UNKNOWN_CHARACTERS),
        "train.init_alphabet": (config.train.init_alphabet, INIT_ALPHABETS),
    }
    for key, (value, allowed) in choices.items():
        problem = not_one_of(key, value, allowed)
        if problem:
            raise ConfigError(problem)


def check_ranges(config: Config) -> None:
    """Every number outside the preprocessing (data.transforms checks those), against its range: here, where
    the config is read, not deep in PyTorch. NaN fails every comparison, so it is refused too."""
    train, optim = config.train, config.optim
    ranges: dict[str, tuple[float, float, float]] = {  # (value, lowest, highest)
        "train.batch_size": (train.batch_size, 1, math.inf),
        "train.max_steps": (train.max_steps, 1, math.inf),
        "train.eval_every": (train.eval_every, 1, math.inf),
        "train.log_every": (train.log_every, 1, math.inf),
        "train.eval_batch_size": (train.eval_batch_size, 1, math.inf),
        "train.save_every": (train.save_every, 1, math.inf),
        "train.keep_checkpoints": (train.keep_checkpoints, 1, math.inf),
        "train.max_nonfinite_steps": (train.max_nonfinite_steps, 1, math.inf),
        "train.overfit_batches": (train.overfit_batches, 0, math.inf),
        "train.freeze_backbone_steps": (train.freeze_backbone_steps, 0, math.inf),
        "train.seed": (train.seed, 0, 2**32 - 1),  # what NumPy's seeding takes
        "train.threads": (train.threads, 0, math.inf),
        "data.eval_width_step": (config.data.eval_width_step, 0, math.inf),
        "model.hidden_size": (config.model.hidden_size, 1, math.inf),
        "optim.lr": (optim.lr, 1e-12, math.inf),
        "optim.weight_decay": (optim.weight_decay, 0, 1e3),
        "optim.warmup_steps": (optim.warmup_steps, 0, math.inf),
        "optim.min_lr_ratio": (optim.min_lr_ratio, 0, 1),  # below 0 the lr turns negative, above 1 it rises
        "optim.decay_share": (optim.decay_share, 1e-6, 1),
        "optim.grad_clip": (optim.grad_clip, 0, math.inf),
        "optim.ema_decay": (optim.ema_decay, 0, math.inf),
    }
    if config.data.num_workers != "auto":
        ranges["data.num_workers"] = (config.data.num_workers, 0, math.inf)
    if train.max_minutes is not None:  # null: no limit
        ranges["train.max_minutes"] = (train.max_minutes, 1e-3, math.inf)
    ranges.update({f"data.train_ratios[{i}]": (value, 0, math.inf) for i, value in enumerate(config.data.train_ratios)})
    ranges.update(
        {
            f"augment.{name}": (value, 0, 1)
            for name, value in dataclasses.asdict(config.augment).items()
            if value is not None
        }
    )
    for key, (value, lowest, highest) in ranges.items():
        problem = out_of_range(key, value, lowest, highest)
        if problem:
            raise ConfigError(problem)
    if optim.ema_decay >= 1:  # the range check above has seen it is at least 0
        raise ConfigError(
            f"optim.ema_decay={optim.ema_decay}: must be below 1 (the average would never "
            f"move); 0 turns the average off, 0.999 averages over about the last 1,000 steps"
        )


def check_datasets(config: Config) -> None:
    """data.train and data.val each list LMDBs, each once; data.train_ratios gives one share per entry."""
    data = config.data
    if not data.train:
        raise ConfigError("data.train is empty: list at least one LMDB folder")
    if not data.val:  # best.pt would hold the weights of the first validation, of nothing, forever
        raise ConfigError(
            "data.val is empty: list at least one LMDB folder to validate on; best.pt is the "
            "checkpoint that scores best there (a held-out part of the training data will do)"
        )
    for key, roots in (("data.train", data.train), ("data.val", data.val), ("data.retain", data.retain)):
        check_listed_once(key, roots)
    validated = {os.path.realpath(root) for root in data.val}
    for root in data.retain:
        if os.path.realpath(root) in validated:
            raise ConfigError(
                f"data.retain and data.val both list {root}: data.val is read at every validation already; "
                f"keep it in data.val only"
            )
    ratios = data.train_ratios
    if ratios and (len(ratios) != len(data.train) or sum(ratios) <= 0):  # each >= 0: check_ranges
        raise ConfigError(
            f"data.train_ratios={ratios}: give one ratio of 0 or more per data.train entry "
            f"({len(data.train)}), not all 0"
        )


def config_warnings(config: Config, device_type: str) -> list[str]:
    """Keys that do not contradict each other but may not do what was meant on a `device_type` device: said at
    start-up, not refused (a short smoke run of a recipe with a long warm-up is a fair thing to ask for)."""
    steps, minutes = config.train.max_steps, config.train.max_minutes
    warnings = [short_of_warmup(config.optim, steps, f"train.max_steps={steps}")]
    if minutes is not None and device_type == "cuda":  # said, not changed: nothing swaps the network silently
        warnings.append(
            f"train.max_minutes={minutes:g} on a GPU: a time limit is a CPU recipe's (configs/crnn.yaml fits its "
            f"network, batch and steps to a 2-core CPU's minutes); the GPU recipe is configs/crnn_gpu.yaml, which "
            f"has none"
        )
    return [warning for warning in warnings if warning]


def short_of_warmup(optim: OptimConfig, steps: int, end: str) -> str | None:
    """What a run that ends at `steps` (`end` says what sets it there) inside its warm-up never reaches."""
    if optim.warmup_steps <= steps:
        return None
    return (
        f"optim.warmup_steps={optim.warmup_steps} is more than {end}: the learning rate never reaches "
        f"optim.lr={optim.lr} (it ends at {steps / optim.warmup_steps:.1%} of it)"
    )


def check_listed_once(key: str, roots: list[str]) -> None:
    """An LMDB listed twice (`datasets/a` and `datasets/a/`) would be drawn twice as often, or scored twice."""
    first: dict[str, int] = {}
    for i, root in enumerate(roots):
        same = first.setdefault(os.path.realpath(root), i)
        if same != i:
            raise ConfigError(
                f"{key} lists one LMDB twice: {key}[{same}]={roots[same]} and {key}[{i}]={root}; list it "
                f"once" + (" (data.train_ratios sets each LMDB's share of a batch)" if key == "data.train" else "")
            )


def check_case_folding(config: Config) -> None:
    """data.fold_case lowercases every label: capital letters in the alphabet would be classes no target
    ever holds, and a mixed-case model would silently train case-insensitively. Reads the alphabet file."""
    if not config.data.fold_case:
        return
    conflicts = CTCCodec(load_alphabet(config.data.alphabet), fold_case=True).case_folding_conflicts()
    if conflicts:
        shown = "".join(conflicts[:10]) + ("..." if len(conflicts) > 10 else "")
        raise ConfigError(
            f"data.fold_case=true lowercases every label, but data.alphabet has {len(conflicts)} "
            f"character(s) no lowercased label holds ({shown}): the model would never learn them. Set "
            f"data.fold_case=false to read case, or remove them from data.alphabet"
        )


def leaf_fields(node: Any = None, prefix: str = "") -> dict[str, dataclasses.Field]:
    """Every key of the config that holds a value (`train.max_steps`, ...), with its field."""
    node = Config() if node is None else node
    leaves = {}
    for item in schema_fields(node).values():
        value = getattr(node, item.name)
        if dataclasses.is_dataclass(value):
            leaves.update(leaf_fields(value, prefix=f"{prefix}{item.name}."))
        else:
            leaves[f"{prefix}{item.name}"] = item
    return leaves


def resumable_keys() -> set[str]:
    """The keys a continued run may change (declared with `resumable` where each key is defined)."""
    return {key for key, item in leaf_fields().items() if item.metadata.get(RESUMABLE)}


def key_metadata(full_key: str) -> Any:
    """The field metadata of a key (`optim.lr`), or of the field that takes its section's other keys
    (`model.channels`); {} for a key the schema does not know (one an older version had)."""
    *sections, name = full_key.split(".")
    node: Any = Config()
    for section in sections:
        node = getattr(node, section, None)
        if not dataclasses.is_dataclass(node):
            return {}
    known = schema_fields(node)
    if name in known:
        return known[name].metadata
    extra = [item for item in dataclasses.fields(node) if item.metadata.get(OTHER_KEYS)]
    return extra[0].metadata if extra else {}


@dataclass
class ConfigChanges:
    """How a run's config differs from an earlier one (a run folder's config.yaml, a checkpoint's):
    `key: old -> new` lines, by what the difference means."""

    model: list[str]  # keys a checkpoint's weights are bound to: they fit no other value
    optimizer: list[str]  # keys its optimizer state is bound to
    run: list[str]  # the other keys that define the run: a run folder holds one value
    resumable: list[str]  # keys that may change when a run is continued

    @property
    def defining(self) -> list[str]:
        """What a run folder refuses: every change but the resumable ones."""
        return sorted(self.model + self.optimizer + self.run)


def config_changes(previous: dict[str, Any], current: Config) -> ConfigChanges:
    """The one comparison of an earlier config (a plain dict) with the run's. A key the earlier one lacks
    was added to the project after it was written: that run ran with the default, the Config's or, for an
    architecture's own `model.*` setting, its constructor's (either side may leave one out)."""
    changes = ConfigChanges([], [], [], [])

    def compare(old_section: dict[str, Any], new_section: dict[str, Any], prefix: str) -> None:
        for key in sorted(set(old_section) | set(new_section)):
            full_key, old, new = f"{prefix}{key}", old_section.get(key), new_section.get(key)
            if isinstance(old, dict) and isinstance(new, dict):
                compare(old, new, f"{full_key}.")
            elif old != new:
                metadata = key_metadata(full_key)
                kind = "resumable" if metadata.get(RESUMABLE) else metadata.get(BOUND_TO, "run")
                getattr(changes, kind).append(f"{full_key}: {old!r} -> {new!r}")

    compare(
        with_setting_defaults(with_defaults(previous, to_dict(Config()))), with_setting_defaults(to_dict(current)), ""
    )
    return changes


def with_setting_defaults(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with every `model.*` setting its architecture defaults and `values` leaves out."""
    model = values.get("model")
    if not isinstance(model, dict):
        return values
    return {**values, "model": {**setting_defaults(model.get("arch")), **model}}


def with_defaults(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """`values`, plus every key of `defaults` it lacks (in nested sections too)."""
    merged = dict(values)
    for key, default in defaults.items():
        if key not in merged:
            merged[key] = default
        elif isinstance(default, dict) and isinstance(merged[key], dict):
            merged[key] = with_defaults(merged[key], default)
    return merged


def to_dict(config: Config) -> dict:
    """Plain values, as in a YAML file: a section's other keys sit beside its own."""
    values = dataclasses.asdict(config)
    values["model"].update(values["model"].pop("settings"))
    return values


def from_dict(values: dict) -> Config:
    """Rebuild a Config from a checkpoint's plain dict (keys a newer version added keep defaults)."""
    config = Config()
    apply_values(config, values, prefix="", source="checkpoint config")
    return config
