"""Text-recognition samples from an LMDB in the field's format, opened read-only.

Keys: data/lmdb_keys.py.
"""
from __future__ import annotations

import bisect
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import lmdb
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import ConcatDataset, Dataset

from data.codec import CTCCodec, ctc_min_frames
from data.lmdb_keys import IMAGE_PREFIX, LABEL_PREFIX, NUM_SAMPLES, image_key, label_key
from data.transforms import ImageTransform, image_size

DROP_REASONS = ("missing label", "missing image", "empty label", "characters outside the alphabet",
                "too long for CTC")


def open_lmdb(root: str | Path) -> lmdb.Environment:
    """Open an LMDB folder read-only, with a clear error when it is not one."""
    root = Path(root)
    if root.is_file():
        hint = f"; give its folder, {root.parent}" if root.name == "data.mdb" else ""
        raise FileNotFoundError(f"LMDB {root} is a file: an LMDB is a folder holding data.mdb{hint}")
    if not root.is_dir():
        raise FileNotFoundError(f"LMDB folder {root} does not exist")
    if not (root / "data.mdb").is_file():
        raise FileNotFoundError(f"{root} holds no data.mdb: it is not an LMDB folder (see scripts/create_lmdb.py)")
    if not os.access(root / "data.mdb", os.R_OK):
        raise PermissionError(f"{root / 'data.mdb'}: no permission to read it; fix its permissions (chmod a+r)")
    try:
        # lock=False: readers of a read-only dataset need no lock file, and the folder may be read-only.
        return lmdb.open(str(root), readonly=True, lock=False, readahead=False, meminit=False, max_readers=512)
    except lmdb.Error as error:  # a data.mdb that is not an LMDB (cut short, or another file renamed)
        raise ValueError(f"{root / 'data.mdb'} is not a readable LMDB ({error}); rebuild it with "
                         f"scripts/create_lmdb.py") from None


# py-lmdb allows one open environment per file per process, and the same LMDB may back several
# datasets (train and val, or listed twice). Keyed by process id: an environment must not cross a fork.
_ENVIRONMENTS: dict[tuple[int, str], lmdb.Environment] = {}


def shared_lmdb(root: str | Path) -> lmdb.Environment:
    """This process's read-only environment for `root`, opened on first use and kept open."""
    key = (os.getpid(), os.path.realpath(root))
    if key not in _ENVIRONMENTS:
        _ENVIRONMENTS[key] = open_lmdb(root)
    return _ENVIRONMENTS[key]


@contextmanager
def lmdb_for_scan(root: str | Path) -> Iterator[lmdb.Environment]:
    """The shared environment if this process has one, else one closed afterwards: py-lmdb's
    one-environment-per-file rule survives a fork, so a parent that kept one open would stop its
    data-loader workers from opening theirs."""
    key = (os.getpid(), os.path.realpath(root))
    if key in _ENVIRONMENTS:
        yield _ENVIRONMENTS[key]
        return
    env = open_lmdb(root)
    try:
        yield env
    finally:
        env.close()


def read_num_samples(txn: lmdb.Transaction, root: str | Path) -> int:
    raw = txn.get(NUM_SAMPLES)
    if raw is None:
        raise ValueError(f"{root}: the LMDB has no 'num-samples' key; it is not in the text-recognition format")
    raw = bytes(raw)  # a memoryview in a buffers=True transaction
    try:
        total = int(raw)
    except ValueError:
        raise ValueError(f"{root}: 'num-samples' is {raw!r}, not an integer") from None
    if total < 0:
        raise ValueError(f"{root}: 'num-samples' is {total}; it must count the samples (0 or more)")
    return total


def highest_index(txn: lmdb.Transaction) -> int:
    """The highest index of an `image-` or `label-` key (0 if none), from two cursor seeks: no sample
    lies beyond it, whatever num-samples says."""
    highest = 0
    for prefix in (IMAGE_PREFIX, LABEL_PREFIX):
        cursor = txn.cursor()
        # The key just before the first one past the prefix's keys, or the very last key.
        found = cursor.prev() if cursor.set_range(prefix + b"\xff") else cursor.last()
        key = bytes(cursor.key()) if found else b""
        if key.startswith(prefix) and key[len(prefix):].isdigit():
            highest = max(highest, int(key[len(prefix):]))
    return highest


@dataclass
class FilterReport:
    """What filtering kept and dropped in one LMDB, and why."""

    root: str
    total: int  # the LMDB's num-samples
    kept: int = 0
    present: int = 0  # indices holding a label or an image: fewer than `total` when keys are missing
    dropped: Counter = field(default_factory=Counter)
    unknown_characters: Counter = field(default_factory=Counter)
    shortened: int = 0  # labels kept without their characters outside the alphabet (remove_unknown)

    def summary(self) -> str:
        reasons = ", ".join(f"{self.dropped[reason]} {reason}" for reason in DROP_REASONS if self.dropped[reason])
        line = f"{self.root}: kept {self.kept} of {self.total}; dropped: {reasons or 'none'}"
        if self.present < self.total:
            line += (f"\n  num-samples is {self.total} but only {self.present} samples exist: the LMDB was cut short"
                     " or num-samples is wrong (scripts/create_lmdb.py writes it)")
        if self.shortened:
            line += f"\n  {self.shortened} labels lost characters outside the alphabet (removed, not dropped)"
        if self.unknown_characters:
            common = " ".join(f"{char!r}x{n}" for char, n in self.unknown_characters.most_common(10))
            line += f"\n  characters outside the alphabet (most common): {common}"
        return line


