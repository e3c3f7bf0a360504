"""The training numbers between two log lines, summed over every rank and carried across a resume."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from utils.distributed import all_reduce_sum


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
        self.waiting = 0.0  # seconds this process waited for the loader's next batch
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

    def timed(self, batches: Iterable[Any]) -> Iterator[Any]:
        """`batches`, the time spent waiting for each one counted: the share of a step a starved GPU idles."""
        batches = iter(batches)
        while True:
            start = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                return
            self.waiting += time.perf_counter() - start
            yield batch

    def reduce(self) -> tuple[list[float], list[int]]:
        """Per-step losses and the counts (infinite, undecodable, skipped, samples), summed over all processes."""
        # Every rank skips the same steps, so every rank holds the same number of losses.
        losses = all_reduce_sum(torch.stack(self.losses).cpu()).tolist() if self.losses else []
        counts = torch.tensor([int(self.infinite), self.undecodable, self.skipped, self.samples], dtype=torch.long)
        return losses, all_reduce_sum(counts).tolist()

    def record(self, world_size: int) -> dict[str, Any]:
        """The log line's numbers (a collective); the window starts again empty."""
        losses, (infinite, undecodable, skipped, samples) = self.reduce()
        seconds = time.perf_counter() - self.start
        waiting = all_reduce_sum(torch.tensor([self.waiting], dtype=torch.float64)).item() / world_size
        record = {
            "loss": sum(losses) / world_size / max(len(losses), 1),
            "images_per_s": samples / seconds,
            "data_wait_share": waiting / seconds,  # the processes' mean
            "infinite_losses": infinite,
            "undecodable_images": undecodable,
            "skipped_steps": skipped,
        }
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
        self.samples, self.waiting, self.start = 0, 0.0, time.perf_counter()
