"""Image decoding and resizing: encoded bytes -> a normalised `[C, H, W]` tensor."""
from __future__ import annotations

import io

import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torchvision.transforms.v2 import functional as TF


class ImageTransform:
    """Decode with Pillow, convert to the model's channels, resize to `height x width`, map to [-1, 1].

    With `keep_aspect`, the image is resized to `height` keeping its aspect ratio (at most `width`
    wide) and the right side is padded by repeating the last column, so narrow words are not
    stretched. Decoding errors propagate: the dataset decides what to do with a bad image.
    """

    def __init__(self, height: int, width: int, channels: int, keep_aspect: bool = False) -> None:
        self.height, self.width, self.keep_aspect = height, width, keep_aspect
        self.mode = "L" if channels == 1 else "RGB"
        self.output_shape = (channels, height, width)

    def __call__(self, image_bytes: bytes) -> Tensor:
        with Image.open(io.BytesIO(image_bytes)) as image:
            image = image.convert(self.mode)
        if self.keep_aspect:
            scaled_width = round(image.width * self.height / max(image.height, 1))
            target_width = min(self.width, max(1, scaled_width))
        else:
            target_width = self.width
        image = image.resize((target_width, self.height), Image.Resampling.BILINEAR)
        tensor = TF.pil_to_tensor(image)
        tensor = tensor.to(torch.float32).div_(127.5).sub_(1.0)  # [C, H, w] in [-1, 1]
        if target_width < self.width:
            tensor = F.pad(tensor, (0, self.width - target_width), mode="replicate")
        return tensor
