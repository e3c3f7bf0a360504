"""Leakage between training and evaluation LMDBs: the same crop, or nearly the same, in both.

Three kinds of match between a training sample and an evaluation sample, strongest evidence first:

- identical bytes (a SHA-256 of the encoded image);
- identical decoded pixels (a SHA-256 of the RGB pixels and the size, decoded as training decodes them):
  the same picture stored as PNG and as BMP, say;
- near-duplicates: two 64-bit perceptual hashes per crop (`perceptual_hash`), one of the whole crop and one
  of its ink box (`ink_box`: the crop cut to the rows and columns that hold text), within
  DEFAULT_WHOLE_THRESHOLD and DEFAULT_INK_THRESHOLD bits (Hamming distance) of the other crop's, the
  two crops' aspect ratios within MAX_ASPECT_CHANGE and their mean colours within MAX_COLOUR_CHANGE. The
  whole-crop hash finds copies re-encoded as JPEG or resized; the ink-box hash finds copies cut by a few
  pixels, which shift every column of a hash of the whole crop; the colour check keeps the same word on
  another sign, in a like font, from passing for a copy.

A pair of any kind whose labels agree too (case folded: the benchmarks' protocol ignores case) is
reported as a same-label, near-identical pair as well. The same label alone is no leakage (a word occurs
in many pictures): a pair is never flagged by its label without its image.

The hash is a DCT hash (pHash) sized for word crops: the grey crop resized to 128 x 32 (HASH_WIDTH x
HASH_HEIGHT), its 2-D DCT, and the 4 x 16 lowest frequencies (4 vertical, 16 horizontal: a word's detail
runs along its width) each compared with their median, one bit each. A square 32 x 32 pHash squeezes a
word of ten letters into 32 columns, and different words in one font then hash alike. The thresholds
were chosen by measurement on rendered words (docs/data.md, "Checking for leakage between training and
evaluation sets").

Matching compares every training hash with every evaluation hash, ROW_BLOCK rows at a time, with numpy's
XOR and popcount: 7,000 x 7,000 pairs take about a second.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image

from data.lmdb_env import first_index, highest_index, lmdb_for_scan, read_num_samples
from data.lmdb_keys import image_key, read_label
from data.lmdb_writer import Sample, copied_samples, labelled_samples
from data.transforms import decode_image

HASH_WIDTH, HASH_HEIGHT = 128, 32  # the grey crop is resized to this before the DCT
LOW_ROWS, LOW_COLUMNS = 4, 16  # the lowest vertical x horizontal frequencies kept: 64 bits
# Bits of 64, measured on rendered words (docs/data.md): a JPEG or resized copy was within 4 bits of its
# source on the whole crop, most copies cut by a few pixels within 8 on the ink box; different words in
# one font were 8 or more apart on the whole crop and, but for one pair of 40,000, 9 or more on the ink box.
DEFAULT_WHOLE_THRESHOLD, DEFAULT_INK_THRESHOLD = 4, 8
# The most the mean red, green or blue of two near-duplicates may differ (of 255): a copy keeps its colours
# (the planted copies changed by 5.5 at most), while the same word on another sign, which the grey hashes
# of its ink box can confuse with it, seldom has them (this gate removed all 8 such flags of 300 renders).
MAX_COLOUR_CHANGE = 16.0
INK_SHARE = 0.03  # a row or column holding ink in more than this share of its pixels is part of the text
MAX_ASPECT_CHANGE = 1.3  # width/height ratios further apart than this are different crops
ROW_BLOCK = 1024  # training hashes compared with every evaluation hash at a time: 1024 x 7,000 bytes

IDENTICAL_BYTES, IDENTICAL_PIXELS, NEAR_DUPLICATE = "identical bytes", "identical pixels", "near-duplicate"
KINDS = (IDENTICAL_BYTES, IDENTICAL_PIXELS, NEAR_DUPLICATE)  # strongest evidence first
SAME_LABEL = "same label, near-identical image"  # a pair of any kind whose labels agree too
# count_matches's keys (the --json file's): training samples flagged by each kind, under its strongest evidence.
COUNT_NAMES = {
    IDENTICAL_BYTES: "identical_bytes",
    IDENTICAL_PIXELS: "identical_pixels",
    NEAR_DUPLICATE: "near_duplicate",
    SAME_LABEL: "same_label",
}


@lru_cache(maxsize=4)
def dct_matrix(size: int) -> np.ndarray:
    """The orthonormal DCT-II of `size` points as a matrix: `dct_matrix(n) @ signal` transforms a column."""
    frequencies = np.arange(size)[:, None]
    positions = np.arange(size)[None, :]
    matrix = np.cos(np.pi * (2 * positions + 1) * frequencies / (2 * size)) * np.sqrt(2 / size)
    matrix[0] /= np.sqrt(2)
    return matrix


def perceptual_hash(image: Image.Image) -> int:
    """A 64-bit DCT hash of a word crop (the module docstring says why this shape): bit k is 1 where the
    k-th of the 4 x 16 lowest frequencies, in row order, exceeds their median (the DC term left out of the
    median, which it would dominate)."""
    grey = image.convert("L").resize((HASH_WIDTH, HASH_HEIGHT), Image.Resampling.BILINEAR, reducing_gap=None)
    pixels = np.asarray(grey, dtype=np.float64)  # [HASH_HEIGHT, HASH_WIDTH]
    spectrum = dct_matrix(HASH_HEIGHT) @ pixels @ dct_matrix(HASH_WIDTH).T  # [HASH_HEIGHT, HASH_WIDTH]
    low = spectrum[:LOW_ROWS, :LOW_COLUMNS].ravel()  # [64]
    bits = low > np.median(low[1:])
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


def ink_box(image: Image.Image) -> Image.Image:
    """`image` cut to the rows and columns that hold text: those where more than INK_SHARE of the pixels
    differ from the background (the median of the border pixels) by more than half the strong contrast
    (half the 99th percentile of the differences, so the rule holds on faint and JPEG-blurred crops
    alike). A copy cut by a few pixels of margin has the same ink box as its source; `image` itself where
    no row or column holds ink."""
    grey = np.asarray(image.convert("L"), dtype=np.float64)  # [H, W]
    border = np.concatenate([grey[0], grey[-1], grey[:, 0], grey[:, -1]])
    contrast = np.abs(grey - np.median(border))
    ink = contrast > 0.5 * np.percentile(contrast, 99)
    columns = np.nonzero(ink.mean(axis=0) > INK_SHARE)[0]
    rows = np.nonzero(ink.mean(axis=1) > INK_SHARE)[0]
    if len(columns) < 2 or len(rows) < 2:
        return image
    return image.crop((int(columns[0]), int(rows[0]), int(columns[-1]) + 1, int(rows[-1]) + 1))


def hamming_distances(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Bits that differ between every hash of `left` [N] and every hash of `right` [M] (uint64): [N, M] uint8."""
    return np.bitwise_count(left[:, None] ^ right[None, :])


