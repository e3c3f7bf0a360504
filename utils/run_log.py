"""The run's output: messages, a JSON-lines metrics log and a progress bar, from rank 0 only.

Other ranks get a RunLog that does nothing, so call sites need no `if rank == 0`.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm


class RunLog:
    def __init__(self, out_dir: str | Path | None) -> None:
        """`out_dir=None` makes a silent log (every rank but 0)."""
        self.enabled = out_dir is not None
        self.metrics_path = Path(out_dir) / "metrics.jsonl" if out_dir is not None else None
        self.bar: tqdm | None = None

    def info(self, message: str) -> None:
        if self.enabled:
            tqdm.write(message)  # prints above the progress bar instead of through it

    def metrics(self, record: dict[str, Any]) -> None:
        if self.metrics_path is not None:
            with self.metrics_path.open("a", encoding="utf-8") as file:
                file.write(json.dumps({"time": round(time.time(), 3), **record}) + "\n")

    def start_progress(self, total: int, initial: int) -> None:
        if self.enabled:
            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, mininterval=2.0)

    def advance(self, postfix: dict[str, Any] | None = None) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
