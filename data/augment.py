"""Training-time augmentation: torchvision's transforms.v2 on each decoded, resized image, as the data
loader reads it (in its workers, or in the training process with data.num_workers=0).

Each transform is one entry of AUGMENTATIONS: its name (the config key `augment.<name>`), how likely it
is at each level and how strong, and how it is built. A level (`data.augment`, one of LEVELS) sets the
probabilities and strengths; the `augment` section of the config overrides any probability. Every
sample draws from a generator seeded by its own seed (train.seed, the step and its place in the global
batch, see data.samplers), never from a process's global random state: a resumed run, a run on another
number of processes or workers, sees the same augmented images. Evaluation and prediction never augment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torchvision.transforms import v2

LEVELS = ("none", "light", "strong")  # data.augment: how likely and how strong every transform is
MAX_PIPELINES = 512  # built pipelines kept per process (about 25 kB each)


@dataclass(frozen=True)
class AugmentationStep:
    """One transform of the pipeline. `name` is its config key (`augment.<name>` overrides its
    probability); `probability` how likely it is at each level; `strength` how far it goes at the light
    and strong levels (level `none` with a probability overridden uses light's); `build(strength, fill,
    p)` the transform, applied with probability `p`, `fill` the colour of the corners geometry uncovers."""

    name: str
    probability: dict[str, float]
    build: Callable[[Any, list[float], float], v2.Transform]
    strength: dict[str, Any] = field(default_factory=dict)

    def strength_at(self, level: str) -> Any:
        """How far it goes at `level` (None for a transform that has no strength)."""
        return self.strength.get(level, self.strength.get("light"))


# The pipeline, in the order it is applied: a fork adds an augmentation with one entry here (its config
# key comes with it). Rotation and shear in degrees; shifts and scales as fractions of the image; blur
# sigma in pixels; noise sigma in units of full brightness.
AUGMENTATIONS = (
    # A small rotation, shear, scale and shift.
    AugmentationStep(
        "affine",
        probability={"none": 0.0, "light": 0.3, "strong": 0.6},
        strength={
            "light": {"degrees": 2, "shear": 6, "scale": (0.9, 1.05), "translate": (0.02, 0.05)},
            "strong": {"degrees": 4, "shear": 12, "scale": (0.8, 1.1), "translate": (0.03, 0.1)},
        },
        build=lambda strength, fill, p: v2.RandomApply(
            [
                v2.RandomAffine(
                    strength["degrees"],
                    translate=strength["translate"],
                    scale=strength["scale"],
                    shear=strength["shear"],
                    fill=fill,
                )
            ],
            p=p,
        ),
    ),
    AugmentationStep(
        "perspective",
        probability={"none": 0.0, "light": 0.2, "strong": 0.4},
        strength={"light": 0.15, "strong": 0.3},  # distortion
        build=lambda distortion, fill, p: v2.RandomPerspective(distortion, p=p, fill=fill),
    ),
    # Brightness and contrast.
    AugmentationStep(
        "color",
        probability={"none": 0.0, "light": 0.4, "strong": 0.7},
        strength={"light": {"brightness": 0.3, "contrast": 0.3}, "strong": {"brightness": 0.5, "contrast": 0.5}},
        build=lambda strength, fill, p: v2.RandomApply(
            [v2.ColorJitter(brightness=strength["brightness"], contrast=strength["contrast"])], p=p
        ),
    ),
    # Light text on dark.
    AugmentationStep(
        "invert",
        probability={"none": 0.0, "light": 0.1, "strong": 0.2},
        build=lambda strength, fill, p: v2.RandomInvert(p=p),
    ),
    AugmentationStep(
        "blur",
        probability={"none": 0.0, "light": 0.2, "strong": 0.4},
        strength={"light": (0.1, 1.0), "strong": (0.1, 1.6)},  # sigma
        build=lambda sigma, fill, p: v2.RandomApply([v2.GaussianBlur(5, sigma=sigma)], p=p),
    ),
    AugmentationStep(
        "noise",
        probability={"none": 0.0, "light": 0.2, "strong": 0.4},
        strength={"light": 0.03, "strong": 0.06},  # sigma
        build=lambda sigma, fill, p: v2.RandomApply([v2.GaussianNoise(sigma=sigma)], p=p),
    ),
)
PROBABILITIES = {level: {step.name: step.probability[level] for step in AUGMENTATIONS} for level in LEVELS}


@dataclass(frozen=True)
class Augmentation:
    """`augmentation(pixels, seed)`: `[C, H, W]` float images in [0, 1], transformed as `seed` draws."""

    level: str
    probabilities: dict[str, float]
    # Pipelines by fill colour. Building one costs more than applying it (0.1 ms an image, in the loop
    # on a 2-core CPU) and a grey image's fill is one of 256 values; the transforms draw nothing when built.
    pipelines: dict[tuple[float, ...], v2.Compose] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_config(cls, level: str, overrides: dict[str, float | None]) -> Augmentation | None:
        """The level's probabilities with the overrides that are set; None when every one is 0."""
        probabilities = {
            name: value if (value := overrides.get(name)) is not None else PROBABILITIES[level][name]
            for name in PROBABILITIES[level]
        }
        return cls(level, probabilities) if any(probabilities.values()) else None

    def __call__(self, pixels: Tensor, seed: int) -> Tensor:
        # Corners that geometry uncovers take the image's border colour: black corners would be a
        # shape the model never meets in real crops.
        border = torch.cat([pixels[:, 0], pixels[:, -1], pixels[:, :, 0], pixels[:, :, -1]], dim=1)
        fill = tuple(border.median(dim=1).values.tolist())
        pipeline = self.pipeline(fill)
        # v2 draws from torch's default CPU generator: seeded here for this sample, and given back its
        # state after, so the caller's (the main process's or a worker's) random stream is untouched.
        # (The generator's own methods: torch.manual_seed would cost a millisecond of stack capture.)
        generator = torch.default_generator
        state = generator.get_state()
        generator.manual_seed(seed)
        try:
            return pipeline(pixels).clamp_(0, 1)
        finally:
            generator.set_state(state)

    def pipeline(self, fill: tuple[float, ...]) -> v2.Compose:
        """The transforms with geometry's fill colour `fill`, built on its first use (at most MAX_PIPELINES
        kept: a colour image's fills are many)."""
        if (pipeline := self.pipelines.get(fill)) is None:
            if len(self.pipelines) >= MAX_PIPELINES:
                self.pipelines.clear()
            steps = [
                step.build(step.strength_at(self.level), list(fill), self.probabilities[step.name])
                for step in AUGMENTATIONS
            ]
            pipeline = self.pipelines[fill] = v2.Compose(steps)
        return pipeline
