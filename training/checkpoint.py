"""The checkpoint schema, listed here once: atomic writes, weights-only reads, no wrapper prefixes. The
weights are written by weights_checkpoint; the training part by training/run.py's Run.state_dict(),
which its load_state_dict() reads back.

A checkpoint is a dict of tensors and plain Python values, read on any device with
`torch.load(path, weights_only=True)`:

    format          FORMAT (absent: written before the field existed; the same keys otherwise)
    model           the unwrapped state dict (no `module.` or `_orig_mod.`): with optim.ema_decay > 0,
                    the moving average of the weights, which is what validation scored
    step, accuracy  the step it was saved at; its validation accuracy (best.pt), or None
    config          the run's config as a plain dict (training.config.to_dict)
    alphabet        the characters, in class order (the blank is class 0)
    preprocessing   data.transforms.Preprocessing as a dict: what turns an image into the input
    world_size, versions
    imported_from   only in a checkpoint scripts/import_weights.py made: the source's format and file name
    start_readings  a fine-tune's (train.init_from): its start's word accuracy on each data.val and data.retain
                    LMDB before the first step, by folder; {} in other runs
    readings        best.pt only: its word accuracy on each of those sets at its step
    provenance      what it was trained on (data/provenance.py's run record: each dataset's meta.json, and
                    a fine-tune's start checkpoint's own record); absent in older and imported checkpoints
    temperature     only in a calibrated checkpoint: what load_model divides the logits by (evaluation/calibration.py);
                    `model` keeps the raw weights
    calibration     beside it: what it was fitted on (sets, readings, metric mode, ECE before and after)
and in training checkpoints (ckpt-*.pt, last.pt) what an exact resume needs:
    optimizer, scheduler, scaler, best_accuracy, log_window, rng (one state per rank), data_sizes
    best_readings   best.pt's readings, for the run's closing report
    plan            train.max_minutes's plan (training/time_budget.py's Plan as a dict), or None
    raw_model, average_updates   with optim.ema_decay > 0: the weights the optimizer steps, and how
                    many steps the average has taken in
"""

from __future__ import annotations

import copy
import math
import pickle
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from data.alphabet import load_alphabet
from data.codec import CTCCodec, fold_case
from data.provenance import is_record
from data.transforms import Preprocessing, PreprocessingError, oversized
from models import model_from_config
from training.config import Config, ConfigError, config_changes, from_dict, to_dict
from utils.atomic_write import write_atomically
from utils.precision import PRECISIONS

FORMAT = 1
# What checkpoints written before the preprocessing record existed were fed: the constants of that time.
LEGACY = {"max_stretch": 1.0, "interpolation": "bilinear", "mean": [0.5], "std": [0.5], "padding": "replicate"}

WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DataParallel/DDP, torch.compile
SHOWN_CHARACTERS = 40  # a start-up line names at most this many characters: an alphabet may hold thousands


