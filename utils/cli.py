"""The one place where expected failures of every command become a one-line error.

Bad input (a config value, a missing or unreadable file, a folder that is not an LMDB, a full or
read-only disk) is not a bug: its message names the file, key or option and what to do, and a
traceback would bury it. Anything else is a bug and keeps its traceback. CRNN_TRACEBACK=1 in the
environment shows the traceback of expected failures too.
"""
from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

import lmdb

# What to do about the operating system's refusals, by errno.
OS_ADVICE = {
    errno.ENOSPC: "the disk is full: free space or write elsewhere (files already in place were left intact)",
    errno.EDQUOT: "the disk quota is exhausted: free space or write elsewhere (files already in place were left intact)",
    errno.EROFS: "the file system is read-only: write elsewhere",
    errno.EACCES: "no permission: fix the permissions or use another path",
    errno.EPERM: "not permitted: fix the permissions or use another path",
    errno.EISDIR: "it is a folder: give a file",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "something else is already there: remove it or use another path",
}


def describe(error: BaseException) -> str:
    """The one line an expected failure is reported with."""
    if isinstance(error, OSError) and not isinstance(error, FileNotFoundError) and error.errno in OS_ADVICE:
        where = error.filename or ""
        return f"{where}{': ' if where else ''}{error.strerror or error}; {OS_ADVICE[error.errno]}"
    if isinstance(error, lmdb.Error):
        return f"LMDB: {error}"
    return str(error)


def run(main: Callable[[], int | None], expected: tuple[type[BaseException], ...] = ()) -> None:
    """Run a command's `main` and exit with its code, turning expected failures into `error: ...` on
    stderr and exit code 1. `expected` adds a command's own exception types."""
    try:
        code = main()
    except (ValueError, OSError, lmdb.Error, *expected) as error:  # ConfigError is a ValueError
        if os.environ.get("CRNN_TRACEBACK") == "1":
            raise
        sys.exit(f"error: {describe(error)}")
    sys.exit(code or 0)
