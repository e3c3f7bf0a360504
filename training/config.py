"""The run's configuration: typed dataclasses with defaults, YAML files for values, dotted overrides.

    python train.py --config crnn.yaml optim.lr=3e-4 data.train=[datasets/a,datasets/b]

Unknown keys and values of the wrong type are errors that name the full key. Plain dataclasses rather
than Hydra or OmegaConf: the whole schema reads in one file, needs no dependency, and its checks
(types, ranges, repeated YAML keys) give errors in this project's words.

What was typed is what is used. PyYAML reads YAML 1.1, where `017` is 15, `1:30` is 90, `on` is true and
`1e-3` is text; here an unquoted value keeps its text and the key's type decides what it means
(`read_plain`): a number reads as a reader would read it, and a form YAML 1.1 reads otherwise is refused
with what to write. `~` in a path key is the home folder, in files and on the command line alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from data.alphabet import load_alphabet
from data.augment import AUGMENTATIONS, LEVELS
from data.codec import CTCCodec
from data.label_index import INDEX_CACHE_WORDS
from data.lmdb_dataset import UNKNOWN_CHARACTERS
from data.transforms import Preprocessing, PreprocessingError
from models import check_model_config, setting_defaults
from training.optim import OPTIMIZERS, SCHEDULES
from utils.checks import not_one_of, out_of_range
from utils.precision import PRECISIONS

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO_ROOT / "configs"
RESUMABLE = "may_change_on_resume"
BOUND_TO = "a_checkpoint_loaded_into_a_run_needs_the_same_value"
OTHER_KEYS = "takes_the_section's_other_keys"
PATH = "is_a_path"  # a file or folder: `~` is expanded, and an empty value is refused
RESUME_WORDS = ("auto", "none")  # what train.resume takes besides a checkpoint's path


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
    max_nonfinite_steps: int = resumable(20)  # consecutive steps skipped for a NaN/inf gradient before the run stops


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


class ConfigError(ValueError):
    pass


def resolve_config_path(name: str) -> Path:
    """A path as given, or a bare name (`crnn.yaml`, `crnn`) looked up in configs/."""
    for candidate in (Path(name), CONFIG_DIR / name, CONFIG_DIR / f"{name}.yaml"):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"config file {name!r} not found (looked in the current folder and in {CONFIG_DIR})")


class PlainText(str):
    """The text of an unquoted YAML scalar, as typed: the key's type decides what it means (read_plain)."""


PLAIN_TAG = "tag:crnn-ocr,plain"
NULLS = ("", "null", "Null", "NULL")  # `~` too in YAML; for a path key it would read as the home folder
BOOLEANS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
DECIMAL = re.compile(r"[-+]?(0|[1-9][0-9]*)")
# A real number as Python and YAML 1.2 write it (`1e-3` too), or infinity and NaN (`.inf`, `nan`: the
# range checks in `validate` then name the key).
REAL = re.compile(
    r"[-+]?(([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+" r"|\.?(?i:inf|infinity|nan))"
)


def real(text: str) -> float:
    """A text REAL matches, as a float: YAML's `.inf` and `.nan` are Python's `inf` and `nan`."""
    return float(re.sub(r"\.(?=[iInN])", "", text))


def decimal_or_octal(text: str, reading: Any) -> str:
    """What to write for `017`: the decimal number, and PyYAML's octal reading where that differs."""
    decimal = int(text.replace("_", ""), 10)
    octal = f", or {reading} if you meant octal" if isinstance(reading, int) and reading != decimal else ""
    return f"{decimal}{octal}"


def prefixed_number(text: str, reading: Any) -> str:
    """What to write for `0x1F`: its value in decimal, if it is a number in its base."""
    try:
        return str(int(text, 0))
    except ValueError:
        return "a decimal number"


