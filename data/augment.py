"""Training-time augmentation: batched tensor operations on the device, on a batch of resized images.

The data loader's workers decode and resize (the part that cannot be batched) and hand over uint8
pixels; the training step moves them to the device and augments the whole batch there, so a GPU is
fed by workers that do only what a CPU must (data.transforms.DeviceTransform, docs/performance.md).

Each transform is one entry of AUGMENTATIONS: its name (the config key `augment.<name>`), how likely it
is at each level and how strong, and the function that applies it. A level (`data.augment`, one of
LEVELS) sets the probabilities and strengths; the `augment` section of the config overrides any
probability. Every random number a sample draws is a function of its own seed (train.seed, the step
and its place in the global batch, see data.samplers) and of which number it is, nothing else
(SampleRandom): not of the batch it is in, the device, or a process's random state. A resumed run, a
run on another number of processes or workers, sees the same augmented images. Evaluation and
prediction never augment.

An image narrower than the batch (data.keep_aspect) is augmented as the `width` pixels of its own
content, as if alone: the geometry turns about its centre and fills with its own border colour, the
blur mirrors at its own edge, and the columns right of it repeat its last one again afterwards.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.transforms.v2 import functional as TF

LEVELS = ("none", "light", "strong")  # data.augment: how likely and how strong every transform is
MASK = 0xFFFFFFFF


def mix32(x: Tensor | int) -> Tensor | int:
    """A 32-bit integer hash (Wellons' lowbias32) of a Python integer or of int64 tensors, values in
    [0, 2**32), with no int64 overflow, so the same bits on every device: a product of x and a constant
    under 2**31 stays under 2**63, and a constant's top bit adds x's lowest bit at bit 31."""

    def times(x: Tensor | int, constant: int) -> Tensor | int:
        product = x * (constant & 0x7FFFFFFF)
        return (product + ((x & 1) << 31) if constant >> 31 else product) & MASK

    x = x ^ (x >> 16)
    x = times(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = times(x, 0x846CA68B)
    return x ^ (x >> 16)


@functools.lru_cache(maxsize=64)
def hashed_places(count: int, device: torch.device) -> Tensor:
    """`mix32(0 .. count - 1)`: what tells the elements of one draw apart."""
    return mix32(torch.arange(count, dtype=torch.int64, device=device))


class SampleRandom:
    """Random numbers for a batch of samples, `[B, *shape]`: each sample's are a hash of its seed's hash, this
    stream's number, the call's number and the element's place, so they are the same in any batch, on any
    device, and whether or not another stream drew before. One stream per transform, its calls in a fixed
    order; a transform draws its numbers in as few calls as it can (each call is some twenty tensor
    operations, which is what a small batch on a CPU pays for)."""

    def __init__(self, seeds: Tensor, stream: int) -> None:
        seeds = seeds.to(torch.int64)
        self.seed_keys = mix32(mix32(seeds & MASK) ^ (seeds >> 32))  # each sample's, whatever the stream
        self.keys = self.seed_keys ^ mix32(stream)
        self.calls = 0

    def stream(self, number: int, samples: Tensor) -> SampleRandom:
        """What `SampleRandom(seeds[samples], number)` draws, without hashing the seeds again."""
        other = copy.copy(self)
        other.seed_keys = self.seed_keys[samples]
        other.keys, other.calls = other.seed_keys ^ mix32(number), 0
        return other

    def bits(self, shape: tuple[int, ...]) -> Tensor:
        """`[B, *shape]` 24-bit integers, evenly spread."""
        self.calls += 1
        key = (self.keys ^ mix32(self.calls)).view(-1, *([1] * len(shape)))
        return mix32(key ^ hashed_places(math.prod(shape), self.keys.device).view(shape)) >> 8

    def uniform(self, shape: tuple[int, ...] = ()) -> Tensor:
        """Evenly from [0, 1)."""
        return self.bits(shape).float().mul_(2.0**-24)

    def normal(self, shape: tuple[int, ...]) -> Tensor:
        """Standard normal: Box-Muller, both of each pair's outputs."""
        count = math.prod(shape)
        pairs = (-(-count // 2),)
        radius = self.bits(pairs).float().add_(1).mul_(2.0**-24).log_().mul_(-2).sqrt_()  # from (0, 1]
        angle = self.uniform(pairs).mul_(2 * math.pi)
        return torch.cat([radius * angle.cos(), radius * angle.sin()], dim=1)[:, :count].view(-1, *shape)


def between(draws: Tensor, low: float, high: float) -> Tensor:
    """Uniform draws from [0, 1) spread over [low, high)."""
    return low + (high - low) * draws


@dataclass(frozen=True)
class AugmentationStep:
    """One transform of the pipeline. `name` is its config key (`augment.<name>` overrides its
    probability); `probability` how likely it is at each level; `strength` how far it goes at the light
    and strong levels (level `none` with a probability overridden uses light's); `apply(pixels, widths,
    strength, random)` the transform of the samples that drew it: `pixels` `[B, C, H, W]` in [0, 1],
    `widths` `[B]` each image's own width (the columns right of it are padding), `random` their
    SampleRandom, the source of every random draw. A geometric one builds its homographies and calls `warp`."""

    name: str
    probability: dict[str, float]
    apply: Callable[[Tensor, Tensor, Any, SampleRandom], Tensor]
    strength: dict[str, Any] = field(default_factory=dict)

    def strength_at(self, level: str) -> Any:
        """How far it goes at `level` (None for a transform that has no strength)."""
        return self.strength.get(level, self.strength.get("light"))


@functools.lru_cache(maxsize=64)
def pixel_centres(height: int, width: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """`[1, H, W]` each: each pixel's centre, x + 0.5 and y + 0.5, as homographies take it."""
    ys, xs = torch.meshgrid(
        torch.arange(height, device=device) + 0.5, torch.arange(width, device=device) + 0.5, indexing="ij"
    )
    return xs[None], ys[None]


def columns(pixels: Tensor) -> Tensor:
    """`[1, 1, 1, W]`: each column's index."""
    return torch.arange(pixels.shape[-1], device=pixels.device).view(1, 1, 1, -1)


def border_colour(pixels: Tensor, widths: Tensor) -> Tensor:
    """`[B, C, 1, 1]`: the median of each image's border pixels (the lower middle one of an even count),
    its own columns only."""
    batch, channels, height, width = pixels.shape
    inside = (columns(pixels) < widths.view(-1, 1, 1, 1))[:, :, 0]  # [B, 1, W]
    last = pixels.gather(3, (widths - 1).view(-1, 1, 1, 1).expand(batch, channels, height, 1))[..., 0]
    rows = torch.cat([pixels[:, :, 0], pixels[:, :, -1]], dim=2)  # [B, C, 2W]
    rows = rows.masked_fill(~torch.cat([inside, inside], dim=2), math.inf)
    border = torch.cat([rows, pixels[:, :, :, 0], last], dim=2).sort(dim=2).values
    middle = ((2 * widths + 2 * height - 1) // 2).view(-1, 1, 1).expand(batch, channels, 1)
    return border.gather(2, middle).view(batch, channels, 1, 1)


def warp(pixels: Tensor, widths: Tensor, to_source: Tensor) -> Tensor:
    """`pixels` resampled (bilinear) through `to_source`, `[B, 3, 3]` homographies from an output pixel's
    coordinates (x right, y down, pixel centres at +0.5) to the input's. What falls outside an image's
    own columns takes its border colour: black corners would be a shape the model never meets in real crops."""
    _, _, height, width = pixels.shape
    fill = border_colour(pixels, widths)
    # grid_sample pads with zeros: shifting by the fill first, and zeroing the padding columns, makes all
    # that lies outside the image the fill colour.
    shifted = (pixels - fill).masked_fill(columns(pixels) >= widths.view(-1, 1, 1, 1), 0)
    # Written out element by element, not as a matrix product: a batched product's rounding can depend on
    # the batch and the threads, and each image must come out the same in any batch.
    xs, ys = pixel_centres(height, width, pixels.device)
    matrix = to_source[..., None, None]  # [B, 3, 3, 1, 1]
    x, y, depth = (matrix[:, row, 0] * xs + matrix[:, row, 1] * ys + matrix[:, row, 2] for row in range(3))
    # grid_sample's coordinates run from -1 to 1 across the batch's width and height.
    grid = torch.stack([x / depth * (2 / width) - 1, y / depth * (2 / height) - 1], dim=3)  # [B, H, W, 2]
    return F.grid_sample(shifted, grid, mode="bilinear", align_corners=False) + fill


def about_centre(widths: Tensor, height: int, linear: Tensor, shift: Tensor) -> Tensor:
    """`[B, 3, 3]`: the homography taking an output pixel to its source when each image moves by
    p -> centre + shift + linear^-1 @ (p - centre): `linear` `[B, 2, 2]` is the way back, `shift` `[B, 2]`."""
    centre = torch.stack([widths.float() / 2, torch.full_like(widths, height, dtype=torch.float32) / 2], dim=1)
    offset = centre - (linear * (centre + shift)[:, None]).sum(dim=2)  # linear @ (centre + shift), per image
    matrix = torch.zeros(len(widths), 3, 3, device=widths.device)
    matrix[:, :2, :2], matrix[:, :2, 2], matrix[:, 2, 2] = linear, offset, 1
    return matrix


def affine(pixels: Tensor, widths: Tensor, strength: dict[str, Any], random: SampleRandom) -> Tensor:
    """Rotate, shear (along x), scale and shift about each image's centre."""
    height = pixels.shape[2]
    draws = random.uniform((5,)).unbind(1)
    angle = between(draws[0], -strength["degrees"], strength["degrees"]).deg2rad()
    shear = between(draws[1], -strength["shear"], strength["shear"]).deg2rad().tan()
    scale = between(draws[2], *strength["scale"])
    shift_x = between(draws[3], -1, 1) * strength["translate"][0] * widths
    shift_y = between(draws[4], -1, 1) * strength["translate"][1] * height
    # The image moves by rotation @ shear_and_scale; sampling needs the way back: (shear_and_scale)^-1 @ rotation^T.
    cos, sin = angle.cos(), angle.sin()
    back = torch.stack([(cos + shear * sin) / scale, (sin - shear * cos) / scale, -sin / scale, cos / scale], dim=1)
    return warp(pixels, widths, about_centre(widths, height, back.view(-1, 2, 2), torch.stack([shift_x, shift_y], 1)))


def homographies(source: Tensor, target: Tensor) -> Tensor:
    """`[B, 3, 3]`: the homography taking each of the four `source` points (`[B, 4, 2]`) to its `target` point."""
    x, y, u, v = source[..., 0], source[..., 1], target[..., 0], target[..., 1]
    one, zero = torch.ones_like(x), torch.zeros_like(x)
    rows = torch.cat(
        [
            torch.stack([x, y, one, zero, zero, zero, -u * x, -u * y], dim=-1),
            torch.stack([zero, zero, zero, x, y, one, -v * x, -v * y], dim=-1),
        ],
        dim=1,
    )  # [B, 8, 8]
    solved = torch.linalg.solve(rows.double(), torch.cat([u, v], dim=1).double()).float()
    return torch.cat([solved, torch.ones_like(solved[:, :1])], dim=1).view(-1, 3, 3)


def perspective(pixels: Tensor, widths: Tensor, distortion: float, random: SampleRandom) -> Tensor:
    """Move each corner inwards by up to `distortion` of half the image's width and height, as if the
    word were seen at an angle."""
    height = pixels.shape[2]
    size = torch.stack([widths.float(), torch.full_like(widths, height, dtype=torch.float32)], dim=1)[:, None]
    corners = torch.tensor([[0, 0], [1, 0], [1, 1], [0, 1]], device=pixels.device) * size  # [B, 4, 2]
    inwards = torch.tensor([[1, 1], [-1, 1], [-1, -1], [1, -1]], device=pixels.device) * size * distortion / 2
    moved = corners + inwards * random.uniform((4, 2))
    return warp(pixels, widths, homographies(moved, corners))


def brightness_contrast(pixels: Tensor, widths: Tensor, strength: dict[str, float], random: SampleRandom) -> Tensor:
    """Scale the brightness, and the contrast about the image's mean grey, each by up to +-strength, in
    a random order."""
    draws = random.uniform((3,)).view(-1, 3, 1, 1, 1).unbind(1)
    brightness = between(draws[0], 1 - strength["brightness"], 1 + strength["brightness"])
    contrast = between(draws[1], 1 - strength["contrast"], 1 + strength["contrast"])
    contrast_first = draws[2] >= 0.5
    contrasted = adjust_contrast(pixels, widths, contrast)
    then_brightness = (contrasted * brightness).clamp_(0, 1)
    then_contrast = adjust_contrast((pixels * brightness).clamp_(0, 1), widths, contrast)
    return torch.where(contrast_first, then_brightness, then_contrast)


def adjust_contrast(pixels: Tensor, widths: Tensor, factor: Tensor) -> Tensor:
    """Contrast scaled by `factor` about each image's mean grey over its own columns (ITU-R 601 luma for colour)."""
    grey = pixels if pixels.shape[1] == 1 else TF.rgb_to_grayscale(pixels)
    inside = columns(pixels) < widths.view(-1, 1, 1, 1)
    mean = (grey * inside).sum(dim=(1, 2, 3)) / (widths * grey.shape[2])
    return (pixels * factor + (1 - factor) * mean.view(-1, 1, 1, 1)).clamp_(0, 1)


def invert(pixels: Tensor, widths: Tensor, strength: None, random: SampleRandom) -> Tensor:
    """Light text on dark."""
    return 1 - pixels


def mirrored_columns(pixels: Tensor, widths: Tensor) -> Tensor:
    """`[B, C, H, W + 4]`: each image with two columns more on either side of its own `width`, mirrored
    about its edge (repeating it where the image is under 3 pixels wide, too narrow to mirror)."""
    batch, channels, height, width = pixels.shape
    narrow = (widths < 3).view(-1, 1)
    left = torch.where(narrow, 0, torch.tensor([2, 1], device=pixels.device))
    right = torch.where(narrow, widths.view(-1, 1) - 1, widths.view(-1, 1) - torch.tensor([2, 3], device=pixels.device))
    columns_of = lambda index: pixels.gather(3, index.view(batch, 1, 1, 2).expand(batch, channels, height, 2))  # noqa: E731
    padded = torch.cat([columns_of(left), pixels, pixels[..., -2:]], dim=3)
    places = (widths.view(-1, 1) + torch.tensor([2, 3], device=pixels.device)).view(batch, 1, 1, 2)
    return padded.scatter(3, places.expand(batch, channels, height, 2), columns_of(right))


def blur(pixels: Tensor, widths: Tensor, sigma_range: tuple[float, float], random: SampleRandom) -> Tensor:
    """A 5x5 Gaussian blur of a sigma drawn from `sigma_range`, edges mirrored (repeated along an axis under
    3 pixels long)."""
    _, _, height, width = pixels.shape
    sigma = between(random.uniform((1,)), *sigma_range)
    taps = torch.exp(-(torch.arange(-2.0, 3.0, device=pixels.device) ** 2) / (2 * sigma**2))
    taps = (taps / taps.sum(dim=1, keepdim=True)).view(-1, 5, 1, 1, 1).unbind(1)
    padded = mirrored_columns(pixels, widths)
    rows = sum(tap * padded[..., offset : offset + width] for offset, tap in enumerate(taps))
    padded = F.pad(rows, (0, 0, 2, 2), mode="reflect" if height >= 3 else "replicate")
    return sum(tap * padded[:, :, offset : offset + height] for offset, tap in enumerate(taps))


def noise(pixels: Tensor, widths: Tensor, sigma: float, random: SampleRandom) -> Tensor:
    """Gaussian noise of `sigma` (in units of full brightness) on every pixel."""
    return (pixels + sigma * random.normal(tuple(pixels.shape[1:]))).clamp_(0, 1)


# The pipeline, in the order it is applied: a fork adds an augmentation with one entry here (its config
# key comes with it). Rotation and shear in degrees; shifts and scales as fractions of the image; blur
# sigma in pixels; noise sigma in units of full brightness.
AUGMENTATIONS = (
    AugmentationStep(
        "affine",
        probability={"none": 0.0, "light": 0.3, "strong": 0.6},
        strength={
            "light": {"degrees": 2, "shear": 6, "scale": (0.9, 1.05), "translate": (0.02, 0.05)},
            "strong": {"degrees": 4, "shear": 12, "scale": (0.8, 1.1), "translate": (0.03, 0.1)},
        },
        apply=affine,
    ),
    AugmentationStep(
        "perspective",
        probability={"none": 0.0, "light": 0.2, "strong": 0.4},
        strength={"light": 0.15, "strong": 0.3},  # distortion
        apply=perspective,
    ),
    AugmentationStep(
        "color",
        probability={"none": 0.0, "light": 0.4, "strong": 0.7},
        strength={"light": {"brightness": 0.3, "contrast": 0.3}, "strong": {"brightness": 0.5, "contrast": 0.5}},
        apply=brightness_contrast,
    ),
    AugmentationStep("invert", probability={"none": 0.0, "light": 0.1, "strong": 0.2}, apply=invert),
    AugmentationStep(
        "blur",
        probability={"none": 0.0, "light": 0.2, "strong": 0.4},
        strength={"light": (0.1, 1.0), "strong": (0.1, 1.6)},  # sigma
        apply=blur,
    ),
    AugmentationStep(
        "noise",
        probability={"none": 0.0, "light": 0.2, "strong": 0.4},
        strength={"light": 0.03, "strong": 0.06},  # sigma
        apply=noise,
    ),
)
PROBABILITIES = {level: {step.name: step.probability[level] for step in AUGMENTATIONS} for level in LEVELS}


def repeat_last_column(pixels: Tensor, widths: Tensor) -> Tensor:
    """Each image's columns right of its own width replaced by its last one, as data.transforms pads them."""
    batch, channels, height, width = pixels.shape
    index = columns(pixels).minimum(widths.view(-1, 1, 1, 1) - 1).expand(batch, channels, height, width)
    return pixels.gather(3, index)


@dataclass(frozen=True)
class Augmentation:
    """`augmentation(pixels, widths, seeds)`: a batch of `[B, C, H, W]` float images in [0, 1], each `widths[i]`
    wide before its padding, transformed as `seeds[i]` draws."""

    level: str
    probabilities: dict[str, float]

    @classmethod
    def from_config(cls, level: str, overrides: dict[str, float | None]) -> Augmentation | None:
        """The level's probabilities with the overrides that are set; None when every one is 0."""
        probabilities = {
            name: value if (value := overrides.get(name)) is not None else PROBABILITIES[level][name]
            for name in PROBABILITIES[level]
        }
        return cls(level, probabilities) if any(probabilities.values()) else None

    def __call__(self, pixels: Tensor, widths: Tensor, seeds: Tensor) -> Tensor:
        widths, seeds = widths.to(pixels.device), seeds.to(pixels.device)
        chance = torch.tensor([self.probabilities[step.name] for step in AUGMENTATIONS], device=pixels.device)
        random = SampleRandom(seeds, stream=0)
        chosen = random.uniform((len(AUGMENTATIONS),)) < chance  # [B, steps]
        for number, step in enumerate(AUGMENTATIONS, start=1):
            # Only the samples that drew it: what a sample draws depends on its seed alone, so a subset
            # draws what it would in the whole batch, and a CPU does a transform's work only where it applies.
            index = chosen[:, number - 1].nonzero()[:, 0]
            if len(index):
                strength = step.strength_at(self.level)
                changed = step.apply(pixels[index], widths[index], strength, random.stream(number, index))
                pixels = pixels.index_copy(0, index, changed.to(pixels.dtype))
        return repeat_last_column(pixels, widths).clamp_(0, 1)
