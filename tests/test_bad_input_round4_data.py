"""Bad input, round 4, in the data: images whose bytes ask for a decoder the project does not read (an EPS
Pillow would hand to Ghostscript), images of several frames, labels holding characters no one can see,
and an LMDB whose data.mdb was cut short. Each test is a row of docs/bad-input.md."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from data.codec import CTCCodec
from data.image_files import IMAGE_SUFFIXES
from data.image_formats import READ_FORMATS, FormatNotRead
from data.lmdb_dataset import LmdbDataset
from data.lmdb_env import open_lmdb
from data.lmdb_writer import write_lmdb
from data.transforms import ImageTransform, Preprocessing, decode_image
from tests.conftest import ALPHABET, one_line_error, read_lmdb, run_command, train_small
from tests.test_bad_input_data import encode, run_main
from tests.test_lmdb_dataset import png

NOT_READ = (
    "images are not read, only PNG, JPEG, TIFF, WebP, BMP, GIF and PBM/PGM/PPM: convert it to PNG (or JPEG for photos)"
)


def word() -> Image.Image:
    """A black bar on white, 60 x 20: what a frame showing a word looks like to a test."""
    image = Image.new("L", (60, 20), 255)
    ImageDraw.Draw(image).rectangle((10, 5, 50, 15), fill=0)
    return image


def several_frames(image_format: str) -> bytes:
    """A blank first frame, then the word: an animated GIF or PNG, or a TIFF of two pages."""
    blank = Image.new("L", (60, 20), 255)
    return encode(blank, image_format, save_all=True, append_images=[word()])


def dataset(path: Path, **options) -> LmdbDataset:
    return LmdbDataset(path, CTCCodec(ALPHABET), 26, ImageTransform(Preprocessing(32, 100)), **options)


# Class 2: the formats read.

READ = {name: encode(word(), name) for name in ("PNG", "JPEG", "TIFF", "WEBP", "BMP", "GIF", "PPM")}
# Formats Pillow opens and the project does not: EPS is rendered by Ghostscript, a program of its own.
NOT_READ_NAMED = {"EPS": encode(word(), "EPS"), "ICO": encode(word(), "ICO"), "PCX": encode(word(), "PCX")}
NOT_READ_NAMED["SGI"] = encode(word(), "SGI")
NOT_READ_NAMED["DDS"] = encode(word().convert("RGB"), "DDS")
# TGA has no signature: Pillow tries it on bytes no other format claims, so it cannot be named.
TGA = encode(word(), "TGA")


def test_only_the_raster_formats_the_project_reads_are_decoded_and_the_others_named():
    assert set(READ) == set(READ_FORMATS)
    assert {Image.registered_extensions()[suffix] for suffix in IMAGE_SUFFIXES} == set(READ_FORMATS)  # predict's
    for name, image_bytes in READ.items():
        assert decode_image(image_bytes, "L").size == (60, 20), name
    for name, image_bytes in NOT_READ_NAMED.items():
        with pytest.raises(FormatNotRead, match=f"^{re.escape(f'{name} {NOT_READ}')}$"):
            decode_image(image_bytes, "L")
    with pytest.raises(Image.UnidentifiedImageError):
        decode_image(TGA, "L")


def test_training_drops_and_counts_an_image_of_a_format_it_does_not_read(tmp_path):
    samples = [*READ.values(), *NOT_READ_NAMED.values(), TGA]
    path = tmp_path / "formats"
    write_lmdb(path, [(image_bytes, "ab") for image_bytes in samples])
    data = dataset(path)
    decoded = [data[position] is not None for position in range(len(data))]
    assert decoded == [True] * len(READ) + [False] * (len(NOT_READ_NAMED) + 1)
    assert [data.load_pixels(position) is not None for position in range(len(data))] == decoded


@pytest.mark.slow
def test_an_eps_image_is_never_handed_to_ghostscript_and_is_named_by_predict_and_create_lmdb(checkpoint, tmp_path):
    """A `gs` first on the PATH that leaves a mark: neither command starts it, and each names the file's format."""
    bin_folder, marker = tmp_path / "bin", tmp_path / "ghostscript-ran"
    bin_folder.mkdir()
    (bin_folder / "gs").write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    (bin_folder / "gs").chmod(0o755)
    path = {"PATH": f"{bin_folder}{os.pathsep}{os.environ['PATH']}"}
    images = tmp_path / "images"
    images.mkdir()
    (images / "scan.eps").write_bytes(NOT_READ_NAMED["EPS"])
    word().save(images / "word.png")

    result = run_command(
        sys.executable,
        "scripts/predict.py",
        checkpoint,
        images / "scan.eps",
        images / "word.png",
        "--precision",
        "fp32",
        env=path,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"{images / 'scan.eps'}: cannot decode (EPS {NOT_READ})" in result.stderr
    assert result.stdout.startswith(f"{images / 'word.png'}\t")  # the other image is read
    assert not marker.exists()

    gt = tmp_path / "gt.txt"
    gt.write_text("scan.eps\tab\nword.png\tab\n", encoding="utf-8")
    result = run_command(
        sys.executable,
        "scripts/create_lmdb.py",
        "--images",
        images,
        "--gt",
        gt,
        "--out",
        tmp_path / "out",
        env=path,
        timeout=120,
        check=True,
    )
    assert (
        f"skipped 1: image in a format training does not read\n    line 1: scan.eps (EPS {NOT_READ})" in result.stdout
    )
    assert "wrote 1 samples" in result.stdout
    assert not marker.exists()


def test_create_lmdb_skips_images_of_several_frames_and_of_formats_training_does_not_read(tmp_path, capsys):
    from scripts.create_lmdb import main

    root = tmp_path / "images"
    root.mkdir()
    files = {
        "word.png": READ["PNG"],
        "blank_first.gif": several_frames("GIF"),
        "blank_first.png": several_frames("PNG"),
        "pages.tif": several_frames("TIFF"),
        "icon.ico": NOT_READ_NAMED["ICO"],
    }
    for name, image_bytes in files.items():
        (root / name).write_bytes(image_bytes)
    gt = tmp_path / "gt.txt"
    gt.write_text("".join(f"{name}\tab\n" for name in files), encoding="utf-8")
    code, stdout, _ = run_main(main, "--images", root, "--gt", gt, "--out", tmp_path / "out", capsys=capsys)
    assert code == 0
    assert (
        "skipped 3: image holds several frames (an animation, or pages); training reads only the first: save the"
        " frame that shows the label as an image of its own\n    line 2: blank_first.gif (2 frames)\n"
        "    line 3: blank_first.png (2 frames)\n    line 4: pages.tif (2 frames)"
    ) in stdout
    assert f"skipped 1: image in a format training does not read\n    line 5: icon.ico (ICO {NOT_READ})" in stdout
    assert [image for image, _ in read_lmdb(tmp_path / "out")] == [READ["PNG"]]


def test_inspect_lmdb_names_formats_not_read_images_of_several_frames_and_invisible_characters(tmp_path, capsys):
    from scripts.inspect_lmdb import main

    path = tmp_path / "mixed"
    samples = [
        (READ["PNG"], "ab"),
        (NOT_READ_NAMED["ICO"], "ab"),
        (several_frames("GIF"), "ab"),
        (READ["JPEG"], "a\u200bb"),
        (READ["JPEG"], "\ufeffab\xad"),
    ]
    write_lmdb(path, samples)
    code, out, _ = run_main(main, path, capsys=capsys)
    assert code == 0
    assert (
        f"undecodable images: 1 (reading headers only; --decode also finds truncated images)\n  #2: ICO {NOT_READ}"
        in out
    )
    assert (
        "images of several frames: 1 (#3 (2 frames)); training reads the first frame alone: check it shows the"
        " label (--montage draws it)"
    ) in out
    assert (
        "labels holding characters that print nothing: 2 (#4, #5): '\\u200b' (U+200B ZERO WIDTH SPACE): 1,"
        " '\\ufeff' (U+FEFF ZERO WIDTH NO-BREAK SPACE): 1, '\\xad' (U+00AD SOFT HYPHEN): 1; they look right and"
        " are not: training counts them outside the alphabet unless it lists them"
    ) in out


# Class 7: labels and LMDBs that look right and are not.


def test_create_lmdb_refuses_labels_holding_characters_that_print_nothing_naming_line_and_character(tmp_path, capsys):
    from scripts.create_lmdb import main

    root = tmp_path / "images"
    root.mkdir()
    for name in "abcde":
        word().save(root / f"{name}.png")
    labels = ["cat", "ca\u200bt", "do\xadg", "red\u202efox", "be\x07ll"]
    gt = tmp_path / "gt.txt"
    gt.write_text("".join(f"{name}.png\t{label}\n" for name, label in zip("abcde", labels)), encoding="utf-8")
    out = tmp_path / "out"
    code, stdout, _ = run_main(main, "--images", root, "--gt", gt, "--out", out, capsys=capsys)
    assert code == (
        f"error: --gt {gt}: 4 label(s) hold characters that print nothing: they look right and are not; remove"
        " those characters from the labels (or, where the script writes them, list them in --check-alphabet),"
        " nothing was written:\n"
        "  line 2: 'ca\\u200bt' holds '\\u200b' (U+200B ZERO WIDTH SPACE)\n"
        "  line 3: 'do\\xadg' holds '\\xad' (U+00AD SOFT HYPHEN)\n"
        "  line 4: 'red\\u202efox' holds '\\u202e' (U+202E RIGHT-TO-LEFT OVERRIDE)\n"
        "  ... and 1 more"
    )
    assert not out.exists()
    # A script that writes one lists it in its alphabet: U+200C ZERO WIDTH NON-JOINER in Persian.
    gt.write_text("a.png\tمی\u200cروم\n", encoding="utf-8")
    persian = "میرو\u200c"  # the letters of the label, and U+200C
    code, _, _ = run_main(main, "--images", root, "--gt", gt, "--out", out, "--check-alphabet", persian, capsys=capsys)
    assert code == 0 and [label for _, label in read_lmdb(out)] == ["می\u200cروم"]


@pytest.mark.parametrize("remove_unknown", [False, True])
def test_training_names_the_characters_that_print_nothing_in_its_labels(tmp_path, remove_unknown):
    """Counted outside the alphabet like any other character (dropped, or removed as data.unknown_characters
    says), and named by code point and name: a bare '\\u200b' in the report reads as a typo of the report."""
    path = tmp_path / "invisible"
    write_lmdb(path, [(png(), "cat"), (png(), "ca\u200bt"), (png(), "dog\xad")])
    data = dataset(path, remove_unknown=remove_unknown)
    kept, dropped = ("3 of 3", "none") if remove_unknown else ("1 of 3", "2 characters outside the alphabet")
    removed = "\n  2 labels lost characters outside the alphabet (removed, not dropped)" if remove_unknown else ""
    assert data.report.summary() == (
        f"{path}: kept {kept}; dropped: {dropped}{removed}\n"
        "  characters outside the alphabet (most common): '\\u200b' (U+200B ZERO WIDTH SPACE)x1"
        " '\\xad' (U+00AD SOFT HYPHEN)x1\n"
        "  2 of them print nothing ('\\u200b' (U+200B ZERO WIDTH SPACE), '\\xad' (U+00AD SOFT HYPHEN)): those"
        " labels look right and are not; remove these characters from them (or, where the script writes one,"
        " list it in data.alphabet)"
    )


def cut_copy(source: Path, folder: Path) -> Path:
    """A copy of the LMDB `source` whose data.mdb lost its second half, as a copy stopped part way leaves it."""
    shutil.copytree(source, folder)
    data = folder / "data.mdb"
    os.truncate(data, data.stat().st_size // 2)
    return folder


def truncated_message(folder: Path, full: Path) -> str:
    size, needed = (folder / "data.mdb").stat().st_size, (full / "data.mdb").stat().st_size
    return (
        f"LMDB {folder}: data.mdb is {size:,} bytes but its records need {needed:,}; it was cut short (a failed"
        f" copy?): copy it again, or rebuild it with scripts/create_lmdb.py"
    )


def test_an_lmdb_cut_short_is_named_when_it_is_opened_before_any_page_is_read(tmp_path):
    """In-process, opening is enough: the old opener succeeded, and the first read of a page past the end
    of the file killed the process with a bus error."""
    full = tmp_path / "full"
    write_lmdb(full, [(encode(Image.effect_noise((200, 32), 60), "PNG"), "ab") for _ in range(50)])
    cut = cut_copy(full, tmp_path / "cut")
    with pytest.raises(ValueError) as raised:
        open_lmdb(cut)
    assert str(raised.value) == truncated_message(cut, full)
    open_lmdb(full).close()  # the whole one opens


@pytest.mark.slow
def test_an_lmdb_cut_short_is_one_line_from_train_eval_and_inspect_not_a_bus_error(synth, checkpoint, tmp_path):
    cut = cut_copy(synth / "train", tmp_path / "cut")
    message = truncated_message(cut, synth / "train")
    commands = {
        "train.py": lambda: train_small(synth, tmp_path / "run", f"data.train=[{cut}]", timeout=120),
        "eval.sh": lambda: run_command("bash", "scripts/eval.sh", checkpoint, cut, timeout=120),
        "inspect_lmdb.py": lambda: run_command(sys.executable, "scripts/inspect_lmdb.py", cut, timeout=120),
    }
    for name, command in commands.items():
        result = command()
        assert result.returncode == 1, (name, result.returncode, result.stderr[-3000:])  # a bus error: -7
        assert one_line_error(result, message) == f"error: {message}", name