# Forms that YAML 1.1, YAML 1.2 or Python read otherwise than a person does: (pattern, why, what to
# write instead, from the text and PyYAML's reading of it).
AMBIGUOUS: tuple[tuple[re.Pattern, str, Callable[[str, Any], str]], ...] = (
    (
        re.compile(r"(?i)yes|no|on|off|y|n"),
        "YAML 1.1 reads yes/no/on/off as true/false",
        lambda text, reading: "true or false",
    ),
    (re.compile(r"[-+]?0[0-9_]+"), "a leading 0 makes it octal in YAML 1.1", decimal_or_octal),
    (
        re.compile(r"[-+]?0[xob][0-9a-fA-F_]*"),
        "a 0x, 0o or 0b prefix: YAML 1.1 reads 0x and 0b, not 0o",
        prefixed_number,
    ),
    (
        re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?"),
        "YAML 1.1 reads numbers with ':' in base 60",
        lambda text, reading: f"{reading}, the value in decimal, if that is what you meant",
    ),
    (
        re.compile(r"[-+]?[0-9._]*_[0-9._]*([eE][-+]?[0-9]+)?"),
        "YAML 1.1 drops the '_', YAML 1.2 reads text",
        lambda text, reading: text.replace("_", ""),
    ),
    (
        re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}.*"),
        "YAML reads it as a date",
        lambda text, reading: f"'{text}', quoted",
    ),
)


