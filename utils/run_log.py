"""The run's output: messages, a JSON-lines metrics log, TensorBoard and a progress bar, from rank 0 only.

Other ranks get a RunLog that does nothing, so call sites need no `if rank == 0`.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from utils.distributed import all_reduce_sum
from utils.jsonl import read_jsonl


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
            from torch.utils.tensorboard import SummaryWriter  # imported here: slow, and rank 0 only

            self.board = SummaryWriter(str(self.out_dir / "tensorboard"), purge_step=first_step)

    def info(self, message: str) -> None:
        if self.enabled:
            tqdm.write(message)  # prints above the progress bar instead of through it

    def metrics(self, record: dict[str, Any]) -> None:
        """One line of metrics.jsonl; its numbers also as TensorBoard scalars (`train/...`, `val/SET/...`)."""
        if self.metrics_path is not None:
            with self.metrics_path.open("a", encoding="utf-8") as file:
                file.write(json.dumps({"time": round(time.time(), 3), **record}) + "\n")
        if self.board is not None:
            prefix = f"val/{Path(record['val']).name}" if "val" in record else "train"
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step", "epoch"):
                    self.board.add_scalar(f"{prefix}/{key}", value, record["step"])

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
            self.info(f"warning: {self.metrics_path}: dropped {unreadable} unreadable line(s), what a crash or a full "
                      f"disk leaves when it cuts a write short")
        kept = [line + "\n" for line, record in rows if not isinstance(record, dict) or record.get("step", 0) <= step]
        temporary = self.metrics_path.with_suffix(".tmp")
        temporary.write_text("".join(kept), encoding="utf-8")
        os.replace(temporary, self.metrics_path)

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
        if self.board is not None:
            self.board.close()


class LogWindow:
    """The training numbers between two log lines; losses stay on the device (no host sync per step).

    Each step's loss is kept apart and the ranks' values are added step by step before the steps are
    added up, so the logged mean does not depend on where a run was stopped and resumed.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.losses: list[torch.Tensor] = []
        self.infinite = torch.zeros((), dtype=torch.long, device=device)
        self.undecodable = self.skipped = self.samples = 0
        self.start = time.perf_counter()

    def add(self, loss: torch.Tensor | None, infinite: torch.Tensor, undecodable: int, samples: int) -> None:
        """`loss` is None for a skipped step: its NaN would poison the mean."""
        if loss is None:
            self.skipped += 1
        else:
            self.losses.append(loss.detach().float())
        self.infinite += infinite
        self.undecodable += undecodable
        self.samples += samples

    def reduce(self) -> tuple[list[float], list[int]]:
        """Per-step losses and the counts (infinite, undecodable, skipped, samples), summed over all processes."""
        # Every rank skips the same steps, so every rank holds the same number of losses.
        losses = all_reduce_sum(torch.stack(self.losses).cpu()).tolist() if self.losses else []
        counts = torch.tensor([int(self.infinite), self.undecodable, self.skipped, self.samples], dtype=torch.long)
        return losses, all_reduce_sum(counts).tolist()

    def record(self, world_size: int) -> dict[str, Any]:
        """The log line's numbers (a collective); the window starts again empty."""
        losses, (infinite, undecodable, skipped, samples) = self.reduce()
        record = {"loss": sum(losses) / world_size / max(len(losses), 1),
                  "images_per_s": samples / (time.perf_counter() - self.start),
                  "infinite_losses": infinite, "undecodable_images": undecodable, "skipped_steps": skipped}
        self.__init__(self.device)
        return record

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to log the same numbers after a resume (a collective)."""
        losses, counts = self.reduce()
        return {"losses": losses, "counts": counts[:3]}  # samples only time the window: not carried over

    def load_state_dict(self, state: dict[str, Any], is_main: bool) -> None:
        """Rank 0 takes the saved sums, the other ranks zeros: the next all-reduce adds them up exactly."""
        share = 1.0 if is_main else 0.0
        self.losses = [torch.tensor(value * share, device=self.device) for value in state["losses"]]
        infinite, undecodable, skipped = (count if is_main else 0 for count in state["counts"])
        self.infinite.fill_(infinite)
        self.undecodable, self.skipped = undecodable, skipped

    def restart_clock(self) -> None:
        """Time spent evaluating or saving is not training throughput."""
        self.samples, self.start = 0, time.perf_counter()
