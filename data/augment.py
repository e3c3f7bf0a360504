"""Training-time augmentation: plain tensor operations on each decoded, resized image, as the data loader
reads it (in its workers, or in the training process with data.num_workers=0).

Each transform is one entry of AUGMENTATIONS: its name (the config key `augment.<name>`), how likely it
is at each level and how strong, and the function that applies it. A level (`data.augment`, one of
LEVELS) sets the probabilities and strengths; the `augment` section of the config overrides any
probability. Every sample draws from a generator seeded by its own seed (train.seed, the step and its
place in the global batch, see data.samplers), never from a process's global random state: a resumed
run, a run on another number of processes or workers, sees the same augmented images. Evaluation and
prediction never augment.

Written with torch's own operations rather than torchvision's transforms.v2: on a 32x128 image the
per-call machinery of v2 cost more than the arithmetic, and a 2-core CPU pays it inside the training
step (docs/performance.md).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.transforms.v2 import functional as TF

LEVELS = ("none", "light", "strong")  # data.augment: how likely and how strong every transform is


@dataclass(frozen=True)
class AugmentationStep:
    """One transform of the pipeline. `name` is its config key (`augment.<name>` overrides its
    probability); `probability` how likely it is at each level; `strength` how far it goes at the light
    and strong levels (level `none` with a probability overridden uses light's); `apply(pixels, strength,
    generator)` the transform: `pixels` `[C, H, W]` in [0, 1], `generator` the sample's own source of every
    random draw. A geometric one builds its homography and calls `warp`."""

    name: str
    probability: dict[str, float]
    apply: Callable[[Tensor, Any, torch.Generator], Tensor]
    strength: dict[str, Any] = field(default_factory=dict)

    def strength_at(self, level: str) -> Any:
        """How far it goes at `level` (None for a transform that has no strength)."""
        return self.strength.get(level, self.strength.get("light"))


def uniform(generator: torch.Generator, low: float, high: float) -> float:
    """One number drawn evenly from [low, high)."""
    return low + (high - low) * torch.rand((), generator=generator, dtype=torch.float64).item()


Matrix = tuple[tuple[float, float, float], tuple[float, float, float], tuple[float, float, float]]


@functools.lru_cache(maxsize=512)
def pixel_centres(height: int, width: int) -> Tensor:
    """`[H, W, 3]`: each pixel's centre (x + 0.5, y + 0.5, 1), as homographies take it."""
    ys, xs = torch.meshgrid(torch.arange(height) + 0.5, torch.arange(width) + 0.5, indexing="ij")
    return torch.stack([xs, ys, torch.ones_like(xs)], dim=-1)


def warp(pixels: Tensor, to_source: Matrix) -> Tensor:
    """`pixels` resampled (bilinear) through `to_source`, the 3x3 homography from an output pixel's
    coordinates (x right, y down, pixel centres at +0.5) to the input's. What falls outside takes the
    image's border colour: black corners would be a shape the model never meets in real crops."""
    _, height, width = pixels.shape
    border = torch.cat([pixels[:, 0], pixels[:, -1], pixels[:, :, 0], pixels[:, :, -1]], dim=1)
    fill = border.median(dim=1).values.view(-1, 1, 1)
    # Followed by the step from pixels to grid_sample's coordinates, which run from -1 to 1 across the image.
    to_grid = torch.tensor([[2 / width, 0, -1], [0, 2 / height, -1], [0, 0, 1]]) @ torch.tensor(
        to_source, dtype=torch.float32
    )
    points = pixel_centres(height, width) @ to_grid.T
    grid = points[..., :2] / points[..., 2:]
    # grid_sample pads with zeros: shifting by the fill first makes the padding the fill colour.
    shifted = F.grid_sample((pixels - fill)[None], grid[None], mode="bilinear", align_corners=False)
    return shifted[0] + fill


def affine(pixels: Tensor, strength: dict[str, Any], generator: torch.Generator) -> Tensor:
    """Rotate, shear (along x), scale and shift about the image's centre."""
    _, height, width = pixels.shape
    angle = math.radians(uniform(generator, -strength["degrees"], strength["degrees"]))
    shear = math.tan(math.radians(uniform(generator, -strength["shear"], strength["shear"])))
    scale = uniform(generator, *strength["scale"])
    shift_x = uniform(generator, -1, 1) * strength["translate"][0] * width
    shift_y = uniform(generator, -1, 1) * strength["translate"][1] * height
    # The image moves by p -> centre + shift + rotation @ shear_and_scale @ (p - centre); sampling needs the
    # way back: p = centre + (shear_and_scale)^-1 @ rotation^T @ (p' - centre - shift).
    cos, sin = math.cos(angle), math.sin(angle)
    back = ((cos + shear * sin) / scale, (sin - shear * cos) / scale), (-sin / scale, cos / scale)
    centre_x, centre_y = width / 2, height / 2
    origin_x, origin_y = centre_x + shift_x, centre_y + shift_y
    return warp(
        pixels,
        (
            (*back[0], centre_x - back[0][0] * origin_x - back[0][1] * origin_y),
            (*back[1], centre_y - back[1][0] * origin_x - back[1][1] * origin_y),
            (0.0, 0.0, 1.0),
        ),
    )


def homography(source: np.ndarray, target: np.ndarray) -> Matrix:
    """The 3x3 homography taking each of the four `source` points (`[4, 2]`) to its `target` point."""
    rows, values = [], []
    for (x, y), (u, v) in zip(source.tolist(), target.tolist()):
        rows += [[x, y, 1, 0, 0, 0, -u * x, -u * y], [0, 0, 0, x, y, 1, -v * x, -v * y]]
        values += [u, v]
    a, b, c, d, e, f, g, h = np.linalg.solve(np.array(rows), np.array(values)).tolist()
    return (a, b, c), (d, e, f), (g, h, 1.0)


def perspective(pixels: Tensor, distortion: float, generator: torch.Generator) -> Tensor:
    """Move each corner inwards by up to `distortion` of half the image's width and height, as if the
    word were seen at an angle."""
    _, height, width = pixels.shape
    corners = np.array([[0, 0], [width, 0], [width, height], [0, height]], dtype=np.float64)
    reach = np.array([[1, 1], [-1, 1], [-1, -1], [1, -1]]) * (np.array([width, height]) * distortion / 2)
    moved = corners + reach * torch.rand(4, 2, generator=generator, dtype=torch.float64).numpy()
    return warp(pixels, homography(moved, corners))


def brightness_contrast(pixels: Tensor, strength: dict[str, float], generator: torch.Generator) -> Tensor:
    """Scale the brightness, and the contrast about the image's mean grey, each by up to +-strength, in
    a random order."""
    brightness = uniform(generator, 1 - strength["brightness"], 1 + strength["brightness"])
    contrast = uniform(generator, 1 - strength["contrast"], 1 + strength["contrast"])
    contrast_first = uniform(generator, 0, 1) >= 0.5
    if contrast_first:
        pixels = adjust_contrast(pixels, contrast)
    pixels = (pixels * brightness).clamp_(0, 1)
    return pixels if contrast_first else adjust_contrast(pixels, contrast)


def adjust_contrast(pixels: Tensor, factor: float) -> Tensor:
    """Contrast scaled by `factor` about the image's mean grey (ITU-R 601 luma for colour images)."""
    grey = pixels if pixels.shape[0] == 1 else TF.rgb_to_grayscale(pixels)
    return (pixels * factor + (1 - factor) * grey.mean()).clamp_(0, 1)


def invert(pixels: Tensor, strength: None, generator: torch.Generator) -> Tensor:
    """Light text on dark."""
    return 1 - pixels


def blur(pixels: Tensor, sigma_range: tuple[float, float], generator: torch.Generator) -> Tensor:
    """A 5x5 Gaussian blur of a sigma drawn from `sigma_range`, edges mirrored."""
    sigma = uniform(generator, *sigma_range)
    taps = torch.exp(-(torch.arange(-2.0, 3.0) ** 2) / (2 * sigma**2))
    taps /= taps.sum()
    channels = pixels.shape[0]
    # Mirrored edges need 3 pixels a side; a crop resized to 1 or 2 pixels wide repeats its edge instead.
    padded = F.pad(pixels[None], (2, 2, 2, 2), mode="reflect" if min(pixels.shape[1:]) > 2 else "replicate")
    rows = F.conv2d(padded, taps.view(1, 1, 1, 5).expand(channels, 1, 1, 5), groups=channels)
    return F.conv2d(rows, taps.view(1, 1, 5, 1).expand(channels, 1, 5, 1), groups=channels)[0]


def noise(pixels: Tensor, sigma: float, generator: torch.Generator) -> Tensor:
    """Gaussian noise of `sigma` (in units of full brightness) on every pixel."""
    return (pixels + sigma * torch.randn(pixels.shape, generator=generator)).clamp_(0, 1)


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


@dataclass(frozen=True)
class Augmentation:
    """`augmentation(pixels, seed)`: `[C, H, W]` float images in [0, 1], transformed as `seed` draws."""

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

    def __call__(self, pixels: Tensor, seed: int) -> Tensor:
        generator = torch.Generator().manual_seed(seed)
        draws = torch.rand(len(AUGMENTATIONS), generator=generator, dtype=torch.float64).tolist()
        for step, draw in zip(AUGMENTATIONS, draws):
            if draw < self.probabilities[step.name]:
                pixels = step.apply(pixels, step.strength_at(self.level), generator)
        return pixels.clamp_(0, 1)