def strip_wrapper_prefixes(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Remove `module.` and `_orig_mod.` (in any nesting) from the keys of a state dict saved elsewhere."""
    stripped = {}
    for key, value in state_dict.items():
        while key.startswith(WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        stripped[key] = value
    return stripped


def save_checkpoint(path: str | Path, checkpoint: dict[str, Any]) -> None:
    """Write atomically (utils.atomic_write): `path` always holds either the previous complete checkpoint
    or the new one, whatever happens during the write. Weights that are not numbers are not written:
    load_checkpoint would refuse them, and best.pt or last.pt would no longer be a model."""
    check_savable(checkpoint, path)
    write_atomically(path, lambda file: torch.save(checkpoint, file))


def check_savable(checkpoint: dict[str, Any], path: str | Path) -> None:
    """The checkpoint's weights and optimizer state are numbers; else a CheckpointError naming the tensor."""
    parts = {"weight": checkpoint.get("model", {}), "raw_model weight": checkpoint.get("raw_model", {})}
    parts["optimizer state"] = optimizer_moments(checkpoint.get("optimizer", {}))
    for what, tensors in parts.items():
        problem = nonfinite_problem(tensors)
        if problem:
            raise CheckpointError(
                f"not saving {path}: {what} {problem}: the run diverged; the checkpoints already in its folder are"
                f" kept (resume from the last good one at a lower optim.lr, or start again)"
            )


def weights_checkpoint(
    model: nn.Module,
    config: Config,
    alphabet: str,
    preprocessing: Preprocessing,
    *,
    step: int,
    accuracy: float | None,
    world_size: int,
    precision: str = "fp32",
    provenance: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What best.pt holds: enough to evaluate, predict, export or start another run from. `precision`:
    what the run trained in (train.precision, with `auto` resolved); `provenance`: what it was trained on."""
    return {
        "format": FORMAT,
        "model": model.state_dict(),
        "step": step,
        "accuracy": accuracy,
        "config": to_dict(config),
        "alphabet": alphabet,
        "preprocessing": preprocessing.to_dict(),
        "world_size": world_size,
        "precision": precision,
        "versions": {"torch": str(torch.__version__), "python": sys.version.split()[0]},
        **({"provenance": provenance} if provenance is not None else {}),
    }


def check_config(checkpoint: dict[str, Any], path: str | Path, config: Config, option: str) -> list[str]:
    """The one comparison of a checkpoint's config with the run it is loaded into (`option`: train.resume,
    for the folder's own checkpoints too, or train.init_from). A key its weights are bound to (the
    architecture, its sizes, the input) is an error, and on resume a key its optimizer state is bound to
    (optim.name); every other change is this run's to make, and is returned as `key: old -> new` for the
    log. A checkpoint without a config (a bare state dict) has nothing to compare."""
    if not isinstance(checkpoint.get("config"), dict):
        return []
    changes = config_changes(checkpoint["config"], config)
    if changes.model:
        raise ConfigError(
            f"{option}={path}: its weights were trained for another model (checkpoint -> this run):\n  "
            + "\n  ".join(changes.model)
            + "\nset these keys as the checkpoint has them (its weights "
            f"fit no other values), or start without {option}"
        )
    if option == "train.resume" and changes.optimizer:
        raise ConfigError(
            f"{option}={path}: its optimizer state belongs to another optimizer (checkpoint -> this "
            f"run):\n  " + "\n  ".join(changes.optimizer) + "\nset it back to continue that run, or "
            f"start a new run from its weights with train.init_from={path}"
        )
    return sorted(changes.optimizer + changes.run + changes.resumable)


def is_training_checkpoint(checkpoint: dict[str, Any]) -> bool:
    return "optimizer" in checkpoint


def read_preprocessing(checkpoint: dict[str, Any], source: str) -> Preprocessing:
    """The checkpoint's own record; one written before records existed gets the constants of that time."""
    if "preprocessing" in checkpoint:
        problems = record_type_problems(checkpoint["preprocessing"]) or oversized(checkpoint["preprocessing"], str)
        if problems:
            raise PreprocessingError(f"{source}: its preprocessing record is not usable: {'; '.join(problems)}")
        return Preprocessing.from_dict(checkpoint["preprocessing"], source)
    # Its config's size, colour and keep_aspect, read as a run's config is read (Preprocessing.from_config).
    config_record = Preprocessing.from_config(from_dict(checkpoint["config"])).to_dict()
    return Preprocessing.from_dict({**config_record, **LEGACY}, source)


def record_type_problems(record: dict[str, Any]) -> list[str]:
    """Each field of a preprocessing record whose value is not of the type Preprocessing declares for it:
    the record's ranges are checked by Preprocessing itself, but a range check cannot compare text with
    a number, and a keep_aspect of 'no' would count as true."""
    problems = []
    for name, hint in typing.get_type_hints(Preprocessing).items():
        value = record.get(name)
        if name not in record:
            continue
        if hint is bool:
            fits, what = isinstance(value, bool), "true or false"
        elif hint is int:
            fits, what = is_integer(value), "an integer"
        elif hint is float:
            fits, what = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        elif hint is str:
            fits, what = isinstance(value, str), "text"
        else:  # tuple[float, ...]: mean and std, one value or one per channel
            fits = isinstance(value, (list, tuple)) and all(
                isinstance(item, (int, float)) and not isinstance(item, bool) for item in value
            )
            what = "a list of numbers"
        if not fits:
            problems.append(f"{name} is {describe_value(value)}, not {what}")
    return problems


def check_checkpoint_path(path: str | Path) -> Path:
    """`path` if it is a file; else an error that says so, and which checkpoint a run folder holds."""
    path = Path(path)
    if path.is_dir():
        inside = [path / name for name in ("best.pt", "last.pt") if (path / name).is_file()]
        raise FileNotFoundError(
            f"checkpoint {path} is a folder; give a .pt file" + (f", e.g. {inside[0]}" if inside else "")
        )
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint (or a bare state dict, returned as `{"model": ...}`) with prefixes stripped."""
    path = check_checkpoint_path(path)
    with path.open("rb") as file:
        header = file.read(4)
    # torch.save writes a zip archive (or, before PyTorch 1.6, a bare pickle): anything else would reach the
    # unpickler and be called unsafe, or worse, when it is only another kind of file (a data.mdb, an image).
    if not header.startswith((b"PK\x03\x04", b"\x80")):
        what = "an empty file" if not header else "neither a zip archive nor a pickle"
        raise ValueError(
            f"{path}: not a PyTorch checkpoint ({what}); give a .pt file written by train.py or " f"torch.save"
        )
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(
            f"{path}: refused to load: it holds objects other than tensors and plain values, and unpickling"
            f" them could run code. Re-save only its state dict. ({str(error).splitlines()[0]})"
        ) from None
    except Exception as error:  # torch.load raises many types on foreign or truncated files
        raise ValueError(f"{path}: not a PyTorch checkpoint, or a truncated one ({error})") from None
    if not isinstance(checkpoint, dict):
        raise ValueError(f"{path}: expected a dict, found {type(checkpoint).__name__}")
    if "model" not in checkpoint:
        if not checkpoint or not all(isinstance(value, torch.Tensor) for value in checkpoint.values()):
            raise ValueError(f"{path}: neither a checkpoint of this project (no 'model' key) nor a state dict")
        checkpoint = {"model": checkpoint}
    check_fields(checkpoint, path)
    for key in ("model", "raw_model"):
        if key in checkpoint:
            checkpoint[key] = strip_wrapper_prefixes(checkpoint[key])
            check_finite(checkpoint[key], "weight" if key == "model" else f"{key} weight", path)
    if "optimizer" in checkpoint:
        check_finite(optimizer_moments(checkpoint["optimizer"]), "optimizer state", path)
    return checkpoint


class CheckpointError(ValueError):
    """A checkpoint that reads, but whose contents are not what its fields say: one line naming the file and
    the field. A ValueError, so that a run folder's search for its newest checkpoint skips it with a warning."""


def is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int to Python, not a step


def is_readings(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(key, str) and is_number(v) for key, v in value.items())


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# What each recorded fact must be, checked once when a checkpoint is read: the code after it assumes them
# (a step in arithmetic, an alphabet as characters), so a file edited by hand, or a field written by
# another program, is named here, field by field, rather than deep in a traceback or not at all.
FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "format": (lambda value: is_integer(value) and value >= 0, "a format number (an integer)"),
    "step": (lambda value: is_integer(value) and value >= 0, "a count of steps (an integer, 0 or more)"),
    "world_size": (lambda value: is_integer(value) and value >= 1, "a number of processes (an integer, 1 or more)"),
    "average_updates": (lambda value: is_integer(value) and value >= 0, "a count of steps (an integer, 0 or more)"),
    "accuracy": (lambda value: value is None or is_number(value), "an accuracy (a number, or none)"),
    "best_accuracy": (lambda value: value is None or is_number(value), "an accuracy (a number, or none)"),
    "alphabet": (lambda value: value is None or isinstance(value, str), "the characters, as text"),
    "precision": (lambda value: value in PRECISIONS[1:], f"a precision ({', '.join(PRECISIONS[1:])})"),  # not auto
    "plan": (lambda value: value is None or isinstance(value, dict), "a plan (a mapping, or none)"),
    "rng": (lambda value: isinstance(value, list), "a list of random states"),
    "data_sizes": (lambda value: isinstance(value, list), "a list of sizes"),
    **{
        name: (lambda value: isinstance(value, dict), "a mapping")
        for name in ("config", "preprocessing", "versions", "imported_from", "optimizer", "scheduler", "scaler")
    },
    "log_window": (lambda value: isinstance(value, dict), "a mapping"),
    **{
        name: (is_readings, "word accuracies by LMDB folder (a mapping of text to numbers)")
        for name in ("start_readings", "readings", "best_readings")
    },
    "provenance": (is_record, "a provenance record (its datasets, and what training started from)"),
    "temperature": (lambda value: is_number(value) and value > 0, "a temperature (a positive number)"),
    "calibration": (lambda value: isinstance(value, dict), "a mapping"),
}