class ConfigLoader(yaml.SafeLoader):
    """yaml.safe_load, except that an unquoted value keeps its text (PlainText), and a key given twice in
    one mapping is an error: PyYAML keeps the last one silently, so a second `train:` section would drop
    every key of the first."""

    # Every unquoted scalar resolves to PlainText, instead of YAML 1.1's booleans, octal and base-60 numbers.
    yaml_implicit_resolvers = {None: [(PLAIN_TAG, re.compile(r".*", re.DOTALL))]}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(
                    f"{self.name}:{line}: {key!r} is given twice in the same section (first at line "
                    f"{seen[key]}); YAML would keep only the last: merge them into one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


ConfigLoader.add_constructor(PLAIN_TAG, lambda loader, node: PlainText(node.value))


def parse_yaml(text: str, name: str) -> Any:
    loader = ConfigLoader(text)
    loader.name = name
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml_file(path: Path) -> Any:
    """A YAML file's contents, refusing repeated keys; errors name the file (and line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text ({error}); re-save it as UTF-8") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a folder; give a YAML file") from None
    try:
        return parse_yaml(text, str(path))
    except yaml.YAMLError as error:
        raise ConfigError(describe_yaml_error(error, path)) from None


def describe_yaml_error(error: yaml.YAMLError, path: Path) -> str:
    """PyYAML's multi-line report as one line: the file and line, and what is wrong there."""
    mark = getattr(error, "problem_mark", None)
    where = f"{path}:{mark.line + 1}" if mark else str(path)
    what = "; ".join(part for part in (getattr(error, "context", None), getattr(error, "problem", None)) if part)
    tabs = "; indent with spaces: YAML does not allow tabs there" if "'\\t'" in what else ""
    return f"{where}: not valid YAML: {what or error}{tabs}"


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
        values = read_yaml_file(config_path)
        if values is None:  # an empty file, or comments only: it would silently train the defaults
            raise ConfigError(
                f"{config_path} holds no keys; give the config you meant, or leave out --config to "
                f"train with the defaults"
            )
        if not isinstance(values, dict):
            raise ConfigError(f"{config_path}: expected a mapping of sections at the top level")
        apply_values(config, values, prefix="", source=str(config_path))
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep and override.endswith((".yaml", ".yml")):
            raise ConfigError(
                f"override {override!r}: expected key=value; to read a config file, give --config " f"{override}"
            )
        if not sep or not key:
            raise ConfigError(f"override {override!r}: expected key=value, e.g. optim.lr=3e-4")
        set_value(config, key.strip(), text, source="command line")
    expand_paths(config)
    return config


def schema_fields(node: Any) -> dict[str, dataclasses.Field]:
    """A section's keys with a type of their own (not the field that takes the other keys)."""
    return {f.name: f for f in dataclasses.fields(node) if not f.metadata.get(OTHER_KEYS)}


def other_keys(node: Any) -> dict[str, Any] | None:
    """Where a section keeps keys outside its schema (ModelConfig.settings); None: it refuses them."""
    return next((getattr(node, f.name) for f in dataclasses.fields(node) if f.metadata.get(OTHER_KEYS)), None)


def apply_values(node: Any, values: dict, prefix: str, source: str) -> None:
    names, extra = schema_fields(node), other_keys(node)
    for key, value in values.items():
        full_key = f"{prefix}{key}"
        if key not in names and extra is not None:
            extra[str(key)] = untyped(value, full_key, source)
            continue
        if key not in names:
            raise ConfigError(f"{source}: unknown key {full_key!r}; known keys here: {', '.join(names)}")
        current = getattr(node, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {full_key!r} is a section; give it a mapping of keys")
            apply_values(current, value, prefix=f"{full_key}.", source=source)
        else:
            setattr(node, key, coerce(value, field_type(node, key), full_key, source))


def set_value(config: Config, dotted_key: str, text: str, source: str) -> None:
    *path, last = dotted_key.split(".")
    node: Any = config
    for depth, name in enumerate(path):
        if not dataclasses.is_dataclass(node) or not hasattr(node, name):
            raise ConfigError(f"{source}: unknown key {'.'.join(path[: depth + 1])!r}")
        node = getattr(node, name)
    if not dataclasses.is_dataclass(node):
        raise ConfigError(f"{source}: unknown key {dotted_key!r}")
    extra = other_keys(node)
    if last not in schema_fields(node) and extra is not None:
        extra[last] = untyped(parse_yaml_value(text, dotted_key, source), dotted_key, source)
        return
    if last not in schema_fields(node):
        raise ConfigError(f"{source}: unknown key {dotted_key!r}")
    if dataclasses.is_dataclass(getattr(node, last)):
        raise ConfigError(f"{source}: {dotted_key!r} is a section; set its keys one by one")
    expected = field_type(node, last)
    # A string option takes the text as typed, quotes and brackets included: `data.alphabet=0123`.
    value = text if expected is str else parse_yaml_value(text, dotted_key, source)
    setattr(node, last, coerce(value, expected, dotted_key, source))


def parse_yaml_value(text: str, key: str, source: str) -> Any:
    try:
        value = parse_yaml(text, source)
    except (yaml.YAMLError, ConfigError):
        raise ConfigError(f"{source}: cannot parse the value of {key!r}: {text!r}") from None
    return PlainText("") if value is None else value  # `key=`: an empty document


def field_type(node: Any, name: str) -> Any:
    return typing.get_type_hints(type(node))[name]


def read_plain(text: PlainText, key: str, source: str, may_be_text: bool = False) -> Any:
    """What an unquoted value means to a person: null, true/false, a decimal integer, a real number
    (`1e-3` included, which YAML 1.1 leaves as text), or text. A form that YAML 1.1, YAML 1.2 or
    Python read otherwise (`017`, `0x1F`, `1:30`, `1_000`, `on`) is refused with what to write.
    `may_be_text`: the key takes text as well (an architecture's own setting), so quoting is a way out."""
    if text in NULLS:
        return None
    if text in BOOLEANS:
        return BOOLEANS[text]
    if DECIMAL.fullmatch(text):
        return int(text)
    if REAL.fullmatch(text) and not re.fullmatch(r"[-+]?0[0-9]+([eE].*)?", text):
        return real(text)
    for pattern, why, write in AMBIGUOUS:
        if pattern.fullmatch(text):
            reading = yaml_1_1(text)
            written = write(text, reading)
            quote = ", or quote it for the text" if may_be_text and not written.startswith("'") else ""
            raise ConfigError(
                f"{source}: {key}={text} is ambiguous ({why}; PyYAML alone reads {reading!r}); write "
                f"{written}{quote}"
            )
    return str(text)


def yaml_1_1(text: str) -> Any:
    """What PyYAML alone makes of an unquoted value (shown when it differs from what a person reads)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def untyped(value: Any, key: str, source: str) -> Any:
    """A value for a key outside the schema (an architecture's own setting): each unquoted scalar as
    read_plain reads it, in lists and mappings too."""
    if isinstance(value, PlainText):
        return read_plain(value, key, source, may_be_text=True)
    if isinstance(value, list):
        return [untyped(item, f"{key}[{i}]", source) for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {str(name): untyped(item, f"{key}.{name}", source) for name, item in value.items()}
    return value


def coerce(value: Any, expected: Any, key: str, source: str) -> Any:
    def wrong(what: str) -> ConfigError:
        return ConfigError(f"{source}: {key!r} must be {what}, got {typed!r}")

    typed = str(value) if isinstance(value, PlainText) else value  # as it was typed, for the messages

    if typing.get_origin(expected) in (types.UnionType, typing.Union):
        # `float | None`: null, or a value of the other type; `int | Literal["auto"]`: a word, or a value.
        options = typing.get_args(expected)
        if type(None) in options and (value is None or isinstance(value, PlainText) and value in (*NULLS, "~")):
            return None
        literals = [option for option in options if typing.get_origin(option) is Literal]
        words = [word for literal in literals for word in typing.get_args(literal)]
        if isinstance(value, str) and value in words:
            return str(value)  # plain text, not PlainText: the config is dumped to YAML as it is
        (inner,) = [option for option in options if option is not type(None) and option not in literals]
        try:
            return coerce(value, inner, key, source)
        except ConfigError:
            if not words:
                raise
            raise wrong(f"{'an integer' if inner is int else 'a number'} or {' or '.join(words)}") from None

    if typing.get_origin(expected) is list:
        (item_type,) = typing.get_args(expected)
        items = value if isinstance(value, list) else [value]  # a single value is a one-item list
        return [coerce(item, item_type, f"{key}[{i}]", source) for i, item in enumerate(items)]
    if expected is str:
        if isinstance(value, PlainText):  # a string key takes the text as typed
            if value == "~":
                raise ConfigError(
                    f"{source}: {key}=~ is ambiguous (null in YAML, the home folder in a shell); "
                    f"write '' for none, or the folder itself (~/ and a name)"
                )
            return "" if value in NULLS else str(value)
        if not isinstance(value, str):
            raise wrong("a string (quote it in YAML)")
        return value
    if isinstance(value, PlainText):
        value = read_plain(value, key, source)
    if expected is bool:
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if expected is int:
        if isinstance(value, float) and value.is_integer() and math.isfinite(value):
            raise wrong(f"an integer (write {int(value)})")
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an integer")
        return value
    if expected is float:
        # A quoted number ("1e-3") is accepted too, when it is one that read_plain would read.
        if isinstance(value, str) and REAL.fullmatch(value.strip()):
            return real(value.strip())
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise wrong("a number")
    raise TypeError(f"unsupported config type for {key}: {expected}")


def path_keys() -> dict[str, tuple[str, ...]]:
    """Every key naming a file or folder, with the words it takes besides a path."""
    return {key: item.metadata[PATH] for key, item in leaf_fields().items() if PATH in item.metadata}


def expand_paths(config: Config) -> None:
    """`~` is the home folder in every path key (the shell leaves `train.out_dir=~/runs` alone: it is not
    an assignment); an empty path is refused, as it would mean the working folder."""
    for key, words in path_keys().items():
        section, name = key.rsplit(".", 1)
        node = getattr(config, section)
        value = getattr(node, name)
        paths = value if isinstance(value, list) else [value]
        for i, item in enumerate(paths):
            where = f"{key}[{i}]" if isinstance(value, list) else key
            if not item.strip() and item not in words:
                settings = f", or {' or '.join(repr(word) for word in words)}" if words else ""
                raise ConfigError(f"{where} is empty: give a path{settings}")
        expanded = [item if item in words else os.path.expanduser(item) for item in paths]
        setattr(node, name, expanded if isinstance(value, list) else expanded[0])


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
    for key, roots in (("data.train", data.train), ("data.val", data.val)):
        check_listed_once(key, roots)
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
