"""Files replaced whole: written beside their place, then renamed over it, so a crash, a full disk or a
stop signal never leaves half a file where a good one was, nor a temporary file beside it."""
from __future__ import annotations

import os
from pathlib import Path


def write_bytes_atomically(path: str | Path, data: bytes) -> None:
    """Put `data` at `path`. A failure to write raises OSError naming `path` (the temporary file's own
    name would mean nothing to the user)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise OSError(error.errno, error.strerror, str(path)) from error
        raise


def write_text_atomically(path: str | Path, text: str) -> None:
    write_bytes_atomically(path, text.encode("utf-8"))