def check_fields(checkpoint: dict[str, Any], path: Path) -> None:
    """Each field of FIELDS that the checkpoint holds is what it must be, and its weights are a state dict."""
    for name in ("model", "raw_model"):
        weights = checkpoint.get(name, {})
        if not isinstance(weights, dict):
            found = describe_value(weights)
        else:
            found = next(
                (
                    f"its entry {key!r} is {describe_value(value)}"
                    for key, value in weights.items()
                    if not (isinstance(key, str) and isinstance(value, torch.Tensor))
                ),
                None,
            )
        if found:
            raise CheckpointError(
                f"{path}: its '{name}' is not a state dict (names to tensors): {found}; the file was edited or "
                f"written by another program; use a checkpoint train.py wrote"
            )
    for name, (fits, what) in FIELDS.items():
        if name in checkpoint and not fits(checkpoint[name]):
            raise CheckpointError(
                f"{path}: its '{name}' is {describe_value(checkpoint[name])}, not {what}: the file was edited or "
                f"written by another program; use a checkpoint train.py wrote"
            )
    if checkpoint.get("format", FORMAT) > FORMAT:
        raise CheckpointError(
            f"{path}: its 'format' is {checkpoint['format']}, and this version reads up to {FORMAT}: it was "
            f"written by a newer version of the project; read it with that version"
        )


