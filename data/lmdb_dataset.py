"""Text-recognition samples from an LMDB in the field's format, opened read-only, and their batches.

Keys and the label reader: data/lmdb_keys.py; opening: data/lmdb_env.py; which samples are usable: data/label_index.py.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import ConcatDataset, Dataset

from data.codec import CTCCodec
from data.label_index import usable_samples
from data.lmdb_env import lmdb_for_scan, shared_lmdb
from data.lmdb_keys import image_key, read_label
from data.transforms import ImageTransform, image_size

# What to do with a label holding characters outside the alphabet: leave the sample out, or remove
# those characters and keep it (the benchmarks' protocol). data.unknown_characters, eval.py's option.
UNKNOWN_CHARACTERS = ("drop", "remove")


class LmdbDataset(Dataset):
    """The usable samples of one LMDB folder, as `(image [C, H, W], label)` or None if undecodable.

    The LMDB is opened lazily in each process that reads it (the main process or a data-loader
    worker, forked or spawned), once per process however many datasets read it.
    """

    def __init__(
        self,
        root: str | Path,
        codec: CTCCodec,
        max_frames: int,
        transform: ImageTransform,
        remove_unknown: bool = False,
        index_cache: Path | None = None,
    ) -> None:
        self.root = str(root)
        self.codec = codec
        self.transform = transform
        self.remove_unknown = remove_unknown
        # index_cache: the folder of data/label_index.py's cache (data.index_cache); None: scanned every time.
        self.indices, self.report = usable_samples(root, codec, max_frames, remove_unknown, index_cache)

    def __len__(self) -> int:
        return len(self.indices)

    def padded_widths(self) -> np.ndarray:
        """Each sample's width after the transform, from its image header (nothing is decoded)."""
        widths = np.full(len(self), self.transform.width, dtype=np.int64)
        with lmdb_for_scan(self.root) as env, env.begin(buffers=True) as txn:
            for position, index in enumerate(self.indices.tolist()):
                try:
                    widths[position] = self.transform.padded_width(*image_size(txn.get(image_key(index))))
                except Exception:  # undecodable: loading drops it, whatever batch it lands in
                    pass
        return widths

    def __getitem__(self, position: int) -> tuple[Tensor, str] | None:
        """Sample `position` as evaluation reads it: the normalised image and its label."""
        read = self.read(position)
        if read is None:
            return None
        try:
            image = self.transform(read[0])
        except Exception:  # any decoding failure: the collate function drops and counts the sample
            return None
        return image, read[1]

    def load_pixels(self, position: int) -> tuple[Tensor, int, str] | None:
        """Sample `position` as training's workers hand it over: uint8 pixels padded to the full width,
        the width of the image within them, and its label (augmentation and normalisation follow on the
        device: data.transforms.DeviceTransform)."""
        read = self.read(position)
        if read is None:
            return None
        try:
            pixels, width = self.transform.to_uint8(self.transform.decode(read[0]))
        except Exception:  # any decoding failure: the collate function drops and counts the sample
            return None
        return pixels, width, read[1]

    def read(self, position: int) -> tuple[bytes, str] | None:
        """The encoded image of sample `position` and its label as the codec reads it; None without an image."""
        index = int(self.indices[position])
        with shared_lmdb(self.root).begin(buffers=True) as txn:
            label = read_label(txn, index)
            image_bytes = txn.get(image_key(index))
            image_bytes = bytes(image_bytes) if image_bytes is not None else None
        if image_bytes is None:
            return None
        label = self.codec.normalize(label)
        return image_bytes, self.codec.remove_unknown(label) if self.remove_unknown else label


class SeededSamples(ConcatDataset):
    """Datasets concatenated, read by `(index, augment seed)` pairs, as data.samplers.GlobalBatchSampler
    yields them: `(uint8 pixels, width, seed, label)` or None."""

    def __getitem__(self, item: tuple[int, int]) -> tuple[Tensor, int, int, str] | None:
        index, seed = item
        which = bisect.bisect_right(self.cumulative_sizes, index)  # ConcatDataset's own lookup
        start = self.cumulative_sizes[which - 1] if which else 0
        sample = self.datasets[which].load_pixels(index - start)
        return None if sample is None else (sample[0], sample[1], seed, sample[2])


@dataclass
class Batch:
    images: Tensor  # [B, C, H, W]: normalised floats, or training's uint8 pixels (widths and seeds then set)
    labels: list[str]
    targets: Tensor  # [sum of label lengths], class indices, as F.ctc_loss takes them
    target_lengths: Tensor  # [B]
    num_dropped: int  # samples of this batch whose image could not be decoded
    widths: Tensor | None = None  # [B] training: each image's width before its padding
    seeds: Tensor | None = None  # [B] training: each sample's augmentation seed

    def pin_memory(self) -> Batch:
        """Called by the DataLoader on CUDA: pinned tensors copy to the GPU asynchronously (non_blocking)."""
        self.images = self.images.pin_memory()
        self.targets, self.target_lengths = self.targets.pin_memory(), self.target_lengths.pin_memory()
        if self.widths is not None:
            self.widths, self.seeds = self.widths.pin_memory(), self.seeds.pin_memory()
        return self


class CollateBatch:
    """Stacks decoded samples, drops undecodable ones (never replacing them), encodes the labels. Takes
    evaluation's `(image, label)` samples and training's `(pixels, width, seed, label)` ones."""

    def __init__(self, codec: CTCCodec, image_shape: tuple[int, int, int], dtype: torch.dtype = torch.float32) -> None:
        self.codec = codec
        self.image_shape = image_shape  # (C, H, W): the shape of an empty batch too
        self.dtype = dtype

    def __call__(self, samples: list[tuple | None]) -> Batch:
        good = [sample for sample in samples if sample is not None]
        labels = [sample[-1] for sample in good]
        targets, target_lengths = self.codec.encode(labels)
        empty = torch.empty(0, *self.image_shape, dtype=self.dtype)
        images = torch.stack([sample[0] for sample in good]) if good else empty
        batch = Batch(images, labels, targets, target_lengths, num_dropped=len(samples) - len(good))
        if self.dtype == torch.uint8:
            batch.widths = torch.tensor([sample[1] for sample in good], dtype=torch.long)
            batch.seeds = torch.tensor([sample[2] for sample in good], dtype=torch.long)
        return batch
