"""Every way samples are put in batches: training's global batches, evaluation's shards and width batches.

Training: global batch `k` is a function of `k`, the dataset sizes and the seed, nothing else: not of the
number of processes (what makes a 2-process run equal a 1-process one) and not of what ran before
(what makes a resumed run equal one never stopped).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler


class GlobalBatchSampler(Sampler[list[tuple[int, int]]]):
    """Yields this rank's slice of global batches `start .. end - 1`, as indices into the datasets
    concatenated in order, each with its augmentation seed.

    Without ratios, epoch `e` shuffles all samples with a generator seeded by `seed + e`, and global
    batch `k` is the `k % batches_per_epoch`-th run of `B` positions of epoch `k // batches_per_epoch`
    (the tail that fills no batch waits for another epoch). With ratios, every global batch takes
    `round(B * ratio)` samples from each dataset, each dataset cycling through its own shuffles, and
    the parts are shuffled together. Rank `r` of `W` takes the `r`-th of the batch's `W` equal slices.
    """

    def __init__(
        self,
        sizes: list[int],
        global_batch: int,
        rank: int,
        world_size: int,
        seed: int,
        ratios: list[float] | None = None,
    ) -> None:
        if global_batch % world_size:
            raise ValueError(f"a global batch of {global_batch} does not split into {world_size} equal slices")
        self.sizes, self.global_batch, self.seed = list(sizes), global_batch, seed
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.num_samples = sum(sizes)
        self.per_rank = global_batch // world_size
        self.slice_start = rank * self.per_rank
        self.batches_per_epoch = self.num_samples // global_batch
        self.parts = self._parts(ratios) if ratios else None
        self.start, self.end = 0, 0
        self._orders: dict[tuple[int, int], torch.Tensor] = {}  # (dataset or -1, epoch) -> permutation

    def _parts(self, ratios: list[float]) -> list[int]:
        """Samples per global batch from each dataset: the ratios scaled to the batch, summing to it."""
        if len(ratios) != len(self.sizes):
            raise ValueError(f"{len(ratios)} ratios for {len(self.sizes)} datasets: give one per data.train entry")
        if any(ratio < 0 for ratio in ratios) or sum(ratios) <= 0:
            raise ValueError(f"ratios {ratios}: each must be 0 or more, and not all 0")
        exact = [self.global_batch * ratio / sum(ratios) for ratio in ratios]
        parts = [int(share) for share in exact]
        # The batch's remaining places go to the largest fractional parts.
        for i in sorted(range(len(parts)), key=lambda i: exact[i] - parts[i], reverse=True)[
            : self.global_batch - sum(parts)
        ]:
            parts[i] += 1
        empty = [i for i, (part, size) in enumerate(zip(parts, self.sizes)) if part and not size]
        if empty:
            raise ValueError(f"data.train entry {empty[0]} has a ratio but no usable samples")
        return parts

    def set_steps(self, start: int, end: int) -> None:
        """The next iteration yields global batches `start .. end - 1`."""
        self.start, self.end = start, end

    def _order(self, dataset: int, epoch: int, length: int) -> torch.Tensor:
        key = (dataset, epoch)
        if key not in self._orders:
            self._orders = {k: v for k, v in self._orders.items() if k[0] != dataset}  # keep one epoch per stream
            generator = torch.Generator().manual_seed(
                self.seed + epoch if dataset < 0 else self.seed + 1_000_003 * (dataset + 1) + epoch
            )
            # int32: half the memory at 14.4 M samples (58 MB, not 115), and the same permutation as int64.
            self._orders[key] = torch.randperm(
                length, generator=generator, dtype=torch.int32 if length < 2**31 else torch.int64
            )
        return self._orders[key]

    def _stream(self, dataset: int, first: int, count: int) -> list[int]:
        """Positions `first .. first + count - 1` of dataset `dataset`'s endless run of shuffles."""
        size = self.sizes[dataset]
        taken = []
        for position in range(first, first + count):
            epoch, within = divmod(position, size)
            taken.append(self.offsets[dataset] + int(self._order(dataset, epoch, size)[within]))
        return taken

    def global_batch_indices(self, step: int) -> list[int]:
        """All `B` indices of global batch `step`, in the order the ranks slice them."""
        if self.parts is None:
            epoch, batch = divmod(step, self.batches_per_epoch)
            order = self._order(-1, epoch, self.num_samples)
            return order[batch * self.global_batch : (batch + 1) * self.global_batch].tolist()
        indices = [
            index for dataset, part in enumerate(self.parts) for index in self._stream(dataset, step * part, part)
        ]
        mix = torch.randperm(len(indices), generator=torch.Generator().manual_seed(self.seed + step))
        return [indices[i] for i in mix.tolist()]

    def drawn_per_dataset(self, steps: range) -> list[int]:
        """How many samples global batches `steps` take from each dataset."""
        if self.parts is not None:
            return [part * len(steps) for part in self.parts]
        counts = [0] * len(self.sizes)
        for step in steps:
            for index in self.global_batch_indices(step):
                counts[bisect.bisect_right(self.offsets, index) - 1] += 1
        return counts

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        """This rank's `(index, augment seed)` pairs of each batch: the seed depends on the seed, the step
        and the place in the global batch, so augmentation is as exact across resumes and process
        counts as the order is."""
        for step in range(self.start, self.end):
            indices = self.global_batch_indices(step)[self.slice_start : self.slice_start + self.per_rank]
            yield [(index, self.augment_seed(step, self.slice_start + slot)) for slot, index in enumerate(indices)]

    def augment_seed(self, step: int, slot: int) -> int:
        return (self.seed * 1_000_003 + step) * self.global_batch + slot

    def __len__(self) -> int:
        return max(0, self.end - self.start)


class ShardSampler(Sampler[int]):
    """Indices rank, rank + world, ... : every sample in exactly one shard, none padded or repeated.

    DistributedSampler pads the last shard with repeats so all ranks get equal counts; that is fine
    for training and wrong for evaluation, where each sample must count once.
    """

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        self.length, self.rank, self.world_size = length, rank, world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.length, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.world_size))


def width_batches(widths: np.ndarray, batch_size: int, rank: int, world_size: int) -> list[list[int]]:
    """This rank's batches of positions, each holding images of one width: the batches of every
    width, narrowest first, dealt to the ranks in turn. Every position is in exactly one batch."""
    order = np.argsort(widths, kind="stable")  # by width, then by position
    runs = np.split(order, np.flatnonzero(np.diff(widths[order])) + 1)  # one run of positions per width
    batches = [run[i : i + batch_size].tolist() for run in runs for i in range(0, len(run), batch_size)]
    return batches[rank::world_size]