def describe_value(value: Any) -> str:
    """A value as an error message shows it: short, with its type."""
    shown = repr(value)
    return f"{shown if len(shown) <= 40 else shown[:37] + '...'} ({type(value).__name__})"


def check_finite(tensors: dict[str, torch.Tensor], what: str, path: Path) -> None:
    """Every floating-point tensor of `tensors` holds numbers: one NaN or infinity in a weight would make every
    output NaN, which eval and predict would otherwise score as 0 % or read as empty text at confidence 0; in
    Adam's moments, every weight after the first step of a resume. Once, at load."""
    problem = nonfinite_problem(tensors)
    if problem:
        raise CheckpointError(f"{path}: {what} {problem}: the run that wrote it diverged; pick an earlier checkpoint")


def nonfinite_problem(tensors: dict[str, torch.Tensor]) -> str | None:
    """Which tensor holds NaN or infinity, and how many values (None: all are numbers): one reduction per
    tensor and a single transfer of the answers."""
    floating = [(key, tensor) for key, tensor in tensors.items() if tensor.is_floating_point() or tensor.is_complex()]
    if not floating:
        return None
    finite = torch.stack([torch.isfinite(tensor).all() for _, tensor in floating]).tolist()
    bad = [(key, tensor) for (key, tensor), ok in zip(floating, finite) if not ok]
    if not bad:
        return None
    key, tensor = bad[0]
    nan, infinite = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
    held = " and ".join(
        [f"NaN ({nan} value{'s' * (nan != 1)})"] * bool(nan)
        + [f"infinity ({infinite} value{'s' * (infinite != 1)})"] * bool(infinite)
    )
    others = f", as do {len(bad) - 1} other tensor(s)" if len(bad) > 1 else ""
    return f"'{key}' holds {held}{others}"


def optimizer_moments(optimizer: dict[str, Any]) -> dict[str, torch.Tensor]:
    """An optimizer state dict's per-parameter tensors (Adam's moments, SGD's momentum), named `index.name`."""
    state = optimizer.get("state", {})
    if not isinstance(state, dict):
        return {}
    return {
        f"{index}.{name}": value
        for index, values in state.items()
        if isinstance(values, dict)
        for name, value in values.items()
        if isinstance(value, torch.Tensor)
    }


