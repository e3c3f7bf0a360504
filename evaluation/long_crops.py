"""Crops longer than the model's window, read in overlapping pieces whose output frames are stitched.

The model reads a crop squashed into its input width (with data.keep_aspect: squashed once it is
wider than data.img_width). A long word or a short line then gets too few frames per character, and
CTC needs at least one each. `LongCropTransform` resizes such a crop to the model's height keeping
its aspect ratio instead; `PiecewiseModel` cuts it into pieces of the model's input width, half a
width apart, reads them as one batch, and stitches their output frames: each frame of the crop comes
from the piece whose centre is nearest, so a piece gives its middle half (the first and the last
piece also their outer quarter, at the crop's two ends), where its LSTM has context on both sides.
The stitched `[T, C]` frames are decoded once by the usual decoder: a character cut by a seam is one
run of frames, which CTC's collapse reads once.

docTR merges its pieces' strings by their overlap instead. Stitching frames needs no string
matching, which a repeated letter or a misread in the overlap can fool into a doubled or lost
character, and every decoder (beam, lexicon) and each character's probability then see the whole crop.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import Tensor, nn

from data.lmdb_dataset import LmdbDataset
from data.transforms import ImageTransform, Preprocessing, pad_right
from models import output_frames

# A crop is long when, at the model's height with its aspect ratio kept, it is more than SPLIT_ABOVE
# input widths wide: 6:1 for 32 x 128. Measured with the recipe's model (configs/crnn.yaml) on synthetic
# crops (docs/prediction-and-export.md#crops-longer-than-the-models-window): up to 1.5 widths squashed and
# pieced crops read alike, squashing being what training does (the generator's crops reach 2.3 widths
# of 128), so the one forward pass is kept; beyond it pieces read clearly better, and beyond 2 widths a
# squashed line is hardly ever read.
SPLIT_ABOVE = 1.5
# At most this many input widths are read (a 128:1 line at 32 x 128, 63 pieces in one forward pass);
# a longer crop is squashed to it, so a sliver of an image cannot ask for millions of pieces.
LONGEST = 32


class LongCropTransform:
    """`transform`'s input for every crop, except a long one: that one keeps its aspect ratio at the
    model's height (`[C, H, W]` wider than the model's input, for `PiecewiseModel`)."""

    def __init__(self, transform: ImageTransform) -> None:
        self.transform = transform
        preprocessing = transform.preprocessing
        self.split_width = SPLIT_ABOVE * preprocessing.width  # pixels at the model's height
        self.split_ratio = self.split_width / preprocessing.height  # 6 (:1) for 32 x 128
        # The same decoding, filter and normalisation, resized to the height alone and never padded.
        self.aspect_kept = ImageTransform(
            dataclasses.replace(preprocessing, keep_aspect=True, max_stretch=1.0, width=LONGEST * preprocessing.width),
            width_step=1,
        )

    def is_long(self, width: int, height: int) -> bool:
        """Whether a `width x height` crop is read in pieces."""
        return self.aspect_kept.resized_width(width, height) > self.split_width

    def __call__(self, image_bytes: bytes) -> Tensor:
        image = self.transform.decode(image_bytes)
        chosen = self.aspect_kept if self.is_long(image.width, image.height) else self.transform
        return chosen.to_tensor(image)  # [C, H, W]


class PiecewiseModel(nn.Module):
    """`model` for inputs of any width: one no wider than the model's input is read as it is, a wider
    one in overlapping pieces whose frames are stitched (the module's docstring)."""

    def __init__(self, model: nn.Module, preprocessing: Preprocessing) -> None:
        super().__init__()
        self.model = model
        self.piece_width = preprocessing.width
        shape = (model, preprocessing.channels, preprocessing.height)
        self.frames = output_frames(*shape, self.piece_width)
        added = output_frames(*shape, 2 * self.piece_width) - self.frames
        if added < 1:
            raise ValueError(
                f"the model emits {self.frames} frames whatever the width of its input: it cannot "
                f"read long crops in pieces; use --no-split"
            )
        # Pixels per frame (4 for the CRNN). Pieces start at multiples of it, so frame t of a piece
        # starting at pixel x is frame x / pitch + t of the crop, exactly, whatever the model's padding.
        self.pitch = max(1, round(self.piece_width / added))
        self.stride = max(self.pitch, self.piece_width // 2 // self.pitch * self.pitch)

    def padded_width(self, width: int) -> int:
        """Up to pitch - 1 columns more, so the last piece, flush with the right end, starts on the grid."""
        return self.piece_width + -(-(width - self.piece_width) // self.pitch) * self.pitch

    def pieces(self, width: int) -> int:
        """How many model inputs an image `width` pixels wide is read as (1 up to the model's width)."""
        if width <= self.piece_width:
            return 1
        return len(piece_starts(self.padded_width(width), self.piece_width, self.stride))

    def forward(self, images: Tensor) -> Tensor:  # [B, C, H, W] -> [B, T, classes]
        if images.shape[-1] <= self.piece_width:
            return self.model(images)
        width = self.padded_width(images.shape[-1])
        images = pad_right(images, width)
        starts = piece_starts(width, self.piece_width, self.stride)
        pieces = torch.stack([images[..., start : start + self.piece_width] for start in starts], 1)  # [B, P, C, H, w]
        logits = self.model(pieces.flatten(0, 1))  # [B * P, T, classes]
        return stitch(logits.unflatten(0, (len(images), len(starts))), [start // self.pitch for start in starts])


def piece_starts(width: int, piece_width: int, stride: int) -> list[int]:
    """The left edges of the pieces covering `width` pixels: `stride` apart, the last flush with the right end."""
    return [*range(0, width - piece_width, stride), width - piece_width]


def stitch(piece_logits: Tensor, offsets: list[int]) -> Tensor:
    """The crop's frames `[B, offsets[-1] + T, classes]` from its pieces' `[B, P, T, classes]`, where
    frame 0 of piece p is frame `offsets[p]` of the crop: each frame from the piece whose centre is
    nearest (a tie: the earlier piece)."""
    frames = piece_logits.shape[2]
    device = piece_logits.device
    starts = torch.tensor(offsets, device=device)  # [P]
    positions = torch.arange(offsets[-1] + frames, device=device)  # [T_total]
    centres = starts + (frames - 1) / 2  # [P]
    nearest = (positions[:, None] - centres[None]).abs().argmin(1)  # [T_total]: argmin takes the first of a tie
    return piece_logits[:, nearest, positions - starts[nearest]]  # [B, T_total, classes]


def split_long_samples(dataset: LmdbDataset, transform: LongCropTransform) -> tuple[LmdbDataset, LmdbDataset]:
    """`dataset` in two: the samples read as its transform reads them, and the long ones, read keeping
    their aspect ratio (for a PiecewiseModel). Each sample is in exactly one; one whose image header
    cannot be read goes with the long ones, whose loading drops and counts it as any other does."""
    long = copy.copy(dataset)
    long.transform = transform.aspect_kept
    is_long = long.padded_widths() > transform.split_width  # [N], from the image headers alone
    whole = copy.copy(dataset)
    whole.indices, long.indices = dataset.indices[~is_long], dataset.indices[is_long]
    return whole, long
