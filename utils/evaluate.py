"""Evaluation on all processes: each rank reads its own shard, the metric sums are added up."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader

from data.codec import CTCCodec
from data.lmdb_dataset import Batch, CollateBatch, LmdbDataset
from data.transforms import pad_right
from utils.distributed import DistEnv, ShardSampler, all_reduce_sum
from utils.losses import ctc_losses
from utils.metrics import counts_to_tensor, new_counts, tensor_to_counts, update_counts
from utils.precision import autocast
from utils.preemption import ignore_stop_signals


def width_batches(widths: np.ndarray, batch_size: int, rank: int, world_size: int) -> list[list[int]]:
    """This rank's batches of positions, each holding images of one width: the batches of every
    width, narrowest first, dealt to the ranks in turn. Every position is in exactly one batch."""
    order = np.argsort(widths, kind="stable")  # by width, then by position
    runs = np.split(order, np.flatnonzero(np.diff(widths[order])) + 1)  # one run of positions per width
    batches = [run[i:i + batch_size].tolist() for run in runs for i in range(0, len(run), batch_size)]
    return batches[rank::world_size]


def build_eval_loader(dataset: LmdbDataset, codec: CTCCodec, batch_size: int, num_workers: int, env: DistEnv,
                      collate_fn: Callable[[list], Batch] | None = None) -> DataLoader:
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
    return DataLoader(
        dataset,
        **batching,
        num_workers=num_workers,
        collate_fn=collate_fn or CollateBatch(codec, dataset.transform.output_shape),
        pin_memory=env.device.type == "cuda",
        persistent_workers=num_workers > 0,
        worker_init_fn=ignore_stop_signals,
    )


@torch.inference_mode()
def evaluate(model: nn.Module, loader: DataLoader, codec: CTCCodec, env: DistEnv, precision: str,
             channels_last: bool = False,
             on_batch: Callable[[Batch, list[str], list[float]], None] | None = None) -> dict[str, int]:
    """Metric sums over the whole dataset behind `loader`, identical on every rank.

    `model` must be the unwrapped module: a forward through DDP would start collectives that ranks
    with shards of different lengths cannot all join. Undecodable images are counted in `dropped`.
    `on_batch(batch, predictions, confidences)`, if given, sees this rank's predictions batch by batch
    (scripts/eval.py keeps them for --dump and --errors).
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
        predictions, confidences = map(list, zip(*codec.decode(logits)))
        losses, _ = ctc_losses(logits, batch, env.device, count_infinite=False)
        update_counts(counts, predictions, batch.labels, confidences, losses.tolist(), codec.alphabet)
        if on_batch is not None:
            on_batch(batch, predictions, confidences)
    model.train(was_training)
    totals = counts_to_tensor(counts)
    totals = all_reduce_sum(torch.cat([totals, torch.tensor([dropped])]))
    result = tensor_to_counts(totals[:-1])
    result["dropped"] = int(totals[-1])
    return result


@torch.inference_mode()
def decode_samples(model: nn.Module, dataset: LmdbDataset, codec: CTCCodec, device: torch.device,
                   count: int = 8) -> list[tuple[Image.Image, list[tuple[str, str]]]]:
    """The first `count` decodable samples of `dataset` with their label and the model's reading,
    as cells for utils.visualize.caption_grid."""
    was_training = model.training
    model.eval()
    samples = [sample for sample in (dataset[i] for i in range(min(len(dataset), 4 * count))) if sample is not None][:count]
    cells = []
    if samples:
        width = max(image.shape[-1] for image, _ in samples)
        logits = model(torch.stack([pad_right(image, width) for image, _ in samples]).to(device))
        for (image, label), (text, confidence) in zip(samples, codec.decode(logits)):
            cells.append((dataset.transform.to_image(image), [(f"label: {label}", "black"),
                                                   (f"read: {text}  ({confidence:.2f})", "black" if text == label else "firebrick")]))
    model.train(was_training)
    return cells
