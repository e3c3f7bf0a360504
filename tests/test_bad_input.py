"""Bad input in an LMDB: every kind of broken or unusual image decodes correctly or is dropped and
counted, and a whole training run over a dataset holding all of them, and broken labels and keys, ends well."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw
from torch import Tensor

from data.codec import CTCCodec
from data.lmdb_dataset import CollateBatch, LmdbDataset
from data.lmdb_writer import write_lmdb
from data.transforms import ImageTransform, Preprocessing
from tests.conftest import ALPHABET, SMALL_RUN, read_lmdb, run_command
from tests.test_lmdb_dataset import edit_lmdb

WHITE, BLACK = 1.0, -1.0


def encode(image: Image.Image, image_format: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **options)
    return buffer.getvalue()


def ink_on_transparent(mode: str) -> bytes:
    """Black ink in the middle third (x 20..40 of 60) on a fully transparent background whose colour is black."""
    image = Image.new("RGBA", (60, 20), (0, 0, 0, 0))
    ImageDraw.Draw(image).rectangle((20, 0, 39, 19), fill=(0, 0, 0, 255))
    if mode == "P":  # a palette image with a transparent index, as GIFs and small PNGs are stored
        image = Image.new("P", (60, 20), 0)
        image.putpalette([0, 0, 0, 0, 0, 0])
        ImageDraw.Draw(image).rectangle((20, 0, 39, 19), fill=1)
        return encode(image, transparency=0)
    return encode(image.convert(mode))


def sixteen_bit(mode: str, image_format: str) -> bytes:
    """Three vertical bands of 0, 32768 and 65535 (100 pixels wide each), stored with 16 bits or more."""
    values = np.repeat(np.array([0, 32768, 65535]), 100)[None, :].repeat(20, axis=0)
    dtype = {"I;16": "<u2", "I;16B": ">u2", "I": "<i4"}[mode]
    image = Image.fromarray(values.astype(dtype))
    assert image.mode == mode
    return encode(image, image_format)


def black_then_white(width: int, height: int) -> bytes:
    image = Image.new("L", (width, height), 255)
    image.paste(0, (0, 0, width // 2, height))
    return encode(image)


def half(image_bytes: bytes) -> bytes:
    return image_bytes[: len(image_bytes) // 2]


def transparent_becomes_white(image: Tensor) -> None:
    # The ink covers x 33..67 of 100 when stretched and 32..64 when the aspect ratio is kept.
    assert torch.allclose(image[..., :28], torch.full_like(image[..., :28], WHITE), atol=0.02)
    assert torch.allclose(image[..., 38:62], torch.full_like(image[..., 38:62], BLACK), atol=0.02)
    assert torch.allclose(image[..., 72:], torch.full_like(image[..., 72:], WHITE), atol=0.02)


def sixteen_bit_is_scaled(image: Tensor) -> None:
    assert torch.allclose(image[..., 3:28], torch.full_like(image[..., 3:28], BLACK), atol=0.02)  # 0
    assert image[..., 40:60].abs().max() < 0.02  # 32768: mid-grey, not clipped to white
    assert torch.allclose(image[..., 72:97], torch.full_like(image[..., 72:97], WHITE), atol=0.02)  # 65535


def one_black_pixel(image: Tensor) -> None:
    assert torch.allclose(image, torch.full_like(image, BLACK))


def squeezed_black_then_white(image: Tensor) -> None:
    assert torch.allclose(image[..., :45], torch.full_like(image[..., :45], BLACK), atol=0.02)
    assert torch.allclose(image[..., 55:], torch.full_like(image[..., 55:], WHITE), atol=0.02)


TEXT = Image.new("L", (100, 32), 255)
ImageDraw.Draw(TEXT).text((4, 8), "hello", fill=0)

# Kept by the label filter, dropped at decoding time and counted in the batch's num_dropped.
UNDECODABLE: dict[str, bytes] = {
    "undecodable bytes": b"this is not an image",
    "truncated PNG": half(encode(TEXT)),
    "truncated JPEG": half(encode(TEXT, "JPEG")),
    "zero bytes": b"",
}
# Unusual but valid: each decodes to a [C, H, W] tensor in [-1, 1] whose pixels the check verifies.
UNUSUAL: dict[str, tuple[bytes, Callable[[Tensor], None]]] = {
    "1x1 pixel": (encode(Image.new("L", (1, 1), 0)), one_black_pixel),
    "4000x20": (black_then_white(4000, 20), squeezed_black_then_white),
    "RGBA": (ink_on_transparent("RGBA"), transparent_becomes_white),
    "LA": (ink_on_transparent("LA"), transparent_becomes_white),
    "P with transparency": (ink_on_transparent("P"), transparent_becomes_white),
    "16-bit PNG (I;16)": (sixteen_bit("I;16", "PNG"), sixteen_bit_is_scaled),
    "16-bit big-endian TIFF (I;16B)": (sixteen_bit("I;16B", "TIFF"), sixteen_bit_is_scaled),
    "32-bit integer TIFF (I)": (sixteen_bit("I", "TIFF"), sixteen_bit_is_scaled),
}


@pytest.fixture(scope="module")
def odd_images_lmdb(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad_input") / "odd_images"
    write_lmdb(
        path,
        [(image_bytes, "odd") for image_bytes in UNDECODABLE.values()]
        + [(image_bytes, "odd") for image_bytes, _ in UNUSUAL.values()],
    )
    return path


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("keep_aspect", [False, True])
def test_each_bad_image_in_an_lmdb_is_dropped_or_decoded_correctly(odd_images_lmdb, channels, keep_aspect):
    codec = CTCCodec(ALPHABET)
    transform = ImageTransform(Preprocessing(32, 100, "L" if channels == 1 else "RGB", keep_aspect))
    dataset = LmdbDataset(odd_images_lmdb, codec, 26, transform)
    assert len(dataset) == len(UNDECODABLE) + len(UNUSUAL)  # images are not decoded by the label scan
    samples = [dataset[i] for i in range(len(dataset))]
    assert samples[: len(UNDECODABLE)] == [None] * len(UNDECODABLE)
    for (kind, (_, check)), (image, label) in zip(UNUSUAL.items(), samples[len(UNDECODABLE) :]):
        assert image.shape == (channels, 32, 100) and image.dtype == torch.float32, kind
        assert image.min() >= -1 and image.max() <= 1, kind
        check(image)
    batch = CollateBatch(codec, transform.output_shape)(samples)
    assert batch.num_dropped == len(UNDECODABLE) and batch.images.shape == (len(UNUSUAL), channels, 32, 100)


@pytest.mark.slow
def test_a_training_run_over_every_kind_of_bad_input_reports_it_and_finishes(synth, tmp_path):
    """24 good samples, every bad image above, three bad labels, a missing image key and num-samples 3 too large."""
    good = read_lmdb(synth / "train")[:24]
    good_image = good[0][0]
    bad_labels = [(good_image, ""), (good_image, "héllo"), (good_image, "ab" * 20)]  # 40 frames > 26
    samples = (
        good
        + [(image_bytes, "odd") for image_bytes in UNDECODABLE.values()]
        + [(image_bytes, "odd") for image_bytes, _ in UNUSUAL.values()]
        + bad_labels
        + [(good_image, "gone")]
    )
    path = tmp_path / "bad_input"
    keys = write_lmdb(path, samples)
    edit_lmdb(path, put={b"num-samples": b"%d" % (keys + 3)}, delete=[b"image-%09d" % keys])
    kept = 24 + len(UNDECODABLE) + len(UNUSUAL)
    out_dir = tmp_path / "run"

    result = run_command(
        sys.executable,
        "train.py",
        "--config",
        "crnn.yaml",
        f"data.train=[{path}]",
        f"data.val=[{path}]",
        f"train.out_dir={out_dir}",
        *SMALL_RUN,
        "train.batch_size=4",
        "train.eval_batch_size=8",
        "train.max_steps=4",
        "train.eval_every=4",
        "train.log_every=1",
    )

    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    report = (
        f"{path}: kept {kept} of {keys + 3}; dropped: 3 missing label, 1 missing image, 1 empty label, "
        f"1 characters outside the alphabet, 1 too long for CTC\n"
        f"  num-samples is {keys + 3} but only {keys} samples exist"
    )
    assert log.count(report) == 2  # once for data.train, once for data.val
    assert "characters outside the alphabet (most common): 'é'x1" in log
    assert f"samples {kept - len(UNDECODABLE)}" in log and f"undecodable_images {len(UNDECODABLE)}" in log
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val" not in r] == [1, 2, 3, 4]
    assert [r["undecodable_images"] for r in records if "val" in r] == [len(UNDECODABLE)]
    assert (out_dir / "last.pt").is_file()
