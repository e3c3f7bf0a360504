"""Training-time augmentation: torchvision's transforms.v2 on each decoded, resized image, in the
data-loader workers.

A level (`data.augment`: none | light | strong) sets how likely each transform is and how strong;
the `augment` section of the config overrides any probability. Every sample draws from a generator
seeded by its own seed (train.seed, the step and its place in the global batch, see
data.samplers), never from a process's global random state: a resumed run, a run on another number
of processes or workers, sees the same augmented images. Evaluation and prediction never augment.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torchvision.transforms import v2

TRANSFORMS = ("affine", "perspective", "color", "invert", "blur", "noise")
PROBABILITIES = {
    "none": dict.fromkeys(TRANSFORMS, 0.0),
    "light": {"affine": 0.3, "perspective": 0.2, "color": 0.4, "invert": 0.1, "blur": 0.2, "noise": 0.2},
    "strong": {"affine": 0.6, "perspective": 0.4, "color": 0.7, "invert": 0.2, "blur": 0.4, "noise": 0.4},
}
# How far each transform goes at each level (rotation and shear in degrees; shifts and scales as
# fractions of the image; blur sigma in pixels; noise sigma in units of full brightness).
# Level `none` with a probability overridden uses light's.
STRENGTHS = {
    "light": {"degrees": 2, "shear": 6, "scale": (0.9, 1.05), "translate": (0.02, 0.05), "distortion": 0.15,
              "brightness": 0.3, "contrast": 0.3, "sigma": (0.1, 1.0), "noise": 0.03},
    "strong": {"degrees": 4, "shear": 12, "scale": (0.8, 1.1), "translate": (0.03, 0.1), "distortion": 0.3,
               "brightness": 0.5, "contrast": 0.5, "sigma": (0.1, 1.6), "noise": 0.06},
}
LEVELS = tuple(PROBABILITIES)


@dataclass(frozen=True)
class Augmentation:
    """`augmentation(pixels, seed)`: `[C, H, W]` float images in [0, 1], transformed as `seed` draws."""

    level: str
    probabilities: dict[str, float]

    @classmethod
    def from_config(cls, level: str, overrides: dict[str, float | None]) -> Augmentation | None:
        """The level's probabilities with the overrides that are set; None when every one is 0."""
        probabilities = {name: value if (value := overrides.get(name)) is not None else PROBABILITIES[level][name]
                         for name in TRANSFORMS}
        return cls(level, probabilities) if any(probabilities.values()) else None

    def __call__(self, pixels: Tensor, seed: int) -> Tensor:
        strength = STRENGTHS.get(self.level, STRENGTHS["light"])
        p = self.probabilities
        # Corners that geometry uncovers take the image's border colour: black corners would be a
        # shape the model never meets in real crops.
        border = torch.cat([pixels[:, 0], pixels[:, -1], pixels[:, :, 0], pixels[:, :, -1]], dim=1)
        fill = border.median(dim=1).values.tolist()
        pipeline = v2.Compose([
            v2.RandomApply([v2.RandomAffine(strength["degrees"], translate=strength["translate"], scale=strength["scale"],
                                            shear=strength["shear"], fill=fill)], p=p["affine"]),
            v2.RandomPerspective(strength["distortion"], p=p["perspective"], fill=fill),
            v2.RandomApply([v2.ColorJitter(brightness=strength["brightness"], contrast=strength["contrast"])],
                           p=p["color"]),
            v2.RandomInvert(p=p["invert"]),
            v2.RandomApply([v2.GaussianBlur(5, sigma=strength["sigma"])], p=p["blur"]),
            v2.RandomApply([v2.GaussianNoise(sigma=strength["noise"])], p=p["noise"]),
        ])
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