def load_model(
    path: str | Path, device: str | torch.device = "cpu", config: Config | None = None, calibrated: bool = True
) -> tuple[nn.Module, CTCCodec, Config, Preprocessing]:
    """A model ready for inference on `device`, its codec, config and preprocessing, from one file.

    The architecture, alphabet and preprocessing come from the checkpoint; a bare state dict needs
    `config`, whose data section then describes the preprocessing. A calibrated checkpoint's temperature
    is folded into the classifier (fold_temperature), so that eval, predict and the exports read calibrated
    confidences; `calibrated=False` gives the raw weights (scripts/calibrate.py fits on them).
    """
    checkpoint = load_checkpoint(path, map_location=device)
    if "config" in checkpoint:
        try:
            config = from_dict(checkpoint["config"])
        except ConfigError as error:
            raise CheckpointError(f"{path}: its config is not usable: {error}") from None
        preprocessing = read_preprocessing(checkpoint, str(path))
    elif config is None:
        raise ConfigError(f"{path} is a bare state dict: pass --config with the model and alphabet it was trained with")
    else:
        preprocessing = Preprocessing.from_config(config)
    recorded = checkpoint.get("alphabet")
    alphabet = recorded or load_alphabet(config.data.alphabet)
    try:
        codec = CTCCodec(alphabet, config.data.fold_case)
    except ValueError as error:
        if not recorded:
            raise
        raise CheckpointError(f"{path}: its alphabet is not usable: {error}") from None
    model = model_from_config(config.model, codec.num_classes)
    if recorded:
        check_alphabet_fits(model.state_dict(), checkpoint["model"], codec.num_classes, path)
    try:
        model.load_state_dict(checkpoint["model"], strict=True)
    except RuntimeError as error:
        raise ValueError(
            f"{path}: its weights do not fit a {config.model.arch} model for {codec.num_classes - 1} characters"
            f" (another alphabet or architecture?):\n{error}"
        ) from None
    if calibrated and "temperature" in checkpoint:
        fold_temperature(model, checkpoint["temperature"], codec.num_classes, preprocessing, path)
    return model.to(device).eval(), codec, config, preprocessing


def read_calibration(path: str | Path) -> dict[str, Any] | None:
    """A calibrated checkpoint's temperature and what it was fitted on, as one mapping; None if it has none."""
    checkpoint = load_checkpoint(path)
    if "temperature" not in checkpoint:
        return None
    return {**checkpoint.get("calibration", {}), "temperature": checkpoint["temperature"]}


@torch.no_grad()
def fold_temperature(
    model: nn.Module, temperature: float, num_classes: int, preprocessing: Preprocessing, path: str | Path
) -> None:
    """Divide `model`'s logits by `temperature` by dividing its classifier: every architecture's output is
    the sum of linear layers onto the classes (the CRNN's BiLSTM projection and its cnn_shortcut, DTRB's
    prediction layer), and (W x + b) / T = (W / T) x + b / T. Checked on one input: a model whose output is
    not such a sum (another layer after the classifier, or a hidden layer as wide as the classes) is refused
    rather than miscalibrated."""
    keys = classifier_keys(model.state_dict(), num_classes)
    modules = sorted({key.rpartition(".")[0] for key in keys})
    model.eval()
    images = torch.rand(
        1, preprocessing.channels, preprocessing.height, preprocessing.width, generator=torch.Generator().manual_seed(0)
    )
    expected = model(images) / temperature  # [1, T, C]
    if keys and all(isinstance(model.get_submodule(name), nn.Linear) for name in modules):
        for name in modules:
            layer = model.get_submodule(name)
            layer.weight.div_(temperature)
            if layer.bias is not None:
                layer.bias.div_(temperature)
        if not torch.isfinite(expected).all():  # weights that overflow: evaluation and predict name them
            return
        if torch.allclose(model(images), expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max())):
            return
    raise CheckpointError(
        f"{path}: a temperature cannot be applied to this model: its output is not the sum of linear layers onto "
        f"the classes ({', '.join(modules) or 'none found'}); use its confidence uncalibrated (a calibrated file: "
        f"remove its 'temperature')"
    )


def check_foldable(model: nn.Module, num_classes: int, preprocessing: Preprocessing, path: str | Path) -> None:
    """fold_temperature's refusal, if it would refuse, before a temperature is fitted and written: a checkpoint
    written with one would no longer load."""
    fold_temperature(copy.deepcopy(model).cpu(), 2.0, num_classes, preprocessing, path)


def with_calibration(checkpoint: dict[str, Any], temperature: float, record: dict[str, Any]) -> dict[str, Any]:
    """`checkpoint` with a temperature and its record (fitted on what, ECE before and after); its weights stay
    raw, so a refit starts from them and never stacks temperatures."""
    return {**checkpoint, "temperature": float(temperature), "calibration": record}