def near_pairs(left: np.ndarray, right: np.ndarray, threshold: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (i, j, distance) with `left[i]` and `right[j]` at most `threshold` bits apart, i ascending:
    all pairs compared, ROW_BLOCK rows of `left` at a time so memory stays at ROW_BLOCK x M bytes."""
    found_i, found_j, found_d = [], [], []
    for start in range(0, len(left), ROW_BLOCK):
        distances = hamming_distances(left[start : start + ROW_BLOCK], right)  # [block, M]
        rows, columns = np.nonzero(distances <= threshold)
        found_i.append(rows + start)
        found_j.append(columns)
        found_d.append(distances[rows, columns])
    if not found_i:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.uint8)
    return np.concatenate(found_i), np.concatenate(found_j), np.concatenate(found_d)


@dataclass
class Fingerprints:
    """What matching needs of every sample of one LMDB that holds an image, by position (not by index)."""

    root: Path
    indices: list[int] = field(default_factory=list)  # the LMDB's sample index of each position
    labels: list[str] = field(default_factory=list)  # "" where the sample has no label
    byte_digests: list[bytes] = field(default_factory=list)
    pixel_digests: list[bytes] = field(default_factory=list)  # b"" where the image could not be decoded
    whole_hashes: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))  # [N]
    ink_hashes: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))  # [N]
    aspects: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))  # [N] width / height, 0: undecodable
    colours: np.ndarray = field(default_factory=lambda: np.empty((0, 3), np.float64))  # [N, 3] mean R, G, B
    undecodable: list[int] = field(default_factory=list)  # sample indices whose image could not be decoded


def fingerprint_image(image_bytes: bytes) -> tuple[bytes, bytes, int, int, float, np.ndarray]:
    """(bytes digest, pixels digest, whole-crop hash, ink-box hash, width / height, mean R, G, B [3]) of one
    encoded image, decoded as training decodes it (data.transforms.decode_image). Raises what decoding raises."""
    image = decode_image(image_bytes, "RGB")
    width, height = image.size
    pixels = hashlib.sha256(b"%dx%d:" % (width, height) + image.tobytes()).digest()
    return (
        hashlib.sha256(image_bytes).digest(),
        pixels,
        perceptual_hash(image),
        perceptual_hash(ink_box(image)),
        width / max(height, 1),
        np.asarray(image, dtype=np.float64).reshape(-1, 3).mean(axis=0),
    )


def fingerprint_lmdb(root: str | Path) -> Fingerprints:
    """The fingerprints of every sample of the LMDB at `root` that holds an image, opened read-only. An image
    that cannot be decoded keeps its bytes digest (it can still be an identical copy) and is listed in
    `undecodable`. Raises ValueError naming `root` where it holds no image (nothing to compare)."""
    root = Path(root)
    found = Fingerprints(root)
    whole, ink, aspects, colours = [], [], [], []
    with lmdb_for_scan(root) as env, env.begin() as txn:
        read_num_samples(txn, root)  # a header that is not a count is named, as training names it
        for index in range(first_index(txn), highest_index(txn) + 1):
            image_bytes = txn.get(image_key(index))
            if image_bytes is None:
                continue
            image_bytes = bytes(image_bytes)
            try:
                byte_digest, pixel_digest, whole_hash, ink_hash, aspect, colour = fingerprint_image(image_bytes)
            except Exception:  # noqa: BLE001 - any image Pillow cannot decode, whatever it raises
                # Still an identical copy by its bytes; aspect 0 keeps it from every near match.
                byte_digest, pixel_digest, whole_hash, ink_hash = hashlib.sha256(image_bytes).digest(), b"", 0, 0
                aspect, colour = 0.0, np.zeros(3)
                found.undecodable.append(index)
            found.indices.append(index)
            found.labels.append(read_label(txn, index) or "")
            found.byte_digests.append(byte_digest)
            found.pixel_digests.append(pixel_digest)
            whole.append(whole_hash)
            ink.append(ink_hash)
            aspects.append(aspect)
            colours.append(colour)
    if not found.indices:
        raise ValueError(f"{root} holds no images (an empty LMDB): there is nothing to compare; give another LMDB")
    found.whole_hashes = np.array(whole, dtype=np.uint64)
    found.ink_hashes = np.array(ink, dtype=np.uint64)
    found.aspects = np.array(aspects, dtype=np.float64)
    found.colours = np.array(colours, dtype=np.float64).reshape(-1, 3)
    return found


@dataclass(frozen=True)
class Match:
    """A training sample and an evaluation sample that are, or may be, the same crop."""

    train_index: int  # sample index in the training LMDB
    eval_index: int  # sample index in the evaluation LMDB
    kind: str  # IDENTICAL_BYTES, IDENTICAL_PIXELS or NEAR_DUPLICATE (the image's strongest evidence)
    whole_distance: int  # Hamming distance of the whole-crop hashes (bits of 64)
    ink_distance: int  # of the ink-box hashes
    same_label: bool  # the labels agree (labels_agree)
    train_label: str
    eval_label: str


def labels_agree(first: str, second: str) -> bool:
    """Whether two labels name the same word as the benchmarks score it: case folded, outer spaces stripped."""
    return bool(first.strip()) and first.strip().casefold() == second.strip().casefold()


def find_matches(
    train: Fingerprints,
    evaluation: Fingerprints,
    whole_threshold: int = DEFAULT_WHOLE_THRESHOLD,
    ink_threshold: int = DEFAULT_INK_THRESHOLD,
) -> list[Match]:
    """Every (training sample, evaluation sample) pair that is the same crop, ordered by training then
    evaluation index: identical bytes, identical pixels, or (both images decoded, aspect ratios within
    MAX_ASPECT_CHANGE, mean colours within MAX_COLOUR_CHANGE) whole-crop hashes within `whole_threshold`
    bits or ink-box hashes within `ink_threshold` bits."""
    by_bytes: dict[bytes, list[int]] = {}
    by_pixels: dict[bytes, list[int]] = {}
    for position, (byte_digest, pixel_digest) in enumerate(zip(evaluation.byte_digests, evaluation.pixel_digests)):
        by_bytes.setdefault(byte_digest, []).append(position)
        if pixel_digest:
            by_pixels.setdefault(pixel_digest, []).append(position)
    found: dict[tuple[int, int], str] = {}  # (train position, eval position) -> kind
    for position, (byte_digest, pixel_digest) in enumerate(zip(train.byte_digests, train.pixel_digests)):
        for other in by_bytes.get(byte_digest, []):
            found[(position, other)] = IDENTICAL_BYTES
        for other in by_pixels.get(pixel_digest, []) if pixel_digest else []:
            found.setdefault((position, other), IDENTICAL_PIXELS)
    for hashes, threshold in (("whole_hashes", whole_threshold), ("ink_hashes", ink_threshold)):
        rows, columns, _ = near_pairs(getattr(train, hashes), getattr(evaluation, hashes), threshold)
        train_aspects, eval_aspects = train.aspects[rows], evaluation.aspects[columns]
        # An undecodable image has aspect 0 and hash 0: never near anything.
        decoded = (train_aspects > 0) & (eval_aspects > 0)
        change = np.where(decoded, train_aspects, 1.0) / np.where(decoded, eval_aspects, 1.0)
        colour_change = np.abs(train.colours[rows] - evaluation.colours[columns]).max(axis=1, initial=0.0)
        similar = decoded & (np.maximum(change, 1 / change) <= MAX_ASPECT_CHANGE) & (colour_change <= MAX_COLOUR_CHANGE)
        for row, column in zip(rows[similar].tolist(), columns[similar].tolist()):
            found.setdefault((row, column), NEAR_DUPLICATE)
    matches = []
    for (row, column), kind in sorted(found.items()):
        matches.append(
            Match(
                train.indices[row],
                evaluation.indices[column],
                kind,
                int(np.bitwise_count(train.whole_hashes[row] ^ evaluation.whole_hashes[column])),
                int(np.bitwise_count(train.ink_hashes[row] ^ evaluation.ink_hashes[column])),
                labels_agree(train.labels[row], evaluation.labels[column]),
                train.labels[row],
                evaluation.labels[column],
            )
        )
    return matches


def count_matches(matches: list[Match]) -> dict[str, int]:
    """How many training samples each kind of match flags (a sample counted once, under its strongest
    evidence), how many of them match an evaluation sample of the same label too, how many pairs there
    are, and how many training and evaluation samples are in at least one."""
    strongest: dict[int, str] = {}
    for match in matches:
        current = strongest.get(match.train_index)
        if current is None or KINDS.index(match.kind) < KINDS.index(current):
            strongest[match.train_index] = match.kind
    counts = {COUNT_NAMES[kind]: sum(kind == value for value in strongest.values()) for kind in KINDS}
    counts[COUNT_NAMES[SAME_LABEL]] = len({match.train_index for match in matches if match.same_label})
    counts["flagged_train"] = len(strongest)
    counts["matched_eval"] = len({match.eval_index for match in matches})
    counts["pairs"] = len(matches)
    return counts


def flagged_indices(matches: list[Match]) -> set[int]:
    """The training samples (their LMDB indices) in at least one match: what a filtered copy leaves out."""
    return {match.train_index for match in matches}


def example_matches(matches: list[Match], count: int) -> list[Match]:
    """Up to `count` matches to look at, the kinds taken in turn (closest first within each), so that one
    kind of many pairs does not hide the others."""
    by_kind = [
        sorted(
            (match for match in matches if match.kind == kind),
            key=lambda match: (min(match.whole_distance, match.ink_distance), match.train_index),
        )
        for kind in KINDS
    ]
    chosen: list[Match] = []
    while len(chosen) < min(count, len(matches)):
        for group in by_kind:
            if group and len(chosen) < count:
                chosen.append(group.pop(0))
    return chosen


def read_images(root: Path, indices: list[int]) -> list[Image.Image | str]:
    """The decoded images of `indices` in the LMDB at `root` (RGB), or why one cannot be shown."""
    images: list[Image.Image | str] = []
    with lmdb_for_scan(root) as env, env.begin() as txn:
        for index in indices:
            try:
                images.append(decode_image(bytes(txn.get(image_key(index))), "RGB"))
            except Exception:  # noqa: BLE001 - shown as text in the picture
                images.append("undecodable image")
    return images


def kept_samples(root: Path, left_out: set[int]) -> Iterator[Sample]:
    """Every sample of the LMDB at `root` holding both an image and a label, in order, but those whose index
    is in `left_out`: for data.lmdb_writer.write_lmdb."""
    samples = [sample for sample in labelled_samples([root]) if sample[1] not in left_out]
    return copied_samples([root], samples)
