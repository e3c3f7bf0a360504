"""OpenCV's bilinear resize (`cv2.resize(..., interpolation=cv2.INTER_LINEAR)` on 8-bit images), in numpy.

EasyOCR and deep-text-recognition-benchmark's forks feed their models through cv2, whose bilinear
filter differs from Pillow's: it never widens its support when shrinking (no antialiasing), and it
rounds in 11-bit fixed point where Pillow rounds to 8 bits between its horizontal and vertical passes.
Pillow's result differs by one grey level in about a quarter of the pixels of a 2x enlargement, and
a model that has only seen cv2's pixels changes some of its readings for that (docs/pretrained.md).
This is OpenCV's arithmetic, its vectorised path included: against opencv-python 5.0 it gives the
same pixels (tests/test_peer_weights.py holds some of cv2's own output).
"""

from __future__ import annotations

import numpy as np

COEF_BITS = 11  # OpenCV's INTER_RESIZE_COEF_BITS
ONE = 1 << COEF_BITS


def axis_taps(source: int, target: int, clamp_weights: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each output position along one axis: the two source indices and their fixed-point weights.

    Past an edge OpenCV gives the edge pixel weight 1 along the width (`clamp_weights`), but along the
    height it keeps both weights and reads the edge row twice, which rounds differently.
    """
    position = ((np.arange(target) + 0.5) * (source / target) - 0.5).astype(np.float32)
    first = np.floor(position).astype(np.int64)
    fraction = (position - first).astype(np.float32)
    if clamp_weights:
        before, after = first < 0, first >= source - 1
        fraction[before | after] = 0
        first[before], first[after] = 0, source - 1
    weight = np.rint((np.float32(1) - fraction) * ONE).astype(np.int64)
    return np.clip(first, 0, source - 1), np.clip(first + 1, 0, source - 1), weight, ONE - weight


def resize_opencv_linear(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """`pixels` (uint8, `[h, w]` or `[h, w, channels]`) resized to `width x height`, as cv2 does."""
    x0, x1, a0, a1 = axis_taps(pixels.shape[1], width, clamp_weights=True)
    y0, y1, b0, b1 = axis_taps(pixels.shape[0], height, clamp_weights=False)
    extra = (1,) * (pixels.ndim - 2)  # a trailing channel axis broadcasts
    source = pixels.astype(np.int64)
    rows = source[:, x0] * a0.reshape(-1, *extra) + source[:, x1] * a1.reshape(-1, *extra)  # [h, width, ...]
    b0, b1 = b0.reshape(-1, 1, *extra), b1.reshape(-1, 1, *extra)
    # The vertical pass as OpenCV's SIMD code does it: rows shifted right by 4 into 16 bits, the high
    # halves of their products with the weights, then a rounding shift by 2.
    blended = ((rows[y0] >> 4) * b0 >> 16) + ((rows[y1] >> 4) * b1 >> 16)
    return np.clip((blended + 2) >> 2, 0, 255).astype(np.uint8)
