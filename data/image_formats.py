"""The image formats the project reads, and the one place encoded images are opened (`open_image`).

Pillow, asked to open bytes, tries every format it knows, and some of them are no pictures of words: an
EPS or PostScript file is a program Pillow hands to Ghostscript, and the readers without a signature
(TGA, IM, SPIDER, ...) take bytes of any kind for theirs. Training, evaluation, prediction and the data
tools open the raster formats word crops come in, and name any other: the benchmarks hold PNG and JPEG,
scripts/make_synthetic.py writes JPEG, cameras and scanners JPEG and TIFF (docs/data.md).
"""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image, UnidentifiedImageError

# The most common first: Pillow tries them in this order, each by a look at the first bytes. "PPM" is
# Pillow's reader of the whole Netpbm family (PBM, PGM, PPM, PNM); "JPEG" reads the JPEGs of cameras that
# hold several pictures (MPO) too.
READ_FORMATS = ("PNG", "JPEG", "TIFF", "WEBP", "BMP", "GIF", "PPM")
READ_FORMAT_NAMES = "PNG, JPEG, TIFF, WebP, BMP, GIF and PBM/PGM/PPM"


class FormatNotRead(ValueError):
    """An image in a format Pillow knows and the project does not read (EPS, PSD, ICO, ...)."""

    def __init__(self, image_format: str) -> None:
        super().__init__(
            f"{image_format} images are not read, only {READ_FORMAT_NAMES}: convert it to PNG (or JPEG for photos)"
        )
        self.image_format = image_format


def open_image(source: bytes | str | Path) -> Image.Image:
    """An encoded image (its bytes, or a file) opened lazily, as Pillow opens it, in one of READ_FORMATS.
    Raises FormatNotRead for one of another format Pillow knows, naming it; UnidentifiedImageError (as
    Image.open does) for bytes no format claims."""
    file = io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else source
    try:
        return Image.open(file, formats=READ_FORMATS)
    except UnidentifiedImageError:
        if isinstance(file, io.BytesIO):
            prefix = file.getvalue()[:16]
        else:
            with open(file, "rb") as opened:
                prefix = opened.read(16)
        other = other_format(prefix)
        if other is None:
            raise
        raise FormatNotRead(other) from None


def other_format(prefix: bytes) -> str | None:
    """The format outside READ_FORMATS whose signature `prefix` (a file's first 16 bytes) holds, if one
    does; only the signature checks run, no reader (no Ghostscript for an EPS)."""
    Image.init()  # every plugin registered: imports, once per process
    for image_format in Image.ID:
        accept = Image.OPEN[image_format][1]
        if image_format in READ_FORMATS or accept is None:
            continue
        try:
            claimed = accept(prefix)
        except Exception:  # a check that reads past a short prefix
            continue
        if claimed and not isinstance(claimed, str):  # text: Pillow's warning of a variant it cannot read
            return image_format
    return None


def frame_count(image_bytes: bytes) -> int:
    """How many frames (pages, for a TIFF) an encoded image holds: 1 for most. Training, evaluation and
    prediction read the first; the data tools name images of more (docs/data.md)."""
    with open_image(image_bytes) as image:
        return getattr(image, "n_frames", 1)
