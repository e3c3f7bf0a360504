"""scripts/make_synthetic.py, run as a user runs it: a real process writing real LMDBs."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from multiprocessing import get_context
from pathlib import Path

import lmdb
import numpy as np
import pytest
from PIL import Image

from synthetic.backgrounds import HELD_OUT_STYLES, PACKAGE_PHOTOS, PAINTERS, TRAIN_STYLES, paint
from synthetic.fonts import Font, FontCoverage, FontPool
from synthetic.render import choose_font
from synthetic.text import MARKS, WORDS_FILE, ordinal
from tests.conftest import read_lmdb, run_env

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_synthetic.py"
ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
SPLITS = ("train", "val", "test")


def generate(out: Path, *options: str, workers: int = 2, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), "--out", str(out), "--workers", str(workers), *options]
    # cwd elsewhere than the repository: the script must find its own imports.
    result = subprocess.run(command, cwd=out.parent, capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr
    return result


def metas(split: Path) -> list[dict]:
    """Each sample's record of what made it (`meta-%09d`)."""
    env = lmdb.open(str(split), readonly=True, lock=False)
    with env.begin() as txn:
        count = int(txn.get(b"num-samples"))
        records = [json.loads(txn.get(b"meta-%09d" % index)) for index in range(1, count + 1)]
    env.close()
    return records