def scan_labels(root: str | Path, codec: CTCCodec, max_frames: int, remove_unknown: bool = False
                ) -> tuple[np.ndarray, FilterReport]:
    """Read every label once; return the indices (1-based) of the usable samples and a report.

    A sample is usable when its image key exists (it is not decoded here) and its label is non-empty,
    every character is in the alphabet, and CTC can align it to `max_frames` frames (a repeated
    character needs a blank between its two frames). With `remove_unknown`, characters outside the
    alphabet are removed from a label instead of dropping it, as the benchmarks' protocol does.
    """
    # buffers=True: values come back as views into the memory map, so looking up an image key to see
    # that it exists reads no image bytes.
    with lmdb_for_scan(root) as env, env.begin(buffers=True) as txn:
        total = read_num_samples(txn, root)
        report = FilterReport(root=str(root), total=total)
        kept: list[int] = []
        # Not range(1, total + 1): a num-samples of 10**12 would make this loop run for hours. The
        # indices past the highest key hold nothing: counted as missing without a lookup each.
        last = min(total, highest_index(txn))
        if total > last:
            report.dropped["missing label"] += total - last
        for index in range(1, last + 1):
            raw = txn.get(label_key(index))
            label = None if raw is None else codec.normalize(bytes(raw).decode("utf-8", errors="replace"))
            has_image = txn.get(image_key(index)) is not None
            report.present += label is not None or has_image
            reason = None
            if label is None:
                reason = "missing label"
            elif not has_image:
                reason = "missing image"
            else:
                unknown = codec.unknown_characters(label)
                if unknown and remove_unknown:
                    report.unknown_characters.update(char for char in label if char in unknown)
                    report.shortened += 1
                    label, unknown = codec.remove_unknown(label), set()
                if not label:
                    reason = "empty label"
                elif unknown:
                    reason = "characters outside the alphabet"
                    report.unknown_characters.update(char for char in label if char in unknown)
                elif ctc_min_frames(label) > max_frames:
                    reason = "too long for CTC"
            if reason:
                report.dropped[reason] += 1
            else:
                kept.append(index)
    report.kept = len(kept)
    # A numpy array, not a list of ints: forked workers then share it instead of copying it on read.
    return np.asarray(kept, dtype=np.int64), report


class LmdbDataset(Dataset):
    """The usable samples of one LMDB folder, as `(image [C, H, W], label)` or None if undecodable.

    The LMDB is opened lazily in each process that reads it (the main process or a data-loader
    worker, forked or spawned), once per process however many datasets read it.
    """

    def __init__(self, root: str | Path, codec: CTCCodec, max_frames: int, transform: ImageTransform,
                 remove_unknown: bool = False) -> None:
        self.root = str(root)
        self.codec = codec
        self.transform = transform
        self.remove_unknown = remove_unknown
        self.indices, self.report = scan_labels(root, codec, max_frames, remove_unknown)

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
        return self.load(position)

    def load(self, position: int, augment_seed: int | None = None) -> tuple[Tensor, str] | None:
        """Sample `position`, augmented as `augment_seed` draws if the transform augments."""
        index = int(self.indices[position])
        with shared_lmdb(self.root).begin(buffers=True) as txn:
            label = bytes(txn.get(label_key(index))).decode("utf-8", errors="replace")
            image_bytes = txn.get(image_key(index))
            image_bytes = bytes(image_bytes) if image_bytes is not None else None
        if image_bytes is None:
            return None
        try:
            image = self.transform(image_bytes, augment_seed)
        except Exception:  # any decoding failure: the collate function drops and counts the sample
            return None
        label = self.codec.normalize(label)
        return image, self.codec.remove_unknown(label) if self.remove_unknown else label


class SeededSamples(ConcatDataset):
    """Datasets concatenated, read by `(index, augment seed)` pairs, as data.samplers.GlobalBatchSampler yields them."""

    def __getitem__(self, item: tuple[int, int]) -> tuple[Tensor, str] | None:
        index, seed = item
        which = bisect.bisect_right(self.cumulative_sizes, index)  # ConcatDataset's own lookup
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which].load(index - start, seed)


@dataclass
class Batch:
    images: Tensor  # [B, C, H, W]
    labels: list[str]
    targets: Tensor  # [sum of label lengths], class indices, as F.ctc_loss takes them
    target_lengths: Tensor  # [B]
    num_dropped: int  # samples of this batch whose image could not be decoded

    def pin_memory(self) -> Batch:
        """Called by the DataLoader on CUDA: pinned tensors copy to the GPU asynchronously (non_blocking)."""
        self.images = self.images.pin_memory()
        self.targets, self.target_lengths = self.targets.pin_memory(), self.target_lengths.pin_memory()
        return self


class CollateBatch:
    """Stacks decoded samples, drops undecodable ones (never replacing them), encodes the labels."""

    def __init__(self, codec: CTCCodec, image_shape: tuple[int, int, int]) -> None:
        self.codec = codec
        self.image_shape = image_shape  # (C, H, W): the shape of an empty batch too

    def __call__(self, samples: list[tuple[Tensor, str] | None]) -> Batch:
        good = [sample for sample in samples if sample is not None]
        labels = [label for _, label in good]
        targets, target_lengths = self.codec.encode(labels)
        images = torch.stack([image for image, _ in good]) if good else torch.empty(0, *self.image_shape)
        return Batch(images, labels, targets, target_lengths, num_dropped=len(samples) - len(good))
