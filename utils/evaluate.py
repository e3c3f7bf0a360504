"""Evaluation on all processes: each rank reads its own shard, the metric sums are added up."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader

from data.codec import CTCCodec
from data.lmdb_dataset import CollateBatch, LmdbDataset
from utils.distributed import DistEnv, ShardSampler, all_reduce_sum
from utils.losses import ctc_losses
from utils.metrics import counts_to_tensor, new_counts, tensor_to_counts, update_counts
from utils.precision import autocast
from utils.preemption import ignore_stop_signals


def build_eval_loader(dataset: LmdbDataset, codec: CTCCodec, batch_size: int, num_workers: int, env: DistEnv) -> DataLoader:
    """A loader over this rank's exact shard of `dataset` (no padding, no repeats)."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=ShardSampler(len(dataset), env.rank, env.world_size),
        num_workers=num_workers,
        collate_fn=CollateBatch(codec, dataset.transform.output_shape),
        pin_memory=env.device.type == "cuda",
        persistent_workers=num_workers > 0,
        worker_init_fn=ignore_stop_signals,
    )


@torch.inference_mode()
def evaluate(model: nn.Module, loader: DataLoader, codec: CTCCodec, env: DistEnv, precision: str,
             channels_last: bool = False) -> dict[str, int]:
    """Metric sums over the whole dataset behind `loader`, identical on every rank.

    `model` must be the unwrapped module: a forward through DDP would start collectives that ranks
    with shards of different lengths cannot all join. Undecodable images are counted in `dropped`.
    """
    was_training = model.training
    model.eval()
    counts = new_counts()
    dropped = 0
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    for batch in loader:
        dropped += batch.num_dropped
        if not batch.labels:
            continue
        images = batch.images.to(env.device, non_blocking=True, memory_format=memory_format)
        with autocast(env.device, precision):
            logits = model(images)  # [B, T, C]
        predictions, confidences = zip(*codec.decode(logits))
        losses, _ = ctc_losses(logits, batch, env.device, count_infinite=False)
        update_counts(counts, list(predictions), batch.labels, list(confidences), losses.tolist())
    model.train(was_training)
    totals = counts_to_tensor(counts)
    totals = all_reduce_sum(torch.cat([totals, torch.tensor([dropped])]))
    result = tensor_to_counts(totals[:-1])
    result["dropped"] = int(totals[-1])
    return result
