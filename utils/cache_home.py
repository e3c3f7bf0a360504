"""The project's folder in the user's cache: $XDG_CACHE_HOME (or ~/.cache), then crnn-ocr."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "crnn-ocr"
