"""Pictures for people: images with captions in a grid, to look at samples instead of reading them.

Used by training (validation samples in TensorBoard), scripts/eval.py (--errors) and
scripts/inspect_lmdb.py (--montage). Torch-free.
"""

from __future__ import annotations

import subprocess
import unicodedata

from PIL import Image, ImageDraw, ImageFont

IMAGE_BOX = (304, 64)  # each image is scaled to fit this box, keeping its aspect ratio
PAD, LINE_HEIGHT, COLUMNS = 8, 18, 4


def caption_font(texts: list[str] = (), size: int = 14) -> ImageFont.ImageFont:
    """DejaVu Sans (it covers most scripts), the system's CJK font when `texts` hold CJK characters,
    else Pillow's built-in font."""
    candidates = ["DejaVuSans.ttf"]  # Pillow looks in the system's font folders
    if any(unicodedata.east_asian_width(char) in ("W", "F") for text in texts for char in text):
        try:
            candidates.insert(
                0,
                subprocess.run(
                    ["fc-match", "-f", "%{file}", ":lang=zh"], capture_output=True, text=True, check=True
                ).stdout,
            )
        except (OSError, subprocess.CalledProcessError):
            pass
    for candidate in candidates:
        try:
            return ImageFont.truetype(candidate, size)
        except OSError:
            continue
    return ImageFont.load_default(size)


def fit_text(text: str, font: ImageFont.ImageFont, width: int) -> str:
    """`text`, cut with "..." to fit `width` pixels."""
    if font.getlength(text) <= width:
        return text
    while text and font.getlength(text + "...") > width:
        text = text[:-1]
    return text + "..."


def caption_grid(
    cells: list[tuple[Image.Image | str, list[tuple[str, str]]]], empty_note: str = "nothing to show"
) -> Image.Image:
    """A grid of COLUMNS cells a row: each an image (or, as a string, why there is none) over its
    caption lines `(text, colour)`."""
    font = caption_font([text for _, lines in cells for text, _ in lines])
    box_width, box_height = IMAGE_BOX
    lines = max((len(caption) for _, caption in cells), default=1)
    cell_width, cell_height = box_width + 2 * PAD, box_height + lines * LINE_HEIGHT + 3 * PAD
    columns = min(COLUMNS, max(1, len(cells)))
    rows = max(1, -(-len(cells) // columns))
    grid = Image.new("RGB", (columns * cell_width, rows * cell_height), "white")
    draw = ImageDraw.Draw(grid)
    if not cells:
        draw.text((PAD, PAD), empty_note, fill="black", font=font)
    for number, (image, caption) in enumerate(cells):
        left, top = number % columns * cell_width, number // columns * cell_height
        if isinstance(image, str):
            draw.rectangle((left + PAD, top + PAD, left + PAD + box_width, top + PAD + box_height), fill="#DDDDDD")
            draw.text((left + 2 * PAD, top + PAD + box_height // 2), image, fill="#AA0000", font=font, anchor="lm")
        else:
            scale = min(box_width / max(image.width, 1), box_height / max(image.height, 1))
            size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
            grid.paste(image.convert("RGB").resize(size, Image.Resampling.BILINEAR), (left + PAD, top + PAD))
        for line, (text, colour) in enumerate(caption):
            draw.text(
                (left + PAD, top + 2 * PAD + box_height + line * LINE_HEIGHT),
                fit_text(text, font, box_width),
                fill=colour,
                font=font,
            )
        draw.rectangle((left, top, left + cell_width - 1, top + cell_height - 1), outline="lightgray")
    return grid
