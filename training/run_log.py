"""The run's output: messages, a JSON-lines metrics log, TensorBoard and a progress bar, from rank 0 only.

Other ranks get a RunLog that does nothing, so call sites need no `if rank == 0`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tqdm import tqdm

from utils.atomic_write import write_text_atomically
from utils.jsonl import read_jsonl
from utils.run_files import open_no_follow


class RunLog:
    def __init__(self, out_dir: str | Path | None) -> None:
        """`out_dir=None` makes a silent log (every rank but 0)."""
        self.enabled = out_dir is not None
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.metrics_path = self.out_dir / "metrics.jsonl" if self.out_dir is not None else None
        self.bar: tqdm | None = None
        self.board = None

    def start_tensorboard(self, first_step: int) -> None:
        """Write TensorBoard events too; those a dead run wrote from `first_step` on are dropped."""
        if self.out_dir is not None:
            from torch.utils.tensorboard import (
                SummaryWriter,  # imported here: slow, and rank 0 only
            )

            self.board = SummaryWriter(str(self.out_dir / "tensorboard"), purge_step=first_step)

    def info(self, message: str) -> None:
        if self.enabled:
            tqdm.write(message)  # prints above the progress bar instead of through it

    def metrics(self, record: dict[str, Any]) -> None:
        """One line of metrics.jsonl; its numbers also as TensorBoard scalars (`train/...`, `val/SET/...`,
        `retain/SET/...`)."""
        if self.metrics_path is not None:
            with open_no_follow(self.metrics_path, "a") as file:  # never through a link: once per log line
                file.write(json.dumps({"time": round(time.time(), 3), **record}) + "\n")
        if self.board is not None:
            kind = next((kind for kind in ("val", "retain") if kind in record), None)
            prefix = f"{kind}/{Path(record[kind]).name}" if kind else "train"
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step", "epoch"):
                    self.board.add_scalar(f"{prefix}/{key}", value, record["step"])

    @property
    def takes_images(self) -> bool:
        """Whether `image` writes anything: an image worth logging may be costly to draw."""
        return self.board is not None

    def image(self, tag: str, step: int, image: Image.Image) -> None:
        if self.board is not None:
            self.board.add_image(tag, np.asarray(image.convert("RGB")), step, dataformats="HWC")

    def drop_records_after(self, step: int) -> None:
        """Forget what a run that died after `step` logged: the resumed run logs those steps again. A line
        the crash cut short is dropped too, with a warning."""
        if self.metrics_path is None or not self.metrics_path.is_file():
            return
        rows, unreadable = read_jsonl(self.metrics_path)
        if unreadable:
            self.info(
                f"warning: {self.metrics_path}: dropped {unreadable} unreadable line(s), what a crash or a full "
                f"disk leaves when it cuts a write short"
            )
        kept = [line + "\n" for line, record in rows if not isinstance(record, dict) or record.get("step", 0) <= step]
        write_text_atomically(self.metrics_path, "".join(kept))

    def start_progress(self, total: int, initial: int) -> None:
        if self.enabled:
            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, mininterval=2.0)

    def set_total(self, total: int) -> None:
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()

    def advance(self, postfix: dict[str, Any] | None = None) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.board is not None:
            self.board.close()
