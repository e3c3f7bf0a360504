"""Evaluation on all processes: each rank reads its own shard, the metric sums are added up."""

from __future__ import annotations

from collections.abc import Callable

import torch
from PIL import Image
from torch import Tensor, nn
from torch.utils.data import DataLoader

from data.codec import CTCCodec, Reading
from data.lmdb_dataset import Batch, LmdbDataset
from data.transforms import pad_right
from evaluation.decoders import Decoder
from evaluation.metrics import counts_to_tensor, new_counts, tensor_to_counts, update_counts
from models.losses import ctc_losses
from utils.distributed import DistEnv, all_reduce_sum
from utils.precision import autocast


class NonFiniteOutput(ValueError):
    """The model's output holds NaN or infinity: scored, it would be an error of integer code or 0 %; read,
    an empty text at confidence 0."""


def check_finite_outputs(logits: Tensor, precision: str) -> None:
    """Raise when `logits` `[B, T, C]` hold NaN or infinity, before any code takes them for numbers. A
    checkpoint's weights are checked when it is read (training.checkpoint.check_finite), so what is left
    is an overflow in the forward pass: fp16's, or weights grown too large in a run that is diverging.
    One reduction per batch, never in the training step; the decoder after it reads the logits on the
    host anyway."""
    finite = torch.isfinite(logits).flatten(1).all(1)  # [B]
    if bool(finite.all()):
        return
    cause = (
        "fp16's largest number is 65504, and this model's activations pass it: use bf16 or fp32 (--precision,"
        " train.precision)"
        if precision == "fp16"
        else "its weights have grown past what the arithmetic holds, as in a run that diverges: use an earlier"
        " checkpoint (in training: lower optim.lr, keep optim.grad_clip on)"
    )
    raise NonFiniteOutput(
        f"the model's output holds NaN or infinity for {int((~finite).sum())} of {len(finite)} images; {cause}"
    )


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    loader: DataLoader,
    codec: CTCCodec,
    env: DistEnv,
    precision: str,
    channels_last: bool = False,
    on_batch: Callable[[Batch, list[Reading], Tensor], None] | None = None,
    decode: Decoder | None = None,
) -> dict[str, int]:
    """Metric sums over the whole dataset behind `loader`, identical on every rank.

    `model` must be the unwrapped module: a forward through DDP would start collectives that ranks
    with shards of different lengths cannot all join. Undecodable images are counted in `dropped`.
    `on_batch(batch, readings, logits)`, if given, sees this rank's readings and logits `[B, T, C]` batch by
    batch (scripts/eval.py keeps them for --dump, --errors, the accuracy by confidence and the calibration error).
    `decode` is greedy by default (evaluation/decoders.py).
    """
    decode = decode or codec.decode
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
        check_finite_outputs(logits, precision)
        readings = decode(logits)
        losses, _ = ctc_losses(logits, batch.targets, batch.target_lengths, count_infinite=False)
        update_counts(
            counts,
            [reading.text for reading in readings],
            batch.labels,
            [reading.confidence for reading in readings],
            losses.tolist(),
            codec.alphabet,
        )
        if on_batch is not None:
            on_batch(batch, readings, logits)
    model.train(was_training)
    totals = counts_to_tensor(counts)
    totals = all_reduce_sum(torch.cat([totals, torch.tensor([dropped])]))
    result = tensor_to_counts(totals[:-1])
    result["dropped"] = int(totals[-1])
    return result


@torch.inference_mode()
def decode_samples(
    model: nn.Module, dataset: LmdbDataset, codec: CTCCodec, device: torch.device, count: int = 8
) -> list[tuple[Image.Image, list[tuple[str, str]]]]:
    """The first `count` decodable samples of `dataset` with their label and the model's reading,
    as cells for evaluation.visualize.caption_grid."""
    was_training = model.training
    model.eval()
    samples = [sample for sample in (dataset[i] for i in range(min(len(dataset), 4 * count))) if sample is not None][
        :count
    ]
    cells = []
    if samples:
        width = max(image.shape[-1] for image, _ in samples)
        logits = model(torch.stack([pad_right(image, width) for image, _ in samples]).to(device))
        for (image, label), reading in zip(samples, codec.decode(logits)):
            cells.append(
                (
                    dataset.transform.to_image(image),
                    [
                        (f"label: {label}", "black"),
                        (
                            f"read: {reading.text}  ({reading.confidence:.2f})",
                            "black" if reading.text == label else "firebrick",
                        ),
                    ],
                )
            )
    model.train(was_training)
    return cells


@torch.inference_mode()
def read_images(
    model: nn.Module, images: list[Tensor], device: torch.device, decode: Decoder, precision: str = "fp32"
) -> list[Reading]:
    """The reading of each `[C, H, W]` model input, in order. Images of one width run as one batch,
    so a reading never depends on which other images came with it (a keep_aspect transform with a
    width step makes several widths)."""
    results: list[Reading | None] = [None] * len(images)
    by_width: dict[int, list[int]] = {}
    for position, image in enumerate(images):
        by_width.setdefault(image.shape[-1], []).append(position)
    for positions in by_width.values():
        with autocast(device, precision):
            logits = model(torch.stack([images[position] for position in positions]).to(device))  # [B, T, C]
        check_finite_outputs(logits, precision)
        for position, reading in zip(positions, decode(logits)):
            results[position] = reading
    return results
