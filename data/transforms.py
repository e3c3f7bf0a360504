"""Image preprocessing: encoded bytes -> a normalised `[C, H, W]` tensor, from one recorded description.

`Preprocessing` lists every choice that turns an image file into the model's input. Training builds
it from the config and stores it in every checkpoint; evaluation, prediction and export rebuild the
transform from the checkpoint's record, so a change of a default in code never silently changes
what an older checkpoint is fed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import ExifTags, Image, ImageOps
from torch import Tensor

from data.augment import Augmentation
from data.image_formats import open_image
from data.opencv_resize import resize_opencv_linear
from utils.checks import not_one_of, out_of_range

SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N")
WIDE_MODES = (*SIXTEEN_BIT_MODES, "I", "F")  # 32-bit integer and float: read by wide_to_8bit too
INTEGER_RANGES = (255, 65535, 2**31 - 1)  # the white of an `I` (signed 32-bit) image: the first its values fit in
SIDEWAYS = (5, 6, 7, 8)  # EXIF orientations that turn the image by 90 degrees: width and height swap
INTERPOLATIONS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
    "opencv_linear": None,  # cv2.resize's INTER_LINEAR (data/opencv_resize.py): what EasyOCR's models were fed
}
COLORS = {"L": 1, "RGB": 3}  # Pillow's modes: "L" is ITU-R 601-2 luma (0.299 R + 0.587 G + 0.114 B)
PADDINGS = ("replicate",)  # keep_aspect fills the right side by repeating the last column
CHOICES = {"color": COLORS, "interpolation": INTERPOLATIONS, "padding": PADDINGS}  # each field's table
# The range of each number (lowest, highest; each value of mean and std): what the model and torchvision
# take. NaN and infinity are refused too.
LARGEST_SIDE = 65535  # pixels of the model's input, each way: a line of ~2,000 characters at height 32
RANGES = {
    "height": (1, math.inf),
    "width": (1, math.inf),
    "max_stretch": (1, math.inf),
    "mean": (-1e3, 1e3),
    "std": (1e-6, 1e3),
}
# The run config's data.* key of each field, the one mapping both ways (Preprocessing.from_config and
# config_values). The colour is model.in_channels, through COLORS; the padding has no key (every run's
# is replicate).
DATA_KEYS = {
    "height": "img_height",
    "width": "img_width",
    "keep_aspect": "keep_aspect",
    "max_stretch": "max_stretch",
    "interpolation": "interpolation",
    "mean": "mean",
    "std": "std",
}


class PreprocessingError(ValueError):
    pass


@dataclass(frozen=True)
class Preprocessing:
    """How an image becomes the model's input: decode, convert to `color`, resize to `height` (and
    `width`, or keeping the aspect ratio up to `width`, stretched by at most `max_stretch`), pad the
    right side, normalise.

    Normalisation is torchvision's: `(pixels / 255 - mean) / std` per channel (one value: every
    channel). The default maps pixels to [-1, 1].
    """

    height: int
    width: int
    color: str = "L"
    keep_aspect: bool = False
    max_stretch: float = 1.0
    interpolation: str = "bilinear"
    mean: tuple[float, ...] = (0.5,)
    std: tuple[float, ...] = (0.5,)
    padding: str = "replicate"

    def __post_init__(self) -> None:
        problems = preprocessing_problems(vars(self), name=str)
        if problems:
            raise PreprocessingError("; ".join(problems))

    @property
    def channels(self) -> int:
        return COLORS.get(self.color, 0)

    @classmethod
    def from_config(cls, config: Any) -> Preprocessing:
        """The preprocessing a run's config asks for: its data.* keys (DATA_KEYS) and model.in_channels. A value
        that cannot be applied is an error naming its key: the one check of these keys, which
        training.config.validate runs."""
        modes = {channels: mode for mode, channels in COLORS.items()}
        problem = not_one_of("model.in_channels", config.model.in_channels, tuple(modes))
        if problem:
            raise PreprocessingError(problem)
        values = {item.name: item.default for item in dataclasses.fields(cls)}  # padding: a run has no choice
        values.update({field: getattr(config.data, key) for field, key in DATA_KEYS.items()})
        values.update(color=modes[config.model.in_channels], mean=tuple(values["mean"]), std=tuple(values["std"]))
        keys = {field: f"data.{key}" for field, key in DATA_KEYS.items()}
        problems = [
            *preprocessing_problems(values, name=lambda field: keys.get(field, field)),
            *oversized(values, name=lambda field: keys.get(field, field)),
        ]
        if problems:
            raise PreprocessingError("; ".join(problems))
        return cls(**values)

    def config_values(self) -> dict[str, Any]:
        """The data.* keys (plain values, as in a YAML file) that from_config reads back as this
        preprocessing, with a model.in_channels of `channels`."""
        record = self.to_dict()
        return {key: record[field] for field, key in DATA_KEYS.items()}

    def to_dict(self) -> dict[str, Any]:
        """Plain values, as a checkpoint or an export's metadata stores them."""
        record = dataclasses.asdict(self)
        record["mean"], record["std"] = list(self.mean), list(self.std)
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any], source: str) -> Preprocessing:
        """The record a checkpoint holds; a key this version does not know is an error, not ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(record) - known)
        if unknown:
            raise PreprocessingError(
                f"{source}: its preprocessing has steps this version cannot apply: {unknown}; "
                f"use the version of the project that wrote it"
            )
        try:
            values = {**record, "mean": tuple(record.get("mean", (0.5,))), "std": tuple(record.get("std", (0.5,)))}
            return cls(**values)
        except (TypeError, PreprocessingError) as error:
            raise PreprocessingError(f"{source}: its preprocessing record is not usable: {error}") from None


def oversized(values: dict[str, Any], name: Callable[[str], str]) -> list[str]:
    """A side above LARGEST_SIDE in a preprocessing someone gives (a run's config, a checkpoint's record),
    each named as `name` says. Not a check of every Preprocessing: those made from one (a long crop read
    in pieces, up to 32 widths) may be wider."""
    return [
        f"{name(field)}={values[field]}: must be at most {LARGEST_SIDE} (the most a JPEG stores; every image would"
        f" be resized to it, and an evaluation batch that large takes gigabytes)"
        for field in ("height", "width")
        if isinstance(values.get(field), (int, float)) and values[field] > LARGEST_SIDE
    ]


def preprocessing_problems(values: dict[str, Any], name: Callable[[str], str]) -> list[str]:
    """Why a preprocessing of these field values cannot be applied, each problem naming its field as `name`
    says (the config key, or the field itself for a checkpoint's record); [] when it can. The one check of
    a preprocessing, whether it comes from a run's config or from a checkpoint."""
    problems = [not_one_of(name(field), values[field], tuple(table)) for field, table in CHOICES.items()]
    for field, (lowest, highest) in RANGES.items():
        value = values[field]
        if isinstance(value, (tuple, list)):
            problems += [out_of_range(f"{name(field)}[{i}]", item, lowest, highest) for i, item in enumerate(value)]
        else:
            problems.append(out_of_range(name(field), value, lowest, highest))
    channels = COLORS.get(values["color"])
    for field in ("mean", "std"):
        if channels and len(values[field]) not in (1, channels):
            problems.append(f"{name(field)}={list(values[field])}: give 1 value, or one per channel ({channels})")
    return [problem for problem in problems if problem]


def decode_image(image_bytes: bytes, mode: str) -> Image.Image:
    """Encoded bytes as a viewer shows them, in the 8-bit `mode` ("L" or "RGB"): turned upright as
    their EXIF orientation says (phone photos are stored sideways), wide modes scaled, transparency
    made white. The one decoder of training, evaluation, prediction and the data tools' checks; it reads
    data.image_formats.READ_FORMATS alone, and the first frame of an image of several."""
    with open_image(image_bytes) as image:
        # In place: no copy of the pixels when there is nothing to turn, the usual case. It reads EXIF
        # that is already parsed, or, in a PNG, that decoding the pixels (needed anyway) finds.
        ImageOps.exif_transpose(image, in_place=True)
        return to_8bit(image, mode)


def to_8bit(image: Image.Image, mode: str) -> Image.Image:
    """`image` in the 8-bit `mode` ("L" or "RGB") as a viewer shows it: wide modes scaled by the range
    their values need (wide_to_8bit), transparency made white."""
    if image.mode in WIDE_MODES:
        image = wide_to_8bit(image)
    elif "A" in image.getbands() or "transparency" in image.info:  # RGBA, LA, PA, P or L with tRNS
        # Transparent pixels hold arbitrary colour, usually black: dropping alpha would put dark
        # text on black. Text is read off paper, so composite onto white.
        image = Image.alpha_composite(Image.new("RGBA", image.size, "white"), image.convert("RGBA"))
    return image.convert(mode)


def wide_to_8bit(image: Image.Image) -> Image.Image:
    """A grey image of more than 8 bits as 8 bits. Pillow's convert("L") clips at 255: a 16-bit scan
    brighter than 0.4 % turns white, and a float image of 0..1 black. The rule, as image viewers read
    these files: 16-bit modes span 0..65535; a 32-bit integer (`I`) image spans the range its values
    need, 0..255, 0..65535 or 0..2**31-1 (it is how Pillow opens 8- and 16-bit files of several
    formats too); a float (`F`) image spans 0..1 where its values fit in it, and is otherwise read
    as integers. Negative values and NaN are black."""
    pixels = np.nan_to_num(np.asarray(image, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    brightest = pixels.max(initial=0.0)
    if image.mode == "F" and brightest <= 1:
        white = 1.0
    elif image.mode in ("I", "F"):
        white = min((limit for limit in INTEGER_RANGES if brightest <= limit), default=INTEGER_RANGES[-1])
    else:  # a 16-bit mode
        white = 65535.0
    return Image.fromarray((pixels * (255 / white)).clip(0, 255).round().astype(np.uint8))


class ImageTransform:
    """Decode with Pillow and apply a `Preprocessing`: encoded bytes -> `[C, H, W]` float32.

    With `keep_aspect`, the image is resized to `height` keeping its aspect ratio, then widened by up to
    `max_stretch` times (at most `width` wide), and the right side is padded by repeating the last
    column, so narrow words are not stretched (or only so far). `width_step` (evaluation) pads only up
    to the next multiple of it instead of to `width`: images of one padded width are then batched
    together and a narrow word costs less. Training takes the uint8 pixels (`to_uint8`) and leaves
    augmentation and normalisation to the device (DeviceTransform). Decoding errors propagate: the
    dataset decides what to do with a bad image.
    """

    def __init__(self, preprocessing: Preprocessing, width_step: int = 0) -> None:
        self.preprocessing = preprocessing
        self.height, self.width, self.keep_aspect = preprocessing.height, preprocessing.width, preprocessing.keep_aspect
        self.max_stretch = preprocessing.max_stretch
        self.width_step = width_step
        self.mode = preprocessing.color
        self.resample = INTERPOLATIONS[preprocessing.interpolation]
        channels = preprocessing.channels
        self.output_shape = (channels, self.height, self.width)  # the widest image; every image without width_step
        # (pixels / 255 - mean) / std, as pixels / (255 std) - mean / std: for the default 0.5 and 0.5
        # that is pixels / 127.5 - 1, the same floats as before the record existed.
        std = torch.tensor(preprocessing.std, dtype=torch.float64).expand(channels)
        mean = torch.tensor(preprocessing.mean, dtype=torch.float64).expand(channels)
        self.divisor = (255 * std).float().view(-1, 1, 1)
        self.shift = (mean / std).float().view(-1, 1, 1)

    def resized_width(self, width: int, height: int) -> int:
        """The width an image of `width x height` pixels is resized to, before padding."""
        if not self.keep_aspect:
            return self.width
        return min(self.width, max(1, round(self.max_stretch * width * self.height / max(height, 1))))

    def padded_width(self, width: int, height: int) -> int:
        """The width of this transform's output for an image of `width x height` pixels."""
        if not self.width_step:
            return self.width
        return min(self.width, -(-self.resized_width(width, height) // self.width_step) * self.width_step)

    def decode(self, image_bytes: bytes) -> Image.Image:
        """The image in the record's colour mode, at its own size, upright."""
        return decode_image(image_bytes, self.mode)

    def __call__(self, image_bytes: bytes) -> Tensor:
        return self.to_tensor(self.decode(image_bytes))

    def resize(self, image: Image.Image) -> Tensor:
        """A decoded image (in the record's mode) resized: `[C, H, w]` uint8, not yet padded."""
        size = (self.resized_width(image.width, image.height), self.height)
        if self.resample is None:
            pixels = resize_opencv_linear(np.asarray(image), *size)
        else:  # np.array rather than torchvision's pil_to_tensor: a third of this call's time less, the same bytes
            pixels = np.array(image.resize(size, self.resample))
        return torch.from_numpy(pixels.reshape(*pixels.shape[:2], -1)).permute(2, 0, 1)

    def to_tensor(self, image: Image.Image) -> Tensor:
        """A decoded image (in the record's mode) resized, normalised and padded: `[C, H, W]` float32."""
        pixels = self.resize(image)
        return pad_right(self.normalize(pixels.to(torch.float32)), self.padded_width(image.width, image.height))

    def to_uint8(self, image: Image.Image) -> tuple[Tensor, int]:
        """A decoded image resized and padded to `width`, as training's workers hand it over: `[C, H, W]`
        uint8, and its width before padding (what augmentation treats as the image)."""
        pixels = self.resize(image)
        return pad_right(pixels, self.width), pixels.shape[-1]

    def normalize(self, pixels: Tensor) -> Tensor:
        """`[..., C, H, W]` floats of 0..255, on any device, normalised as the preprocessing says."""
        divisor, shift = self.divisor.to(pixels.device), self.shift.to(pixels.device)
        return pixels.div_(divisor).sub_(shift)

    def to_image(self, tensor: Tensor) -> Image.Image:
        """A `[C, H, W]` model input back as a PIL image (to show what the model saw)."""
        pixels = (tensor.detach().float().cpu() + self.shift) * self.divisor
        pixels = pixels.round().clamp(0, 255).byte()
        return Image.fromarray(pixels[0].numpy() if pixels.shape[0] == 1 else pixels.permute(1, 2, 0).numpy())


class DeviceTransform:
    """The training half that runs on the device, on whole batches: uint8 pixels from the loader (decoded,
    resized and padded by ImageTransform.to_uint8 in its workers) augmented as each sample's seed draws,
    then normalised. Batched tensor operations cost a GPU little, where the same work per image in the
    workers would need many more CPU cores to keep it fed (docs/performance.md)."""

    def __init__(self, transform: ImageTransform, augmentation: Augmentation | None) -> None:
        self.transform, self.augmentation = transform, augmentation

    def __call__(self, pixels: Tensor, widths: Tensor, seeds: Tensor) -> Tensor:
        """`[B, C, H, W]` uint8 pixels (already on the device), each `widths[i]` wide before its padding,
        as the model's float input."""
        if self.augmentation is None:
            return self.transform.normalize(pixels.to(torch.float32))
        augmented = self.augmentation(pixels.to(torch.float32).div_(255), widths, seeds)
        return self.transform.normalize(augmented.mul_(255))


def pad_right(images: Tensor, width: int) -> Tensor:
    """`[C, H, w]` or `[B, C, H, w]` images widened to `width` by repeating their last column."""
    if images.shape[-1] >= width:
        return images
    # (left, right, top, bottom): replicate padding of the last dimension alone is refused for 4-D input.
    return F.pad(images, (0, width - images.shape[-1], 0, 0), mode="replicate")


def image_size(image_bytes: bytes) -> tuple[int, int]:
    """(width, height) of an encoded image as decode_image turns it upright, from its header alone."""
    with open_image(image_bytes) as image:
        width, height = image.size
        return (height, width) if header_orientation(image, image_bytes) in SIDEWAYS else (width, height)


def header_orientation(image: Image.Image, image_bytes: bytes) -> int:
    """The EXIF orientation decode_image applies to `image` (opened from `image_bytes`), without decoding it."""
    if image.format == "TIFF":  # Pillow's TIFF reader turns the image upright itself, its size included
        return 1
    if image.format == "PNG" and b"eXIf" not in image_bytes:  # else Pillow would decode the pixels to look
        return 1
    return image.getexif().get(ExifTags.Base.Orientation, 1)


def build_transform(config: Any, preprocessing: Preprocessing | None = None, train: bool = False) -> ImageTransform:
    """The one place a run's config makes a transform: `preprocessing` (default: the config's own; for
    evaluation, prediction and export the checkpoint's record, which training.checkpoint.load_model returns
    with the checkpoint's config), padded to data.eval_width_step unless it is for training."""
    preprocessing = preprocessing or Preprocessing.from_config(config)
    return ImageTransform(preprocessing, 0 if train else config.data.eval_width_step)


def build_device_transform(config: Any, transform: ImageTransform) -> DeviceTransform:
    """Training's device half for `transform`: data.augment and the `augment` section. Validation,
    eval.sh, predict.py and export.py never augment."""
    augmentation = Augmentation.from_config(config.data.augment, dataclasses.asdict(config.augment))
    return DeviceTransform(transform, augmentation)
