"""Image decoding and resizing: encoded bytes -> a normalised `[C, H, W]` tensor."""
from __future__ import annotations

import io

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torchvision.transforms.v2 import functional as TF

SIXTEEN_BIT_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N")


def to_8bit(image: Image.Image, mode: str) -> Image.Image:
    """`image` in the 8-bit `mode` ("L" or "RGB"), with 16-bit depth scaled and transparency made white."""
    if image.mode in SIXTEEN_BIT_MODES:
        # Pillow's convert("L") clips 16-bit values at 255, so any scan brighter than 0.4 % turns white.
        scaled = np.asarray(image, dtype=np.float32) / 257  # 65535 -> 255
        image = Image.fromarray(scaled.clip(0, 255).round().astype(np.uint8))
    elif "A" in image.getbands() or "transparency" in image.info:  # RGBA, LA, PA, P or L with tRNS
        # Transparent pixels hold arbitrary colour, usually black: dropping alpha would put dark
        # text on black. Text is read off paper, so composite onto white.
        image = Image.alpha_composite(Image.new("RGBA", image.size, "white"), image.convert("RGBA"))
    return image.convert(mode)


class ImageTransform:
    """Decode with Pillow, convert to the model's channels, resize to `height x width`, map to [-1, 1].

    With `keep_aspect`, the image is resized to `height` keeping its aspect ratio (at most `width`
    wide) and the right side is padded by repeating the last column, so narrow words are not
    stretched. `width_step` (evaluation) pads only up to the next multiple of it instead of to
    `width`: images of one padded width are then batched together and a narrow word costs less.
    Decoding errors propagate: the dataset decides what to do with a bad image.
    """

    def __init__(self, height: int, width: int, channels: int, keep_aspect: bool = False, width_step: int = 0) -> None:
        self.height, self.width, self.keep_aspect, self.width_step = height, width, keep_aspect, width_step
        self.mode = "L" if channels == 1 else "RGB"
        self.output_shape = (channels, height, width)  # the widest image; every image without width_step

    def resized_width(self, width: int, height: int) -> int:
        """The width an image of `width x height` pixels is resized to, before padding."""
        if not self.keep_aspect:
            return self.width
        return min(self.width, max(1, round(width * self.height / max(height, 1))))

    def padded_width(self, width: int, height: int) -> int:
        """The width of this transform's output for an image of `width x height` pixels."""
        if not self.width_step:
            return self.width
        return min(self.width, -(-self.resized_width(width, height) // self.width_step) * self.width_step)

    def __call__(self, image_bytes: bytes) -> Tensor:
        with Image.open(io.BytesIO(image_bytes)) as image:
            image = to_8bit(image, self.mode)
        padded_width = self.padded_width(image.width, image.height)
        image = image.resize((self.resized_width(image.width, image.height), self.height), Image.Resampling.BILINEAR)
        tensor = TF.pil_to_tensor(image)
        tensor = tensor.to(torch.float32).div_(127.5).sub_(1.0)  # [C, H, w] in [-1, 1]
        return pad_right(tensor, padded_width)


def pad_right(images: Tensor, width: int) -> Tensor:
    """`[..., H, w]` images widened to `width` by repeating their last column."""
    if images.shape[-1] >= width:
        return images
    return F.pad(images, (0, width - images.shape[-1]), mode="replicate")


def image_size(image_bytes: bytes) -> tuple[int, int]:
    """(width, height) of an encoded image, from its header alone."""
    with Image.open(io.BytesIO(image_bytes)) as image:
        return image.size
