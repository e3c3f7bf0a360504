"""A run folder: its numbered checkpoints, the newest valid one, and the rule that runs never mix.

runs/crnn/config.yaml             the run's configuration
runs/crnn/data_provenance.json    what it trains on: each dataset's meta.json (data/provenance.py)
runs/crnn/ckpt-0000250.pt ...     full training state every train.save_every steps; newest K kept
runs/crnn/last.pt                 the newest of them (a hard link: no second write)
runs/crnn/best.pt                 the best validation accuracy so far
runs/crnn/metrics.jsonl           the log
runs/crnn/.lock                   while a run lives: locked (flock) by its rank 0, holding its PID and host
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

import yaml

from training.checkpoint import is_training_checkpoint, load_checkpoint
from training.config import Config, ConfigError, config_changes, to_dict
from training.config_yaml import safe_load_config
from utils.atomic_write import make_folder, remove_empty_folders, remove_leftovers, write_text_atomically
from utils.run_files import LinkInRunFolder, open_no_follow, refuse_links

CHECKPOINT_PATTERN = re.compile(r"ckpt-(\d+)\.pt")
CHECKPOINT_FILES = ("last.pt", "best.pt")
LOCK_FILE = ".lock"
PROVENANCE_FILE = "data_provenance.json"
RUN_FILES = ("config.yaml", PROVENANCE_FILE, *CHECKPOINT_FILES, "metrics.jsonl", "tensorboard")
TENSORBOARD_EVENTS = "events.out.tfevents.*"  # what SummaryWriter writes into tensorboard/


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / f"ckpt-{step:07d}.pt"


def numbered_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every numbered checkpoint in `out_dir`, newest first."""
    folder = Path(out_dir)
    found = (
        [
            (int(match.group(1)), path)
            for path in folder.glob("ckpt-*.pt")
            if (match := CHECKPOINT_PATTERN.fullmatch(path.name))
        ]
        if folder.is_dir()
        else []
    )
    return sorted(found, reverse=True)


def find_latest_checkpoint(out_dir: str | Path, warn: Callable[[str], None]) -> tuple[Path, dict[str, Any]] | None:
    """The newest numbered checkpoint that loads, with its contents; unreadable ones are skipped with a
    warning. Without one, last.pt: the numbered files may have been deleted to save space, and starting
    afresh would then overwrite the run's last state."""
    candidates: list[tuple[int | None, Path]] = [*numbered_checkpoints(out_dir), (None, Path(out_dir) / "last.pt")]
    for step, path in candidates:
        if step is None and not path.is_file():
            continue
        try:
            checkpoint = load_checkpoint(path)
        except ValueError as error:
            warn(f"warning: skipping {path}: {error}")
            continue
        if step not in (None, checkpoint.get("step")) or not is_training_checkpoint(checkpoint):
            of_step = f" of step {step}" if step is not None else ""
            warn(f"warning: skipping {path}: not a training checkpoint{of_step}")
            continue
        return path, checkpoint
    return None


def best_in_folder(out_dir: str | Path, val: list[str], warn: Callable[[str], None]) -> float | None:
    """The accuracy of the folder's best.pt, if it was measured on `val` (data.val): the score a run in
    this folder must beat to replace it, whatever checkpoint the run started from."""
    path = Path(out_dir) / "best.pt"
    if not path.is_file():
        return None
    try:
        best = load_checkpoint(path)
    except ValueError as error:
        warn(f"warning: {path} is not readable ({error}); the next validation replaces it")
        return None
    measured_on = best.get("config", {}).get("data", {}).get("val")
    accuracy = best.get("accuracy")
    return accuracy if measured_on == val and isinstance(accuracy, float) else None


def prune_checkpoints(out_dir: str | Path, keep: int) -> None:
    for _, path in numbered_checkpoints(out_dir)[keep:]:
        path.unlink(missing_ok=True)


def point_last_at(checkpoint: Path) -> None:
    """Make `last.pt` the same file as `checkpoint`, replacing the old one atomically."""
    last = checkpoint.parent / "last.pt"
    temporary = checkpoint.parent / f".last.pt.{os.getpid()}.tmp"  # the leftover name remove_leftovers knows
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


def check_run_folder(config: Config) -> None:
    """Refuse to start a run that would overwrite or mix with another run's checkpoints.

    Reads files only, so every rank calls it before any process group exists and stops with the
    same message.
    """
    out_dir = Path(config.train.out_dir)
    resume = config.train.resume
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"train.out_dir={out_dir} is a file; give a folder (it is created if missing)")
    refuse_links_in(out_dir)
    if config.train.overwrite or not holds_a_run(out_dir):
        return
    if resume == "none":
        raise ConfigError(
            f"train.out_dir={out_dir} holds another run; continue it (train.resume=auto), pick a new "
            f"train.out_dir, or set train.overwrite=true to delete its checkpoints and log"
        )
    saved = out_dir / "config.yaml"
    try:
        previous = safe_load_config(saved.read_text(encoding="utf-8"), str(saved)) if saved.is_file() else None
    except (yaml.YAMLError, UnicodeDecodeError):
        previous = None
    if not isinstance(previous, dict):
        raise ConfigError(
            f"train.out_dir={out_dir} holds checkpoints but no readable config.yaml; pick a new "
            f"train.out_dir or set train.overwrite=true"
        )
    differences = config_changes(previous, config).defining
    if differences:
        raise ConfigError(
            f"train.out_dir={out_dir} holds a run with another configuration:\n  "
            + "\n  ".join(differences)
            + "\npick a new train.out_dir, change these back to continue that run, "
            "or set train.overwrite=true to delete its checkpoints and log"
        )


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
        raise ConfigError(
            f"train.out_dir={folder}: cannot write there ({error.strerror or error}); " f"pick another folder"
        ) from None


