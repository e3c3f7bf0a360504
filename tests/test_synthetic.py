"""scripts/make_synthetic.py, run as a user runs it: a real process writing real LMDBs."""
from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import read_lmdb

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_synthetic.py"
ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def generate(out: Path, seed: int, workers: int) -> None:
    command = [sys.executable, str(SCRIPT), "--out", str(out), "--train", "40", "--val", "10",
               "--seed", str(seed), "--workers", str(workers), "--alphabet", ALPHABET]
    # cwd elsewhere than the repository: the script must find its own imports.
    result = subprocess.run(command, cwd=out.parent, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def seed0(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("seed0") / "synth"
    generate(out, seed=0, workers=2)
    return out


def test_writes_decodable_32px_images_with_alphabet_labels(seed0):
    for split, expected in (("train", 40), ("val", 10)):
        samples = read_lmdb(seed0 / split)
        assert len(samples) == expected
        for image_bytes, label in samples:
            assert image_bytes is not None
            with Image.open(io.BytesIO(image_bytes)) as image:
                image.load()
                assert image.height == 32 and 16 <= image.width <= 300
                assert image.mode == "RGB"
            assert label and set(label) <= set(ALPHABET)


def test_val_is_not_a_copy_of_train(seed0):
    train, val = read_lmdb(seed0 / "train"), read_lmdb(seed0 / "val")
    assert all(train_image != val_image for (train_image, _), (val_image, _) in zip(train, val))


def test_same_seed_same_bytes_whatever_the_workers(seed0, tmp_path):
    generate(tmp_path / "synth", seed=0, workers=1)
    for split in ("train", "val"):
        assert read_lmdb(tmp_path / "synth" / split) == read_lmdb(seed0 / split)


def test_other_seed_other_samples(seed0, tmp_path):
    generate(tmp_path / "synth", seed=1, workers=2)
    other, same = read_lmdb(tmp_path / "synth" / "train"), read_lmdb(seed0 / "train")
    assert all(other_image != image for (other_image, _), (image, _) in zip(other, same))
