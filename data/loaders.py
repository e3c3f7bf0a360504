"""The two data loaders: training's (global batches from the step alone) and evaluation's (each
sample exactly once, on exactly one rank)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import DataLoader

from data.codec import CTCCodec
from data.lmdb_dataset import Batch, CollateBatch, LmdbDataset, SeededSamples
from data.samplers import GlobalBatchSampler, ShardSampler, width_batches
from utils.distributed import DistEnv
from utils.preemption import ignore_stop_signals, kill_workers_at_exit


def build_train_loader(
    datasets: list[LmdbDataset],
    codec: CTCCodec,
    batch_size: int,
    ratios: list[float] | None,
    seed: int,
    num_workers: int,
    env: DistEnv,
) -> tuple[DataLoader, GlobalBatchSampler]:
    """This rank's loader of global batches of `batch_size` (data.train_ratios: `ratios`) and its sampler."""
    dataset = SeededSamples(datasets)
    sampler = GlobalBatchSampler([len(d) for d in datasets], batch_size, env.rank, env.world_size, seed, ratios)
    if sampler.batches_per_epoch == 0:
        raise ValueError(
            f"data.train has {len(dataset)} usable samples: fewer than one global batch of "
            f"{batch_size}; add data or lower train.batch_size"
        )
    if num_workers:
        kill_workers_at_exit()
    loader = DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=CollateBatch(codec, datasets[0].transform.output_shape, torch.uint8),
        pin_memory=env.device.type == "cuda",
        persistent_workers=num_workers > 0,
        worker_init_fn=ignore_stop_signals,
        # Its own generator: worker seeds then neither draw from nor depend on the global RNG
        # (augmentation draws from each sample's own seed, not from the workers').
        generator=torch.Generator().manual_seed(seed + env.rank),
    )
    return loader, sampler


def build_eval_loader(
    dataset: LmdbDataset,
    codec: CTCCodec,
    batch_size: int,
    num_workers: int,
    env: DistEnv,
    collate_fn: Callable[[list], Batch] | None = None,
) -> DataLoader:
    """A loader over this rank's exact shard of `dataset` (no padding, no repeats); `collate_fn`
    replaces CollateBatch (scripts/eval.py's keeps each sample's LMDB index).

    Where the transform keeps the aspect ratio and pads to a multiple of `width_step`, images are
    batched by their padded width: a batch of narrow words runs at its own width, not img_width.
    Each image's input is the same in any batch, so the results do not depend on the batching.
    """
    transform = dataset.transform
    if transform.keep_aspect and transform.width_step:
        batching = {"batch_sampler": width_batches(dataset.padded_widths(), batch_size, env.rank, env.world_size)}
    else:
        batching = {"batch_size": batch_size, "sampler": ShardSampler(len(dataset), env.rank, env.world_size)}
    if num_workers:
        kill_workers_at_exit()
    return DataLoader(
        dataset,
        **batching,
        num_workers=num_workers,
        collate_fn=collate_fn or CollateBatch(codec, dataset.transform.output_shape),
        pin_memory=env.device.type == "cuda",
        persistent_workers=num_workers > 0,
        worker_init_fn=ignore_stop_signals,
    )
