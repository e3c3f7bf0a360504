"""What text is written on: procedural backgrounds of several styles, and photos.

Every style paints an RGB float array of a given size in a light or a dark tone (the text then takes
the other). The styles in HELD_OUT_STYLES are painted for the test split only. Photos come from a
`--backgrounds` folder and from the sample photos scikit-image ships (`package_photos`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from typing import TypeVar

import numpy as np
from PIL import Image

from data.image_formats import open_image

T = TypeVar("T")

TRAIN_STYLES = ("flat", "gradient", "noise", "blotches", "stripes")
HELD_OUT_STYLES = ("paper", "grid", "dots")
PHOTO = "photo"  # a crop of a photo file; the files are split between train/val and test
# The sample photos in scikit-image's wheel (skimage/data; requirements-synthetic.txt pins the version),
# each public domain or CC0 by its docstring in skimage/data/_fetchers.py. Left out: those showing words
# (text, page, logo), which would be unlabelled text, and the drawings, microscopy and tiny ones.
PACKAGE_PHOTOS = (
    "astronaut.png",
    "brick.png",
    "camera.png",
    "chelsea.png",
    "clock_motion.png",
    "coffee.png",
    "coins.png",
    "grass.png",
    "gravel.png",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "rocket.jpg",
)


def base_color(rng: random.Random, light: bool) -> np.ndarray:
    """A colour of the tone asked for, gray half of the time."""
    low, high = (150, 255) if light else (0, 110)
    if rng.random() < 0.5:
        return np.full(3, rng.uniform(low, high), dtype=np.float32)
    color = np.array([rng.uniform(0, 255) for _ in range(3)], dtype=np.float32)
    target = rng.uniform(low, high)  # move the colour's luminance into the tone, keeping its hue
    return np.clip(color + (target - luminance(color)), 0, 255)


def luminance(color: np.ndarray) -> float | np.ndarray:
    # The weights Pillow's convert("L") uses, so contrast holds for models that read grayscale.
    return color[..., 0] * 0.299 + color[..., 1] * 0.587 + color[..., 2] * 0.114


def smooth_noise(noise: np.random.Generator, width: int, height: int, cells: int) -> np.ndarray:
    """Low-frequency noise in [-1, 1], [height, width]: a coarse random grid upsampled."""
    coarse = noise.uniform(-1, 1, (max(2, cells * height // max(width, 1) + 2), cells + 2)).astype(np.float32)
    return np.asarray(Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC))


def paint(
    style: str,
    rng: random.Random,
    noise: np.random.Generator,
    width: int,
    height: int,
    light: bool,
    photo: str | None = None,
) -> np.ndarray:
    """An RGB background `[height, width, 3]`, float32 in 0..255; style PHOTO crops the file `photo`."""
    base = base_color(rng, light)  # drawn for PHOTO too, unused there: without it, a seed's photo samples would change
    if style == PHOTO:
        canvas = photo_crop(photo, rng, width, height)
    elif style in PAINTERS:
        canvas = np.empty((height, width, 3), dtype=np.float32)
        canvas[:] = base
        PAINTERS[style](canvas, base, light, rng, noise)
    else:
        raise ValueError(f"unknown background style {style!r}")
    return np.clip(canvas, 0, 255)


def paint_flat(
    canvas: np.ndarray, base: np.ndarray, light: bool, rng: random.Random, noise: np.random.Generator
) -> None:
    """The base colour alone."""


def paint_gradient(
    canvas: np.ndarray, base: np.ndarray, light: bool, rng: random.Random, noise: np.random.Generator
) -> None:
    """A ramp at a random angle from the base colour to another of the same tone."""
    height, width = canvas.shape[:2]
    other = base_color(rng, light)
    angle = rng.uniform(0, np.pi)
    ramp = np.cos(angle) * np.linspace(0, 1, width)[None, :] + np.sin(angle) * np.linspace(0, 1, height)[:, None]
    ramp = (ramp - ramp.min()) / max(float(np.ptp(ramp)), 1e-6)
    canvas += ramp[..., None] * (other - base)


def paint_noise(
    canvas: np.ndarray, base: np.ndarray, light: bool, rng: random.Random, noise: np.random.Generator
) -> None:
    """Gaussian noise, gray most of the time, else coloured."""
    height, width = canvas.shape[:2]
    canvas += noise.normal(0, rng.uniform(8, 30), (height, width, 1 if rng.random() < 0.7 else 3))


def paint_blotches(
    canvas: np.ndarray, base: np.ndarray, light: bool, rng: random.Random, noise: np.random.Generator
) -> None:
    """Soft stains, darker on a light background and lighter on a dark one."""
    height, width = canvas.shape[:2]
    amplitude = rng.uniform(15, 45)
    canvas += smooth_noise(noise, width, height, rng.randint(2, 8))[..., None] * amplitude * (1 if light else -1)


def paint_stripes(
    canvas: np.ndarray, base: np.ndarray, light: bool, rng: random.Random, noise: np.random.Generator
) -> None:
    """A sine wave at a random angle and period."""
    height, width = canvas.shape[:2]
    angle, period = rng.uniform(0, np.pi), rng.uniform(3, 24)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    wave = np.sin((x * np.cos(angle) + y * np.sin(angle)) * 2 * np.pi / period)
    canvas += wave[..., None] * rng.uniform(8, 35)


def paint_paper(
    canvas: np.ndarray, base: np.ndarray, light: bool, rng: random.Random, noise: np.random.Generator
) -> None:
    """Light, warm and fibrous, whatever the tone asked for: the held-out look of print on paper."""
    height, width = canvas.shape[:2]
    canvas[:] = np.array([rng.uniform(215, 250), rng.uniform(205, 240), rng.uniform(180, 225)], dtype=np.float32)
    canvas += smooth_noise(noise, width, height, rng.randint(3, 10))[..., None] * rng.uniform(4, 14)
    canvas += noise.normal(0, rng.uniform(2, 7), (height, width, 1))
    for _ in range(rng.randint(0, 6)):  # fibres
        x0, y0 = rng.uniform(0, width), rng.uniform(0, height)
        length, angle = rng.uniform(5, 30), rng.uniform(0, np.pi)
        steps = np.linspace(0, length, int(length) + 1)
        xs = np.clip((x0 + steps * np.cos(angle)).astype(int), 0, width - 1)
        ys = np.clip((y0 + steps * np.sin(angle)).astype(int), 0, height - 1)
        canvas[ys, xs] -= rng.uniform(10, 30)


def paint_grid(
    canvas: np.ndarray, base: np.ndarray, light: bool, rng: random.Random, noise: np.random.Generator
) -> None:
    """Ruled or squared paper."""
    line = base_color(rng, not light) * 0.4 + base * 0.6
    period = rng.randint(6, 18)
    offset = rng.randint(0, period - 1)
    canvas[offset::period, :] = line
    if rng.random() < 0.5:
        canvas[:, rng.randint(0, period - 1) :: period] = line


def paint_dots(
    canvas: np.ndarray, base: np.ndarray, light: bool, rng: random.Random, noise: np.random.Generator
) -> None:
    """A halftone screen."""
    height, width = canvas.shape[:2]
    period, radius = rng.uniform(2.5, 6), rng.uniform(0.25, 0.45)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    near = np.hypot((x % period) - period / 2, (y % period) - period / 2) < radius * period
    canvas[near] += rng.uniform(20, 50) * (-1 if light else 1)


# A procedural style paints over `canvas` ([height, width, 3] float32, filled with the base colour) in place;
# paint() clips the result to 0..255.
Painter = Callable[[np.ndarray, np.ndarray, bool, random.Random, np.random.Generator], None]
PAINTERS: dict[str, Painter] = {
    "flat": paint_flat,
    "gradient": paint_gradient,
    "noise": paint_noise,
    "blotches": paint_blotches,
    "stripes": paint_stripes,
    "paper": paint_paper,
    "grid": paint_grid,
    "dots": paint_dots,
}


def package_photos() -> list[str]:
    """The files of PACKAGE_PHOTOS in the installed scikit-image, in that order; [] without it. Found, not
    imported: importing skimage would load scipy in every worker for a few PNG files."""
    spec = find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    return [str(folder / name) for name in PACKAGE_PHOTOS if (folder / name).is_file()]


@lru_cache(maxsize=64)
def load_photo(path: str) -> Image.Image:
    image = check_photo(path, lambda image: image.convert("RGB"))
    image.thumbnail((800, 800))  # a text line needs a few hundred pixels of it at most
    return image


def check_photo(path: str, read: Callable[[Image.Image], T]) -> T:
    """`read` applied to the opened photo at `path`; a photo Pillow cannot read (no image, cut short) is
    an error naming it, not Pillow's message about an unnamed file."""
    try:
        with open_image(path) as image:  # the formats training reads: no EPS handed to Ghostscript
            return read(image)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise ValueError(
            f"background photo {path} cannot be read ({error}); remove it from the --backgrounds folder"
            " (one of scikit-image's: reinstall scikit-image, or pass --no-package-photos)"
        ) from None


def photo_crop(path: str, rng: random.Random, width: int, height: int) -> np.ndarray:
    """A random crop of the photo at `path`, scaled to cover `width x height`."""
    photo = load_photo(path)
    scale = max(width / photo.width, height / photo.height) * rng.uniform(1.0, 2.5)
    crop_width, crop_height = min(photo.width, round(width / scale) + 1), min(photo.height, round(height / scale) + 1)
    left, top = rng.randint(0, photo.width - crop_width), rng.randint(0, photo.height - crop_height)
    crop = photo.crop((left, top, left + crop_width, top + crop_height))
    crop = crop.resize((width, height), Image.Resampling.BILINEAR)
    return np.asarray(crop, dtype=np.float32)
