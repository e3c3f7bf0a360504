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


def fontconfig_font(family: str) -> Path | None:
    """The file of a font of `family` (its plain style) as fontconfig lists it, or None."""
    try:
        listing = subprocess.run(["fc-list", f"{family}:style=Book", "file"], capture_output=True, text=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    files = sorted(line.rstrip(": ") for line in listing.splitlines() if line.strip())
    return Path(files[0]) if files else None


@pytest.fixture(scope="module")
def words_and_fonts(tmp_path_factory) -> tuple[Path, Path]:
    font = fontconfig_font("DejaVu Sans")
    if font is None:
        pytest.skip("fontconfig lists no DejaVu Sans")
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "fonts").mkdir()
    (folder / "fonts" / font.name).symlink_to(font)
    (folder / "fonts" / "notes.txt").write_text("not a font: ignored\n")
    # Two words hold characters outside the default alphabet; blank lines are not words; ends are stripped.
    (folder / "words.txt").write_text("hello\nworld\n\nStraße\nab#c\n  crnn  \n42\n", encoding="utf-8")
    return folder / "words.txt", folder / "fonts"


def generate_words(out: Path, words: Path, fonts: Path, workers: int) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), "--out", str(out), "--train", "24", "--val", "6", "--seed", "3",
               "--workers", str(workers), "--words", str(words), "--fonts", str(fonts)]
    return subprocess.run(command, cwd=out.parent, capture_output=True, text=True, timeout=120)


def test_words_and_fonts_give_labels_from_the_list(words_and_fonts, tmp_path):
    words, fonts = words_and_fonts
    result = generate_words(tmp_path / "synth", words, fonts, workers=2)
    assert result.returncode == 0, result.stderr
    assert "1 fonts in" in result.stdout
    assert "words: kept 4 of 6" in result.stdout
    assert "skipped 2: 2 with characters outside the alphabet" in result.stdout
    labels = [label for split in ("train", "val") for _, label in read_lmdb(tmp_path / "synth" / split)]
    assert len(labels) == 30 and set(labels) <= {"hello", "world", "crnn", "42"}
    assert len(set(labels)) > 1
    # The word list and the font checks are cached in the main process and inherited by the workers:
    # one worker or two, the same bytes.
    again = generate_words(tmp_path / "again", words, fonts, workers=1)
    assert again.returncode == 0, again.stderr
    for split in ("train", "val"):
        assert read_lmdb(tmp_path / "again" / split) == read_lmdb(tmp_path / "synth" / split)


def test_words_and_fonts_errors(words_and_fonts, tmp_path):
    words, fonts = words_and_fonts
    missing_fonts = generate_words(tmp_path / "a", words, tmp_path / "no-such-folder", workers=1)
    assert missing_fonts.returncode != 0 and "--fonts: font folder" in missing_fonts.stderr
    (tmp_path / "empty").mkdir()
    no_fonts = generate_words(tmp_path / "b", words, tmp_path / "empty", workers=1)
    assert no_fonts.returncode != 0 and "holds no .ttf, .otf or .ttc file" in no_fonts.stderr
    (tmp_path / "unusable.txt").write_text("ÄÖÜ\n#\n", encoding="utf-8")
    no_words = generate_words(tmp_path / "c", tmp_path / "unusable.txt", fonts, workers=1)
    assert no_words.returncode != 0 and "no word of" in no_words.stderr
    assert not (tmp_path / "c").exists()