def check_alphabet_fits(
    expected: dict[str, torch.Tensor], weights: dict[str, torch.Tensor], num_classes: int, path: str | Path
) -> None:
    """The alphabet a checkpoint records is the one its classifier was trained on: one row per character,
    and the blank's. Another would read every class as another character, or not load."""
    for key in classifier_keys(expected, num_classes):
        rows = weights.get(key)
        fits_but_the_rows = rows is not None and rows.ndim and rows.shape[1:] == expected[key].shape[1:]
        if fits_but_the_rows and rows.shape[0] != num_classes:
            raise CheckpointError(
                f"{path}: its alphabet has {num_classes - 1} characters, but its classifier ({key}) has "
                f"{rows.shape[0]} rows, for the blank and {rows.shape[0] - 1} characters: its weights were trained for "
                f"another alphabet or architecture than it records; use the checkpoint as train.py wrote it, or "
                f"import the weights with scripts/import_weights.py --alphabet, giving their characters in class order"
            )


def classifier_keys(state_dict: dict[str, torch.Tensor], num_classes: int) -> list[str]:
    """The output layers' tensors, those with one row per class (blank first): the last module of the
    state dict whose tensors have `num_classes` rows, and every linear layer onto the classes (a 2-D
    `weight` and a `bias`, both of `num_classes` rows), such as the CRNN's `cnn_shortcut` beside its
    BiLSTM's projection. [] if there is none. Only the last module is taken whatever its kind: a BatchNorm
    or an LSTM whose width happens to equal `num_classes` is not a linear layer, and not taken."""
    rows = [key for key, value in state_dict.items() if value.ndim and value.shape[0] == num_classes]
    if not rows:
        return []
    tensors_of: dict[str, dict[str, torch.Tensor]] = {}  # module -> its own tensors by name, not its children's
    for key, value in state_dict.items():
        module, _, name = key.rpartition(".")
        tensors_of.setdefault(module, {})[name] = value

    def onto_the_classes(tensors: dict[str, torch.Tensor]) -> bool:
        return (
            tensors.keys() == {"weight", "bias"}
            and tensors["weight"].ndim == 2
            and tensors["weight"].shape[0] == tensors["bias"].shape[0] == num_classes
        )

    last = rows[-1].rpartition(".")[0]
    return [key for key in rows if (module := key.rpartition(".")[0]) == last or onto_the_classes(tensors_of[module])]


def load_initial_weights(model: nn.Module, path: str | Path, alphabet: str, config: Config | None = None) -> str:
    """Copy the tensors of `path` into `model`; report what happened and which keys of `config` (this
    run's) differ from the checkpoint's, after check_config has refused those its weights depend on.

    Used by `train.init_from`, with `alphabet` the run's (training/alphabet_policy.py's run_alphabet). The
    classifier's rows are matched by character whenever the checkpoint's alphabet differs from `alphabet` (in
    order or in content): a shared character's row is copied to its new place, the blank's stays first, and
    the rows of new characters keep their fresh initialisation; the report names the characters kept, added
    and dropped. A checkpoint that records no alphabet cannot be matched, so its
    classifier is not used. Every tensor outside the classifier must load: a backbone that does not fit
    would train from scratch under a name that says otherwise, so it is an error.
    """
    checkpoint = load_checkpoint(path)
    changes = check_config(checkpoint, path, config, "train.init_from") if config is not None else []
    source, target = checkpoint["model"], model.state_dict()
    classifier = classifier_keys(target, len(alphabet) + 1)
    loaded = {
        key: value
        for key, value in source.items()
        if key in target and target[key].shape == value.shape and key not in classifier
    }
    notes = []
    if classifier:
        rows, note = classifier_rows_by_character(source, target, classifier, checkpoint.get("alphabet"), alphabet)
        loaded.update(rows)
        notes.append(note)
        if rows:
            notes.append(alphabet_change(checkpoint["alphabet"], alphabet, config))
    check_backbone_fits(target, loaded, classifier, path)
    unexpected = sorted(key for key in source if key not in target)
    model.load_state_dict(loaded, strict=False)
    if unexpected:
        notes.append(f"  in the checkpoint but not in the model (ignored): {', '.join(unexpected)}")
    if changes:
        notes.append(f"  this run's config, not the checkpoint's: {'; '.join(changes)}")
    return "\n".join([f"init_from {path}: loaded {len(loaded)} of {len(target)} tensors", *notes])


