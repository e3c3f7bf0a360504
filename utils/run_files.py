"""Files of a run folder, opened as what they are named: never through a symbolic link.

A run folder is copied and handed over; a `metrics.jsonl -> ~/.bashrc`, a `best.pt -> /etc/...`, a
`tensorboard -> another tool's logs` or a `.lock -> elsewhere` in it must never be followed, appended to,
truncated, overwritten or deleted. `refuse_links` checks the names a run writes once at start-up (every
rank, before any process group); `open_no_follow` opens a file with O_NOFOLLOW, so a link put there
later is refused by the kernel, at no extra cost.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO


class LinkInRunFolder(ValueError):
    """A run-folder file is a symbolic link (a ValueError: the commands print it as one `error: ...` line)."""


def link_message(path: Path) -> str:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return (
        f"{path} is a symbolic link{target}; the run folder holds only files this project wrote: remove the "
        f"link or pick another train.out_dir"
    )


def refuse_links(paths: Iterable[Path]) -> None:
    """Raise LinkInRunFolder naming the first of `paths` that is a symbolic link."""
    for path in paths:
        if path.is_symlink():
            raise LinkInRunFolder(link_message(path))


def open_no_follow(path: str | Path, mode: str) -> IO:
    """`open(path, mode)`, refusing a symbolic link at `path` (O_NOFOLLOW: the kernel checks, at no cost)."""
    path = Path(path)
    try:
        return open(  # noqa: SIM115 - the caller closes it
            path,
            mode,
            encoding=None if "b" in mode else "utf-8",
            opener=lambda name, flags: os.open(name, flags | os.O_NOFOLLOW, 0o666),
        )
    except OSError as error:
        if error.errno == errno.ELOOP and path.is_symlink():
            raise LinkInRunFolder(link_message(path)) from None
        raise