def fontconfig_font(family: str) -> Path | None:
    """The file of a font of `family` (its plain style) as fontconfig lists it, or None."""
    try:
        listing = subprocess.run(
            ["fc-list", f"{family}:style=Book", "file"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    files = sorted(line.rstrip(": ") for line in listing.splitlines() if line.strip())
    return Path(files[0]) if files else None


@pytest.fixture(scope="module")
def dejavu(tmp_path_factory) -> Path:
    """A folder holding DejaVu Sans, Sans Mono and Serif (links to the system's files)."""
    folder = tmp_path_factory.mktemp("dejavu")
    for family in ("DejaVu Sans", "DejaVu Sans Mono", "DejaVu Serif"):
        font = fontconfig_font(family)
        if font is None:
            pytest.skip(f"fontconfig lists no {family}")
        (folder / font.name).symlink_to(font)
    (folder / "notes.txt").write_text("not a font: ignored\n")
    return folder


@pytest.fixture(scope="module")
def seed0(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("seed0") / "synth"
    generate(out, "--train", "40", "--val", "10", "--test", "10", "--seed", "0", "--alphabet", ALPHABET)
    return out


@pytest.mark.slow
def test_writes_decodable_32px_images_with_alphabet_labels(seed0):
    for split, expected in (("train", 40), ("val", 10), ("test", 10)):
        samples = read_lmdb(seed0 / split)
        assert len(samples) == expected
        for image_bytes, label in samples:
            with Image.open(io.BytesIO(image_bytes)) as image:
                image.load()
                assert image.height == 32 and 16 <= image.width <= 300
                assert image.mode == "RGB"
            assert label and set(label) <= set(ALPHABET)


def test_val_and_test_are_not_copies_of_train(seed0):
    train = read_lmdb(seed0 / "train")
    for split in ("val", "test"):
        assert all(train_image != image for (train_image, _), (image, _) in zip(train, read_lmdb(seed0 / split)))


@pytest.mark.slow
def test_same_seed_same_bytes_whatever_the_workers(seed0, tmp_path):
    generate(
        tmp_path / "synth",
        "--train",
        "40",
        "--val",
        "10",
        "--test",
        "10",
        "--seed",
        "0",
        "--alphabet",
        ALPHABET,
        workers=1,
    )
    for split in SPLITS:
        assert read_lmdb(tmp_path / "synth" / split) == read_lmdb(seed0 / split)
        assert metas(tmp_path / "synth" / split) == metas(seed0 / split)


@pytest.mark.slow
def test_other_seed_other_samples(seed0, tmp_path):
    generate(tmp_path / "synth", "--train", "40", "--val", "0", "--test", "0", "--seed", "1")
    other, same = read_lmdb(tmp_path / "synth" / "train"), read_lmdb(seed0 / "train")
    assert all(other_image != image for (other_image, _), (image, _) in zip(other, same))
    assert not (tmp_path / "synth" / "val").exists()  # --val 0: no split written


@pytest.fixture(scope="module")
def default_text(tmp_path_factory) -> Path:
    """300 training samples drawn with the defaults: what the text sampler gives, for the tests of it."""
    out = tmp_path_factory.mktemp("default_text") / "synth"
    generate(out, "--train", "300", "--val", "0", "--test", "0")
    return out / "train"


@pytest.mark.slow
def test_the_text_mixes_words_numbers_and_random_strings(default_text):
    labels = [label for _, label in read_lmdb(default_text)]
    words = set(WORDS_FILE.read_text().lower().split())
    in_list = sum(label in words for label in labels)
    numbers = sum(label.isdigit() for label in labels)
    assert 0.35 * len(labels) < in_list < 0.8 * len(labels)
    assert 0.05 * len(labels) < numbers < 0.4 * len(labels)
    assert len(labels) - in_list - numbers > 0.1 * len(labels)  # codes, ordinals, random strings


@pytest.mark.slow
def test_words_are_drawn_in_upper_case_most_often_as_on_real_signs(default_text):
    words = set(WORDS_FILE.read_text().lower().split())
    texts = [meta["text"].strip(MARKS) for meta in metas(default_text)]
    drawn = [text for text in texts if len(text) >= 2 and text.lower() in words and text.isalpha()]
    upper = sum(text.isupper() for text in drawn) / len(drawn)
    lower = sum(text.islower() for text in drawn) / len(drawn)
    assert len(drawn) > 150
    assert 0.4 < upper < 0.7 and 0.08 < lower < 0.35  # 55 % and 20 % drawn (words listed in capitals stay so)


@pytest.mark.slow
def test_a_case_folding_alphabet_gets_capitals_drawn_with_folded_labels(dejavu, tmp_path):
    """The alphabet "a" folds case, so "A" is drawn half the time, labelled "a". In the pixels: a
    capital puts ink in the top quarter of the image (the crop spans cap height), a small "a" does not."""
    fonts = tmp_path / "sans"
    fonts.mkdir()
    shutil.copy(dejavu / "DejaVuSans.ttf", fonts)
    generate(
        tmp_path / "synth",
        "--train",
        "200",
        "--val",
        "0",
        "--test",
        "0",
        "--alphabet",
        "a",
        "--no-words",
        "--max-length",
        "1",
        "--no-system-fonts",
        "--fonts",
        str(fonts),
        "--held-out-fonts",
        "",
    )
    top_ink: dict[str, list[float]] = {"a": [], "A": []}
    for (image_bytes, label), meta in zip(read_lmdb(tmp_path / "synth" / "train"), metas(tmp_path / "synth" / "train")):
        assert label == "a"
        if meta["text"] not in top_ink:  # with a mark beside it: its ink would count
            continue
        gray = np.asarray(Image.open(io.BytesIO(image_bytes)).convert("L"), dtype=np.float32)
        border = np.concatenate([gray[0], gray[-1], gray[:, 0], gray[:, -1]])
        difference = np.abs(gray - np.median(border))
        ink = difference > 0.5 * difference.max()  # dark on light or light on dark
        top_ink[meta["text"]].append(ink[: gray.shape[0] // 4].sum() / max(ink.sum(), 1))
    assert 60 < len(top_ink["A"]) < 140  # capitals about half the time
    small, capital = np.array(top_ink["a"]), np.array(top_ink["A"])
    assert np.median(small) < 0.01 and np.median(capital) > 0.05
    assert (small < 0.03).mean() > 0.8 and (capital >= 0.03).mean() > 0.7


@pytest.mark.slow
def test_held_out_fonts_and_backgrounds_appear_in_test_only(dejavu, tmp_path):
    options = ("--no-system-fonts", "--fonts", str(dejavu), "--no-package-photos")
    result = generate(tmp_path / "synth", "--train", "120", "--val", "40", "--test", "40", *options)
    assert "fonts: 2 families for train and val, 1 held out for test" in result.stdout
    assert "held out: DejaVu Serif" in result.stdout
    for split in ("train", "val"):
        records = metas(tmp_path / "synth" / split)
        assert {record["font"] for record in records} == {"DejaVu Sans", "DejaVu Sans Mono"}
        assert {record["background"] for record in records} <= {"flat", "gradient", "noise", "blotches", "stripes"}
    records = metas(tmp_path / "synth" / "test")
    assert {record["font"] for record in records} == {"DejaVu Serif"}
    assert {record["background"] for record in records} == {"paper", "grid", "dots"}


@pytest.mark.slow
def test_background_photos_are_drawn_on_and_every_fifth_is_held_out_for_test(dejavu, tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    for index in range(5):  # photo-4.png, the fifth in sorted order, is test's
        pixels = np.random.default_rng(index).integers(0, 256, (120, 200, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(photos / f"photo-{index}.png")
    (photos / "readme.txt").write_text("not an image: ignored\n")
    result = generate(
        tmp_path / "synth",
        "--train",
        "150",
        "--val",
        "0",
        "--test",
        "60",
        "--no-system-fonts",
        "--fonts",
        str(dejavu),
        "--backgrounds",
        str(photos),
        "--no-package-photos",
    )
    assert "photos 4 + 1 held out" in result.stdout
    train, test = metas(tmp_path / "synth" / "train"), metas(tmp_path / "synth" / "test")
    assert {record["photo"] for record in train if record["background"] == "photo"} == {
        f"photo-{index}.png" for index in range(4)
    }
    assert {record["photo"] for record in test if record["background"] == "photo"} == {"photo-4.png"}


def fake_skimage(site: Path, photos: tuple[str, ...]) -> dict[str, str]:
    """A package named skimage under `site` whose data/ folder holds `photos`, random pixels each; the
    environment in which child processes find it first."""
    (site / "skimage" / "data").mkdir(parents=True)
    (site / "skimage" / "__init__.py").write_text("raise ImportError('the generator must not import skimage')\n")
    for index, name in enumerate(photos):
        pixels = np.random.default_rng(index).integers(0, 256, (120, 200, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(site / "skimage" / "data" / name)
    env = run_env()
    return {**env, "PYTHONPATH": f"{site}{os.pathsep}{env['PYTHONPATH']}"}


@pytest.mark.slow
def test_scikit_images_sample_photos_are_drawn_on_and_every_fifth_is_held_out(dejavu, tmp_path):
    """The listed photos are found in the installed scikit-image without importing it, in the listed order;
    a file it does not list (text.png: a page of words) is never drawn on."""
    env = fake_skimage(tmp_path / "site", (*PACKAGE_PHOTOS[:5], "text.png"))
    options = ("--train", "150", "--val", "0", "--test", "60", "--no-system-fonts", "--fonts", str(dejavu))
    result = generate(tmp_path / "synth", *options, env=env)
    assert "photos 4 + 1 held out" in result.stdout and "no photo backgrounds" not in result.stdout
    train, test = metas(tmp_path / "synth" / "train"), metas(tmp_path / "synth" / "test")
    assert {record["photo"] for record in train if record["background"] == "photo"} == set(PACKAGE_PHOTOS[:4])
    assert {record["photo"] for record in test if record["background"] == "photo"} == {PACKAGE_PHOTOS[4]}

    result = generate(tmp_path / "without", *options, "--no-package-photos", env=env)
    assert "photos" not in result.stdout.split("backgrounds:")[1]
    assert "photo" not in {record["background"] for record in metas(tmp_path / "without" / "train")}


@pytest.mark.slow
def test_a_run_without_the_font_and_photo_packages_says_how_to_install_them(tmp_path):
    env = fake_skimage(tmp_path / "site", ())  # scikit-image without its photos, as if it were not installed
    result = generate(
        tmp_path / "synth",
        "--train",
        "20",
        "--val",
        "0",
        "--test",
        "0",
        env=env,
    )
    assert "no photo backgrounds from packages: `pip install -r requirements-synthetic.txt`" in result.stdout
    installed_fonts = "font packages, licences:" in result.stdout
    assert installed_fonts != ("no font packages: `pip install -r requirements-synthetic.txt`" in result.stdout)


@pytest.mark.slow
def test_font_packages_are_found_through_their_entry_point(dejavu, tmp_path):
    """A package like PyPI's fontpkg-* ones: a module with metadata.json and font files, registered
    under the `fontpkg.family` entry point."""
    site = tmp_path / "site"
    module = site / "fakefont_sans"
    (module / "files").mkdir(parents=True)
    shutil.copy(dejavu / "DejaVuSans.ttf", module / "files" / "FakeSans.ttf")
    (module / "__init__.py").write_text("")
    (module / "metadata.json").write_text(
        json.dumps({"family": "Fake Sans", "license": "OFL-1.1", "files": [{"path": "files/FakeSans.ttf"}]})
    )
    info = site / "fakefont_sans-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakefont-sans\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[fontpkg.family]\nfake-sans = fakefont_sans\n")
    result = generate(
        tmp_path / "synth",
        "--train",
        "30",
        "--val",
        "0",
        "--test",
        "0",
        "--no-words",
        "--held-out-fonts",
        "",
        env={**run_env(), "PYTHONPATH": str(site)},
    )
    assert "font packages, licences:" in result.stdout and "OFL-1.1" in result.stdout
    assert "Fake Sans" in result.stdout


@pytest.mark.slow
def test_words_and_fonts_give_labels_from_the_list(dejavu, tmp_path):
    # Two words hold characters outside the default alphabet; blank lines are not words; ends are stripped.
    words = tmp_path / "words.txt"
    words.write_text("hello\nworld\n\nStraße\nab#c\n  crnn  \n42\n", encoding="utf-8")
    options = (
        "--train",
        "60",
        "--val",
        "6",
        "--test",
        "0",
        "--seed",
        "3",
        "--words",
        str(words),
        "--no-system-fonts",
        "--fonts",
        str(dejavu),
    )
    result = generate(tmp_path / "synth", *options)
    assert "words: kept 4 of 6" in result.stdout and "skipped 2" in result.stdout
    labels = [label for split in ("train", "val") for _, label in read_lmdb(tmp_path / "synth" / split)]
    assert {"hello", "world", "crnn"} <= set(labels)  # words: some of the samples, in any case, folded
    # The plan is computed in the main process and inherited by the workers: one worker or two, the same bytes.
    generate(tmp_path / "again", *options, workers=1)
    for split in ("train", "val"):
        assert read_lmdb(tmp_path / "again" / split) == read_lmdb(tmp_path / "synth" / split)


@pytest.mark.slow
def test_marks_the_alphabet_lacks_are_drawn_but_not_labelled(dejavu, tmp_path):
    """ "Direction?" is labelled "direction", as the benchmarks score it; a mark the alphabet has is labelled
    like any other character."""
    options = ("--train", "300", "--val", "0", "--test", "0", "--no-system-fonts", "--fonts", str(dejavu))
    generate(tmp_path / "plain", *options)
    samples = list(zip(read_lmdb(tmp_path / "plain" / "train"), metas(tmp_path / "plain" / "train")))
    marked = [(label, meta["text"]) for (_, label), meta in samples if set(meta["text"]) & set(MARKS)]
    assert 0.05 * len(samples) < len(marked) < 0.3 * len(samples)
    for label, text in marked:
        assert label == "".join(char for char in text if char not in MARKS).lower()
    generate(tmp_path / "with_marks", *options, "--alphabet", ALPHABET + "?!.,")
    labels = [label for _, label in read_lmdb(tmp_path / "with_marks" / "train")]
    assert sum(any(mark in label for mark in "?!.,") for label in labels) > 0.03 * len(labels)


@pytest.mark.slow
def test_some_short_texts_are_steeply_tilted_in_an_upright_crop(dejavu, tmp_path):
    """A word at 8 to 40 degrees, cropped by its upright bounding box (IC15's look): a taller crop than
    its text would need level."""
    generate(
        tmp_path / "synth", "--train", "400", "--val", "0", "--test", "0", "--no-system-fonts", "--fonts", str(dejavu)
    )
    samples = list(zip(read_lmdb(tmp_path / "synth" / "train"), metas(tmp_path / "synth" / "train")))
    tilted = [(Image.open(io.BytesIO(image)).width, meta) for (image, _), meta in samples if "tilt" in meta["effects"]]
    assert 0.03 * len(samples) < len(tilted) < 0.2 * len(samples)
    assert all(len(meta["text"]) <= 8 for _, meta in tilted)
    level = [
        Image.open(io.BytesIO(image)).width
        for (image, _), meta in samples
        if not set(meta["effects"]) & {"tilt", "rotation or shear", "perspective"} and len(meta["text"]) >= 6
    ]
    # At 32 px high, a tilted word of 6 to 8 characters is narrower than a level one.
    tilted_long = [width for width, meta in tilted if len(meta["text"]) >= 6]
    assert np.median(tilted_long) < 0.8 * np.median(level)


def test_every_background_style_has_one_painter_and_an_unknown_style_is_named():
    assert sorted(PAINTERS) == sorted(TRAIN_STYLES + HELD_OUT_STYLES)
    for style in PAINTERS:
        for light in (True, False):
            background = paint(style, random.Random(0), np.random.default_rng(0), 40, 16, light)
            assert background.shape == (16, 40, 3) and background.dtype == np.float32
            assert 0 <= background.min() and background.max() <= 255
    with pytest.raises(ValueError, match="unknown background style 'nope'"):
        paint("nope", random.Random(0), np.random.default_rng(0), 40, 16, True)


def test_the_font_index_chooses_as_a_test_of_every_font_would():
    # The index replaced testing each font's character set; a seed must keep choosing the same font.
    def scanning(rng: random.Random, fonts: tuple[FontCoverage, ...], label: str) -> FontCoverage | None:
        candidates = [coverage for coverage in fonts if coverage.draws(label)]
        if not candidates:
            return None
        family = rng.choice(sorted({coverage.font.family for coverage in candidates}))
        return rng.choice([coverage for coverage in candidates if coverage.font.family == family])

    draw = random.Random(0)
    alphabet = "abcdefghij"
    fonts = []
    for index in range(70):  # more fonts than a 64-bit mask holds
        characters = "".join(char for char in alphabet if draw.random() < 0.8)
        family = f"family {draw.randrange(9)}"
        fonts.append(FontCoverage(Font(f"/fonts/{index}.ttf", family, "test"), characters, frozenset(characters)))
    fonts = tuple(fonts)
    pool = FontPool(fonts)
    chosen = []
    for seed in range(3000):
        label = "".join(draw.choice(alphabet + "z") for _ in range(draw.randint(0, 6)))
        expected = scanning(random.Random(seed), fonts, label)
        assert choose_font(random.Random(seed), pool, label) == expected, label
        chosen.append(expected)
    assert None in chosen and len({coverage.font.path for coverage in chosen if coverage}) == len(fonts)


def stop_signal_handlers() -> tuple:
    return signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)


def test_rendering_workers_take_sigterm_as_it_comes_so_the_pool_can_end_them():
    # Pool.terminate() ends its workers with SIGTERM. With the command's handler inherited by the fork,
    # a worker the signal reached just before it blocked on the task queue stayed there, and
    # make_synthetic.py with it (seen as a test that timed out now and then).
    from scripts.make_synthetic import start_worker
    from utils.cli import StopHandlers

    stops = StopHandlers()
    try:
        with get_context("fork").Pool(1, initializer=start_worker, initargs=(None,)) as pool:
            in_worker = pool.apply(stop_signal_handlers)
    finally:
        stops.restore()
    assert in_worker == (signal.SIG_DFL, signal.SIG_IGN)


def test_ordinals_take_the_suffix_print_gives_them():
    assert [ordinal(number) for number in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111, 112, 120)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
        "23rd",
        "101st",
        "111th",
        "112th",
        "120th",
    ]


@pytest.mark.parametrize(
    "options, message",
    [
        (["--fonts", "{tmp}/no-such-folder"], "--fonts: font folder"),
        (["--fonts", "{tmp}/empty"], "holds no .ttf, .otf or .ttc file"),
        (["--words", "{tmp}/unusable.txt"], "no word of"),
        (["--words", "{tmp}/missing.txt"], "--words: {tmp}/missing.txt does not exist"),
        (["--backgrounds", "{tmp}/empty"], "--backgrounds: background folder"),
        (["--no-system-fonts"], "--no-system-fonts needs --fonts DIR"),
    ],
)
@pytest.mark.slow
def test_bad_options_are_named_and_write_nothing(tmp_path, options, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "unusable.txt").write_text("ÄÖÜ\n#\n", encoding="utf-8")
    command = [
        sys.executable,
        str(SCRIPT),
        "--out",
        str(tmp_path / "synth"),
        "--train",
        "4",
        "--val",
        "0",
        "--test",
        "0",
        "--workers",
        "1",
        *(option.format(tmp=tmp_path) for option in options),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and message.format(tmp=tmp_path) in result.stderr
    assert not (tmp_path / "synth").exists()
