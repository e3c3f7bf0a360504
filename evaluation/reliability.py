"""The reliability diagram: per confidence bin, the accuracy of the readings in it against the diagonal a
calibrated confidence would follow; one panel per temperature (before and after calibration). Pillow only,
like evaluation/visualize.py."""

from __future__ import annotations

from PIL import Image, ImageDraw

from evaluation.visualize import caption_font

PANEL, MARGIN = 360, 48  # the plot's square side and the space around it for the axes' labels


def reliability_diagram(panels: list[tuple[str, list[tuple[int, float, float]]]]) -> Image.Image:
    """Side by side, each (title, evaluation.calibration.reliability_bins table) as bars of accuracy per
    equal-width confidence bin, the gap to the bin's mean confidence in red, and the diagonal."""
    font, small = caption_font(size=14), caption_font(size=11)
    width = len(panels) * (PANEL + 2 * MARGIN)
    image = Image.new("RGB", (max(width, 1), PANEL + 2 * MARGIN + 20), "white")
    draw = ImageDraw.Draw(image)
    for position, (title, table) in enumerate(panels):
        left, top = position * (PANEL + 2 * MARGIN) + MARGIN, MARGIN + 10
        bottom = top + PANEL

        def point(x: float, y: float) -> tuple[float, float]:
            return left + x * PANEL, bottom - y * PANEL

        draw.text((left, 8), title, fill="black", font=font)
        step = 1 / len(table)
        for index, (count, confidence, accuracy) in enumerate(table):
            if not count:
                continue
            draw.rectangle([point(index * step, accuracy), point((index + 1) * step, 0)], fill="steelblue")
            low, high = sorted((accuracy, confidence))
            draw.rectangle([point(index * step, high), point((index + 1) * step, low)], outline="firebrick")
        draw.line([point(0, 0), point(1, 1)], fill="gray", width=1)
        draw.rectangle([point(0, 1), point(1, 0)], outline="black")
        for tick in (0, 0.5, 1):
            draw.text((point(tick, 0)[0] - 6, bottom + 4), f"{tick:g}", fill="black", font=small)
            draw.text((left - 24, point(0, tick)[1] - 6), f"{tick:g}", fill="black", font=small)
        draw.text((left + PANEL / 2 - 40, bottom + 20), "confidence", fill="black", font=small)
        draw.text((left - MARGIN + 4, top - 22), "accuracy", fill="black", font=small)
    return image
