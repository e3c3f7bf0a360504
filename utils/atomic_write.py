"""Files replaced whole: written beside their place, then renamed over it, so a crash, a full disk or a
stop signal never leaves half a file where a good one was. One writer for every such file (checkpoints,
config.yaml, logs, exports), so the temporary names, the permissions and the leftovers of a killed
process are handled in one place."""

from __future__ import annotations

import errno
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

# `.NAME.RANDOM.tmp`: what write_atomically leaves behind when its process is killed mid-write.
TEMPORARY_NAME = re.compile(r"\..+\.[A-Za-z0-9_]+\.tmp")


def current_umask() -> int:
    """The process's umask, read without changing it (os.umask sets it, and another thread could create a
    file in between); the /proc read needs Linux 4.7, elsewhere the set-and-restore is the only way."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def write_atomically(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Call `write(file)` on a temporary file in `path`'s folder, then rename it over `path`.

    The rename is atomic, so `path` always holds either the previous complete file or the new one,
    whatever happens during the write; a failure to write is an OSError naming `path`. The file gets
    the permissions the umask gives a new file (0644 under umask 022), as `open()` would, not mkstemp's
    0600: a colleague may read the model.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as error:  # named by `path`, not by the temporary name it could not create
        raise OSError(error.errno, error.strerror, str(path)) from error
    try:
        with os.fdopen(handle, "wb") as file:
            os.fchmod(file.fileno(), 0o666 & ~current_umask())
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError):  # named by `path`: the temporary file's name means nothing to the user
            raise OSError(error.errno, error.strerror, str(path)) from error
        raise


def check_writable(path: str | Path, name: str | None = None) -> None:
    """Raise now the OSError that writing `path` later would raise, naming `name` (default `path`, e.g. the
    option too: `--json out.json`): a command finds an output it cannot write before its work, not after.
    Probes the nearest folder that exists (the writer creates the missing ones) with a temporary file, and
    leaves nothing behind."""
    path = Path(path)
    name = name or str(path)
    folder = next(parent for parent in path.absolute().parents if parent.exists())
    if not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), name)
    try:
        handle, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as error:
        raise OSError(error.errno, error.strerror, name) from error
    os.close(handle)
    os.unlink(probe)


def write_bytes_atomically(path: str | Path, data: bytes) -> None:
    write_atomically(path, lambda file: file.write(data))


def write_text_atomically(path: str | Path, text: str) -> None:
    write_bytes_atomically(path, text.encode("utf-8"))


def remove_leftovers(folder: str | Path) -> list[Path]:
    """Delete the temporary files a killed writer left in `folder`; the caller must know that no live
    process writes there (train.py holds the run folder's lock). Returns what was deleted."""
    folder = Path(folder)
    leftovers = [
        path
        for path in folder.glob(".*.tmp")  # a link is nobody's leftover: write_atomically never makes one
        if TEMPORARY_NAME.fullmatch(path.name) and path.is_file() and not path.is_symlink()
    ]
    for path in leftovers:
        path.unlink(missing_ok=True)
    return leftovers


def make_folder(folder: str | Path) -> list[Path]:
    """Create `folder` and its missing parents; returns those it created, deepest first, for
    remove_empty_folders to take back when the work that needed them wrote nothing."""
    folder = Path(folder)
    created = [parent for parent in (folder, *folder.parents) if not parent.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    return created


def remove_empty_folders(created: list[Path]) -> None:
    """Remove the folders make_folder created, deepest first, up to the first that holds something."""
    for folder in created:
        try:
            folder.rmdir()
        except OSError:  # not empty: something was written there
            break