def classifier_rows_by_character(
    source: dict[str, torch.Tensor],
    target: dict[str, torch.Tensor],
    classifier: list[str],
    old_alphabet: str | None,
    alphabet: str,
) -> tuple[dict[str, torch.Tensor], str]:
    """The classifier's tensors for `alphabet`, with each row of a character the checkpoint's
    `old_alphabet` shares copied to its new place (the blank's stays first), and the report's line on
    them. Nothing to load when the rows cannot be matched: the classifier then keeps its fresh start."""
    if not old_alphabet:
        return {}, (
            f"  {', '.join(classifier)}: fresh; the checkpoint records no alphabet, so its classifier rows "
            f"cannot be matched to data.alphabet's characters (a state dict from elsewhere: convert it with "
            f"scripts/import_weights.py, which records its characters)"
        )
    if not all(
        key in source and source[key].shape == (len(old_alphabet) + 1, *target[key].shape[1:]) for key in classifier
    ):
        return {}, (
            f"  {', '.join(classifier)}: fresh; the checkpoint's classifier does not fit its own "
            f"alphabet of {len(old_alphabet)} characters"
        )
    old_rows = {char: row for row, char in enumerate(old_alphabet, start=1)}
    mapping = [(0, 0)] + [(row, old_rows[char]) for row, char in enumerate(alphabet, start=1) if char in old_rows]
    mapped = {}
    for key in classifier:
        mapped[key] = target[key].clone()
        for new, old in mapping:
            mapped[key][new] = source[key][old]
    moved = sum(new != old for new, old in mapping)
    return mapped, (
        f"  classifier ({', '.join(classifier)}): rows matched by character: "
        f"{len(mapping) - moved} copied in place (the blank included), {moved} moved, "
        f"{len(alphabet) + 1 - len(mapping)} new characters initialised fresh"
    )


def check_backbone_fits(
    target: dict[str, torch.Tensor], loaded: dict[str, torch.Tensor], classifier: list[str], path: str | Path
) -> None:
    """Every tensor outside the classifier must load: a backbone that does not fit would train from
    scratch under a name that says otherwise."""
    fresh = sorted(
        key for key in target if key not in loaded and key not in classifier and not key.endswith("num_batches_tracked")
    )  # a counter BatchNorm keeps, not a weight
    if fresh:
        raise ConfigError(
            f"train.init_from={path}: {len(fresh)} of the model's {len(target) - len(classifier)} tensors outside "
            f"the classifier are missing from it or of another shape ({', '.join(fresh[:4])}"
            f"{', ...' if len(fresh) > 4 else ''}): it was made for another architecture; set model.* as it was "
            f"trained, or start without train.init_from"
        )


def alphabet_change(known: str, alphabet: str, config: Config | None) -> str:
    """The start-up line on the checkpoint's characters (`known`) in this run's `alphabet`: how many it kept,
    and which it added and dropped (train.init_alphabet, training/alphabet_policy.py, decided which)."""
    kept = [char for char in alphabet if char in known]
    added = [char for char in alphabet if char not in known]
    dropped = [char for char in known if char not in alphabet]
    policy, why = "", ""
    if config is not None:
        policy = f" (train.init_alphabet={config.train.init_alphabet})"
        if dropped and config.data.fold_case and all(fold_case(char) != char for char in dropped):
            why = " (data.fold_case=true: no lowercased label holds them)"
    return (
        f"  characters{policy}: kept {len(kept)} of the checkpoint's {len(known)}; added {len(added)}"
        f"{f': {shown(added)}' if added else ''}; dropped {len(dropped)}{f': {shown(dropped)}' if dropped else ''}"
        f"{why}"
    )


def shown(characters: list[str]) -> str:
    """`characters` as a line names them: as one quoted string, cut after SHOWN_CHARACTERS."""
    more = len(characters) - SHOWN_CHARACTERS
    return repr("".join(characters[:SHOWN_CHARACTERS])) + (f" and {more} more" if more > 0 else "")
