"""A run folder: its numbered checkpoints, the newest valid one, and the rule that runs never mix.

    runs/crnn/config.yaml             the run's configuration
    runs/crnn/ckpt-0000250.pt ...     full training state every train.save_every steps; newest K kept
    runs/crnn/last.pt                 the newest of them (a hard link: no second write)
    runs/crnn/best.pt                 the best validation accuracy so far
    runs/crnn/metrics.jsonl           the log
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import yaml

from training.checkpoint import is_training_checkpoint, load_checkpoint
from utils.atomic_write import write_text_atomically
from utils.config import Config, ConfigError, resumable_keys, to_dict

CHECKPOINT_PATTERN = re.compile(r"ckpt-(\d+)\.pt")
CHECKPOINT_FILES = ("last.pt", "best.pt")
RUN_FILES = ("config.yaml", *CHECKPOINT_FILES, "metrics.jsonl", "tensorboard")


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / f"ckpt-{step:07d}.pt"


def numbered_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every numbered checkpoint in `out_dir`, newest first."""
    folder = Path(out_dir)
    found = [(int(match.group(1)), path) for path in folder.glob("ckpt-*.pt")
             if (match := CHECKPOINT_PATTERN.fullmatch(path.name))] if folder.is_dir() else []
    return sorted(found, reverse=True)


def find_latest_checkpoint(out_dir: str | Path, warn: Callable[[str], None]) -> tuple[Path, dict[str, Any]] | None:
    """The newest numbered checkpoint that loads, with its contents; unreadable ones are skipped with a warning."""
    for step, path in numbered_checkpoints(out_dir):
        try:
            checkpoint = load_checkpoint(path)
        except ValueError as error:
            warn(f"warning: skipping {path}: {error}")
            continue
        if checkpoint.get("step") != step or not is_training_checkpoint(checkpoint):
            warn(f"warning: skipping {path}: not a training checkpoint of step {step}")
            continue
        return path, checkpoint
    return None


def prune_checkpoints(out_dir: str | Path, keep: int) -> None:
    for _, path in numbered_checkpoints(out_dir)[keep:]:
        path.unlink(missing_ok=True)


def point_last_at(checkpoint: Path) -> None:
    """Make `last.pt` the same file as `checkpoint`, replacing the old one atomically."""
    last = checkpoint.parent / "last.pt"
    temporary = checkpoint.parent / ".last.pt.link"
    temporary.unlink(missing_ok=True)
    try:
        os.link(checkpoint, temporary)
    except OSError:  # a file system without hard links: copy
        shutil.copyfile(checkpoint, temporary)
    os.replace(temporary, last)


def holds_a_run(out_dir: str | Path) -> bool:
    """Whether `out_dir` holds a checkpoint. A config.yaml or a log without one is what a start that
    failed (a typo in a path, a bad value) left: it binds the folder to nothing, and the next run
    replaces it."""
    folder = Path(out_dir)
    return any((folder / name).exists() for name in CHECKPOINT_FILES) or bool(numbered_checkpoints(folder))


def config_differences(previous: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """`key: old -> new` for every key that defines the run (see utils.config.resumable) whose value differs."""
    differences = []
    resumable = resumable_keys()
    for key in sorted(set(previous) | set(current)):
        full_key = f"{prefix}{key}"
        old, new = previous.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            differences += config_differences(old, new, prefix=f"{full_key}.")
        elif old != new and full_key not in resumable:
            differences.append(f"{full_key}: {old!r} -> {new!r}")
    return differences


def with_defaults(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """`values`, plus every key of `defaults` it lacks (in nested sections too)."""
    merged = dict(values)
    for key, default in defaults.items():
        if key not in merged:
            merged[key] = default
        elif isinstance(default, dict) and isinstance(merged[key], dict):
            merged[key] = with_defaults(merged[key], default)
    return merged


def check_run_folder(config: Config) -> None:
    """Refuse to start a run that would overwrite or mix with another run's checkpoints.

    Reads files only, so every rank calls it before any process group exists and stops with the
    same message.
    """
    out_dir = Path(config.train.out_dir)
    resume = config.train.resume
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"train.out_dir={out_dir} is a file; give a folder (it is created if missing)")
    if config.train.overwrite or not holds_a_run(out_dir):
        return
    if resume == "none":
        raise ConfigError(
            f"train.out_dir={out_dir} holds another run; continue it (train.resume=auto), pick a new "
            f"train.out_dir, or set train.overwrite=true to delete its checkpoints and log")
    saved = out_dir / "config.yaml"
    try:
        previous = yaml.safe_load(saved.read_text(encoding="utf-8")) if saved.is_file() else None
    except (yaml.YAMLError, UnicodeDecodeError):
        previous = None
    if not isinstance(previous, dict):
        raise ConfigError(f"train.out_dir={out_dir} holds checkpoints but no readable config.yaml; pick a new "
                          f"train.out_dir or set train.overwrite=true")
    # A key the saved config lacks was added to the project after that run started: it ran with the default.
    differences = config_differences(with_defaults(previous, to_dict(Config())), to_dict(config))
    if differences:
        raise ConfigError(
            f"train.out_dir={out_dir} holds a run with another configuration:\n  " + "\n  ".join(differences)
            + "\npick a new train.out_dir, change these back to continue that run, "
            "or set train.overwrite=true to delete its checkpoints and log")


def prepare_run_folder(out_dir: str | Path) -> None:
    """Make sure `out_dir` can be created and written, before any work is done: a folder on a read-only
    disk, or without permission, is then a one-line error at start-up, not after an hour. Creates nothing
    (the probe goes into the nearest folder that exists): a start that fails leaves no folder behind, and
    train.py creates it when the run starts writing."""
    folder = Path(out_dir)
    nearest = next(parent for parent in (folder, *folder.parents) if parent.exists() or parent == Path("."))
    try:
        handle, probe = tempfile.mkstemp(prefix=".write-test.", dir=nearest)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise ConfigError(f"train.out_dir={folder}: cannot write there ({error.strerror or error}); "
                          f"pick another folder") from None


def write_config(out_dir: str | Path, config: Config) -> None:
    """The run's config.yaml, replaced atomically: a crash never leaves half of it."""
    write_text_atomically(Path(out_dir) / "config.yaml", yaml.safe_dump(to_dict(config), sort_keys=False))


def clear_run_folder(out_dir: str | Path) -> None:
    """Delete what an earlier run wrote (train.overwrite=true): its checkpoints, config and log only."""
    folder = Path(out_dir)
    for _, path in numbered_checkpoints(folder):
        path.unlink()
    for name in RUN_FILES:
        path = folder / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
