"""Which characters a run reads, in class order, decided in one place (run_alphabet): data.alphabet's, or,
for a fine-tune under train.init_alphabet=union, its checkpoint's followed by the characters of data.alphabet
it lacks. What the fine-tune kept, added and dropped of its checkpoint's characters is said where its weights
are loaded (training/checkpoint.py's load_initial_weights).

A union run's checkpoints record its alphabet, as every checkpoint does: a resume reads it there, not from the
train.init_from file (which may be gone), and best.pt carries it to evaluation, prediction and export.
"""

from __future__ import annotations

from typing import Any

from data.alphabet import load_alphabet
from data.codec import fold_case
from training.checkpoint import load_checkpoint, shown
from training.config import Config, ConfigError


def run_alphabet(config: Config, resumed: tuple[str, dict[str, Any]] | None = None) -> str:
    """The alphabet this run trains, in class order. `resumed`: the training checkpoint the run continues
    (its path, what it holds); a union run takes the alphabet it recorded, which must hold data.alphabet's.
    A union run's start reads train.init_from's recorded alphabet."""
    wanted = load_alphabet(config.data.alphabet)
    if config.train.init_alphabet == "new":
        return wanted
    if resumed is not None:
        path, checkpoint = resumed
        recorded = checkpoint.get("alphabet") or ""
        missing = [char for char in wanted if char not in recorded]
        if missing:
            raise ConfigError(
                f"train.init_alphabet=union: {path} reads {len(recorded)} characters, and data.alphabet has "
                f"{len(missing)} it lacks ({shown(missing)}): remove them from data.alphabet to continue this run, "
                f"or start a new run from its weights with train.init_from={path}"
            )
        return recorded
    start = config.train.init_from
    if not start:
        raise ConfigError(
            "train.init_alphabet=union extends the alphabet of train.init_from's checkpoint, and train.init_from "
            "is empty: set it, or set train.init_alphabet=new"
        )
    known = load_checkpoint(start).get("alphabet")
    if not known:
        raise ConfigError(
            f"train.init_alphabet=union: train.init_from={start} records no alphabet to extend: convert it with "
            f"scripts/import_weights.py --alphabet (a state dict from elsewhere), or set train.init_alphabet=new"
        )
    return union_alphabet(known, wanted, config.data.fold_case)


def union_alphabet(known: str, wanted: str, folds_case: bool) -> str:
    """`known` in its order, so that each of its rows keeps its class, then the characters of `wanted` it
    lacks, in `wanted`'s order. Under data.fold_case a label is lowercased before it is read, so a capital
    letter of `known` is a class no target holds: it is left out, as data.alphabet may not list it either
    (and the rows after it move up by one; load_initial_weights moves rows by character)."""
    readable = "".join(char for char in known if not folds_case or fold_case(char) == char)
    return readable + "".join(char for char in wanted if char not in readable)
