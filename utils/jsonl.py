"""Reading a JSON-lines log (metrics.jsonl) that a crash or a full disk may have cut short."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path) -> tuple[list[tuple[str, Any]], int]:
    """(line, parsed value) of every readable line of `path`, and how many were unreadable: a line cut
    short mid-write (or mid-character) is dropped and counted, never fatal."""
    rows, unreadable = [], 0
    for line in Path(path).read_bytes().decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rows.append((line, json.loads(line)))
        except json.JSONDecodeError:
            unreadable += 1
    return rows, unreadable
