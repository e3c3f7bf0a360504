"""The order of training samples: global batches that do not depend on the number of processes."""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class GlobalBatchSampler(Sampler[list[int]]):
    """Yields this rank's slice of each global batch, from any position in any epoch.

    Epoch `e` shuffles all samples with a generator seeded by `seed + e`; global batch `k` is
    positions `[k * B, (k + 1) * B)` of that order, and rank `r` of `W` takes the `r`-th of its `W`
    equal slices. So step `k` trains on the same `B` samples whatever `W` is (what makes a 2-process
    run equal a 1-process one), and `set_position(epoch, position)` skips the batches a resumed run
    has already trained on. The tail that fills no global batch is left out (a different one each
    epoch).
    """

    def __init__(self, num_samples: int, global_batch: int, rank: int, world_size: int, seed: int) -> None:
        if global_batch % world_size:
            raise ValueError(f"a global batch of {global_batch} does not split into {world_size} equal slices")
        self.num_samples, self.global_batch, self.seed = num_samples, global_batch, seed
        self.per_rank = global_batch // world_size
        self.offset = rank * self.per_rank
        self.batches_per_epoch = num_samples // global_batch
        self.epoch, self.position = 0, 0

    def set_position(self, epoch: int, position: int = 0) -> None:
        """Start the next iteration at global batch `position` of epoch `epoch`."""
        if not 0 <= position <= self.batches_per_epoch:
            raise ValueError(f"position {position} is outside an epoch of {self.batches_per_epoch} batches")
        self.epoch, self.position = epoch, position

    def __iter__(self) -> Iterator[list[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.num_samples, generator=generator)
        for batch in range(self.position, self.batches_per_epoch):
            start = batch * self.global_batch + self.offset
            yield order[start:start + self.per_rank].tolist()

    def __len__(self) -> int:
        return self.batches_per_epoch - self.position