def write_config(out_dir: str | Path, config: Config) -> None:
    """The run's config.yaml, replaced atomically: a crash never leaves half of it."""
    write_text_atomically(
        Path(out_dir) / "config.yaml", yaml.dump(to_dict(config), Dumper=DumperWithoutAliases, sort_keys=False)
    )


def write_provenance(out_dir: str | Path, record: dict[str, Any]) -> None:
    """The run's data_provenance.json: what it trains on (data/provenance.py's run record), as its
    checkpoints hold it, readable without loading one."""
    write_text_atomically(Path(out_dir) / PROVENANCE_FILE, json.dumps(record, indent=2, ensure_ascii=False) + "\n")


class DumperWithoutAliases(yaml.SafeDumper):
    """yaml.safe_dump, writing a value used twice out twice: the config.yaml is read back without aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def run_folder_files(out_dir: str | Path) -> list[Path]:
    """Every name in `out_dir` a run of this project writes, opens or deletes (whether there or not)."""
    folder = Path(out_dir)
    board = folder / "tensorboard"
    events = sorted(board.glob(TENSORBOARD_EVENTS)) if board.is_dir() and not board.is_symlink() else []
    numbered = [path for _, path in numbered_checkpoints(folder)]
    return [*(folder / name for name in (*RUN_FILES, LOCK_FILE)), *numbered, *events]


def refuse_links_in(out_dir: str | Path) -> None:
    """Refuse a run folder where a file the run writes is a symbolic link: it would be followed (appended to,
    locked and truncated) or replaced. Reads names only: every rank calls it at start-up, alike."""
    if Path(out_dir).is_dir():
        try:
            refuse_links(run_folder_files(out_dir))
        except LinkInRunFolder as error:
            raise ConfigError(str(error)) from None


def clear_run_folder(out_dir: str | Path, say: Callable[[str], None] = print) -> list[Path]:
    """Delete what an earlier run wrote (train.overwrite=true): its checkpoints, config.yaml,
    data_provenance.json, metrics.jsonl and TensorBoard event files, never a file of another name (a user's
    notes, another tool's logs in tensorboard/), which is kept and named through `say`. Returns what was kept."""
    folder = Path(out_dir)
    refuse_links_in(folder)
    for _, path in numbered_checkpoints(folder):
        path.unlink()
    for name in RUN_FILES:
        path = folder / name
        if name == "tensorboard":
            if path.is_dir():
                for events in path.glob(TENSORBOARD_EVENTS):
                    if events.is_file():
                        events.unlink()
                if not any(path.iterdir()):
                    path.rmdir()
        elif path.is_file():
            path.unlink()
    ours = {folder / name for name in (*RUN_FILES, LOCK_FILE)}
    kept = sorted(
        [path for path in folder.iterdir() if path not in ours]
        + ([path for path in (folder / "tensorboard").iterdir()] if (folder / "tensorboard").is_dir() else [])
    )
    if kept:
        say(
            f"train.overwrite=true: deleted the earlier run's checkpoints, config.yaml, data_provenance.json, "
            f"metrics.jsonl and TensorBoard events in {folder}; kept what this project did not write: "
            + ", ".join(str(path.relative_to(folder)) for path in kept)
        )
    return kept


@dataclass(kw_only=True)
class RunFolderLock:
    """The locked `.lock` file of a live run, and the folders its start created (deepest first)."""

    file: IO[str]
    created: list[Path]


def lock_run_folder(out_dir: str | Path) -> tuple[RunFolderLock, list[Path]]:
    """Take the run folder for this process, or refuse: two runs writing into one folder would mix their
    checkpoints and logs. The lock is the kernel's (flock on out_dir/.lock), so it dies with its process
    and a crashed run never blocks the next one. Holding it, this process removes the temporary files a
    killed run left. Returns the lock (give it to unlock_run_folder at the end) and what was removed.
    The folder is created for the lock; unlock_run_folder removes it again if the run wrote nothing."""
    created = make_folder(out_dir)
    path = Path(out_dir) / LOCK_FILE
    while True:
        try:
            lock = open_no_follow(path, "a+")
        except LinkInRunFolder as error:  # made after check_run_folder looked: refused on every rank alike
            raise ConfigError(str(error)) from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "a process that has not written its PID yet"
            lock.close()
            raise ConfigError(
                f"train.out_dir={out_dir} is in use by another run ({holder}); wait for it to end, "
                f"stop it, or pick another train.out_dir"
            ) from None
        # A run that ended between our open and our lock removed the file we hold: lock the current one.
        if path.exists() and os.path.samestat(os.fstat(lock.fileno()), path.stat()):
            break
        lock.close()
    lock.seek(0)
    lock.truncate()
    lock.write(f"PID {os.getpid()} on host {socket.gethostname()}\n")
    lock.flush()
    return RunFolderLock(file=lock, created=created), remove_leftovers(out_dir)


def unlock_run_folder(lock: RunFolderLock) -> None:
    """Remove the lock file, then release the lock: a run that ends leaves nothing behind. (A killed one
    leaves its .lock, which blocks nothing: the kernel released the lock.) Folders the start created and
    nothing was written into are removed: a start that fails leaves no folder behind."""
    Path(lock.file.name).unlink(missing_ok=True)
    lock.file.close()
    remove_empty_folders(lock.created)
