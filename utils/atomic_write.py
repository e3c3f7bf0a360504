"""Text files replaced whole: written beside their place, then renamed over it, so a crash never leaves
half a file where a good one was."""
from __future__ import annotations

import os
from pathlib import Path


def write_text_atomically(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
