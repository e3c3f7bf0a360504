"""Bad input, round 3, in the data: LMDB headers the keys contradict, images a viewer shows otherwise
than Pillow's plain decode, GT files and alphabets the data tools must not store, and the staging
folders a killed writer leaves behind. Each test is a row of docs/bad-input.md."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch
from PIL import Image

from data.codec import CTCCodec
from data.lmdb_dataset import LmdbDataset
from data.lmdb_writer import staging_prefix, write_lmdb
from data.transforms import ImageTransform, Preprocessing, decode_image, image_size
from synthetic.backgrounds import load_photo
from tests.conftest import ALPHABET, REPO, read_lmdb, run_command, start_command
from tests.test_lmdb_dataset import edit_lmdb, png

WHITE, BLACK = 1.0, -1.0
WORDS = ["one", "two", "three", "four", "five"]


def encode(image: Image.Image, image_format: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **options)
    return buffer.getvalue()


def dataset(path: Path, alphabet: str = ALPHABET, **options) -> LmdbDataset:
    return LmdbDataset(path, CTCCodec(alphabet), 26, ImageTransform(Preprocessing(32, 100)), **options)


def script(name: str, *args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """scripts/NAME, by its full path: `cwd` may be elsewhere."""
    return run_command(sys.executable, REPO / "scripts" / name, *args, cwd=cwd, timeout=120)


def run_main(main, *args: str | Path, capsys) -> tuple[int | str, str, str]:
    """A command's main() in this process, where the entry point does not matter: (exit code or
    sys.exit's message, stdout, stderr)."""
    try:
        main([str(arg) for arg in args])
        code: int | str = 0
    except SystemExit as exit_:
        code = exit_.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def raw_lmdb(path: Path, entries: dict[bytes, bytes]) -> Path:
    """An LMDB holding exactly `entries`, as another converter might have written it."""
    env = lmdb.open(str(path), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for key, value in entries.items():
            txn.put(key, value)
    env.close()
    return path


# D. The keys decide, not the header.


@pytest.mark.parametrize("num_samples", [3, 0])
def test_samples_beyond_num_samples_are_read_and_reported_also_through_the_cache(tmp_path, num_samples):
    path = tmp_path / "undercounted"
    write_lmdb(path, [(png(), word) for word in WORDS])
    edit_lmdb(path, put={b"num-samples": b"%d" % num_samples})
    expected = (
        f"{path}: kept 5 of 5; dropped: none\n  num-samples is {num_samples} but 5 samples exist: all of them"
        " are read; num-samples is wrong (scripts/create_lmdb.py writes it)"
    )
    scanned = dataset(path, index_cache=tmp_path / "cache")
    cached = dataset(path, index_cache=tmp_path / "cache")
    assert "labels scanned" in scanned.report.source and "index read from" in cached.report.source
    for each in (scanned, cached):
        assert each.report.summary() == expected
        assert [each[i][1] for i in range(len(each))] == WORDS


def test_a_sample_at_index_zero_is_read(tmp_path):
    """A converter counting from 0 (keys 0..2, num-samples 3): no sample is left out, and no miscount is claimed."""
    path = raw_lmdb(
        tmp_path / "zero_based",
        {
            b"num-samples": b"3",
            **{
                key: value
                for index, word in enumerate(WORDS[:3])
                for key, value in ((b"image-%09d" % index, png()), (b"label-%09d" % index, word.encode()))
            },
        },
    )
    data = dataset(path)
    assert data.report.summary() == f"{path}: kept 3 of 3; dropped: none"
    assert [data[i][1] for i in range(len(data))] == WORDS[:3]


def test_an_lmdb_without_samples_or_without_a_usable_one_is_an_error_naming_it(tmp_path):
    empty = raw_lmdb(tmp_path / "empty", {b"num-samples": b"0"})
    unpadded = raw_lmdb(
        tmp_path / "unpadded",
        {b"num-samples": b"2", b"image-1": png(), b"label-1": b"one", b"image-2": png(), b"label-2": b"two"},
    )  # keys of another format
    for path, num_samples in ((empty, 0), (unpadded, 2)):
        with pytest.raises(
            ValueError,
            match=rf"^{path}: the LMDB holds no samples under the format's keys "
            rf"\(image-000000001, label-000000001, ...; num-samples is {num_samples}\):"
            r" nothing to train or evaluate on; .* scripts/inspect_lmdb.py lists",
        ):
            dataset(path)
    greek = tmp_path / "greek"
    write_lmdb(greek, [(png(), "αβγ"), (png(), "δ")])
    with pytest.raises(ValueError) as error:
        dataset(greek)
    assert str(error.value).startswith(f"{greek}: kept 0 of 2; dropped: 2 characters outside the alphabet\n")
    assert f"no sample of {greek} is usable (why: above), so there is nothing to train or evaluate on" in str(
        error.value
    )


@pytest.mark.slow
def test_eval_on_an_lmdb_without_samples_is_one_line_not_an_accuracy(tiny_run, tmp_path):
    empty = raw_lmdb(tmp_path / "empty", {b"num-samples": b"0"})
    result = script("eval.py", tiny_run / "best.pt", empty)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {empty}: the LMDB holds no samples")
    assert "accuracy" not in result.stdout.lower()


def test_inspect_lmdb_agrees_with_training_on_which_samples_exist(tmp_path, capsys):
    from scripts.inspect_lmdb import main

    undercounted = tmp_path / "undercounted"
    write_lmdb(undercounted, [(png(), word) for word in WORDS])
    edit_lmdb(undercounted, put={b"num-samples": b"3"})
    _, out, _ = run_main(main, undercounted, capsys=capsys)
    assert "samples beyond num-samples, up to index 5: training and eval read them all" in out
    assert "scanned: samples 1 to 5 (all)" in out
    zero_based = raw_lmdb(
        tmp_path / "zero_based", {b"num-samples": b"1", b"image-000000000": png(), b"label-000000000": b"one"}
    )
    _, out, _ = run_main(main, zero_based, capsys=capsys)
    assert "index 0 holds a sample: the format counts from 1" in out and "scanned: samples 0 to 0 (all)" in out
    assert "num-samples is wrong" not in out  # one sample, at index 0: as num-samples says
    code, out, _ = run_main(main, raw_lmdb(tmp_path / "empty", {b"num-samples": b"0"}), capsys=capsys)
    assert code == 0 and "scanned: no samples; training and eval refuse an LMDB without samples" in out


def test_inspect_lmdb_counts_labels_that_are_not_utf8_and_reads_them_as_training_does(tmp_path, capsys):
    from scripts.inspect_lmdb import main

    latin1 = raw_lmdb(
        tmp_path / "latin1",
        {
            b"num-samples": b"2",
            b"image-000000001": png(),
            b"image-000000002": png(),
            b"label-000000001": "CAFÉ".encode("latin-1"),
            b"label-000000002": b"Tea",
        },
    )
    code, out, _ = run_main(main, latin1, "--fold-case", "--alphabet", ALPHABET, capsys=capsys)
    assert code == 0
    assert "labels not valid UTF-8: 1 (#1); training reads them with U+FFFD in place of the bad bytes" in out
    assert "label length (lowercased):" in out and "min 3, median 3, max 4" in out  # caf + U+FFFD: 4 characters
    assert "(U+FFFD REPLACEMENT CHARACTER): 1" in out


# E. Images are read as a viewer shows them.


def black_then_white() -> Image.Image:
    """60 x 20: the left half black, the right half white, as a viewer must show it."""
    image = Image.new("L", (60, 20), 255)
    image.paste(0, (0, 0, 30, 20))
    return image


# The transpose that stores the upright image so that EXIF orientation N turns it back.
STORED = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def with_orientation(orientation: int, image_format: str) -> bytes:
    stored = black_then_white() if STORED[orientation] is None else black_then_white().transpose(STORED[orientation])
    exif = Image.Exif()
    exif[0x0112] = orientation  # Orientation
    return encode(stored, image_format, exif=exif if image_format == "TIFF" else exif.tobytes())


@pytest.mark.parametrize("image_format", ["JPEG", "PNG", "TIFF", "WEBP"])
def test_exif_orientation_is_applied_as_a_viewer_shows_it(image_format):
    transform = ImageTransform(Preprocessing(20, 100, keep_aspect=True), width_step=4)
    for orientation in STORED:
        image_bytes = with_orientation(orientation, image_format)
        upright = decode_image(image_bytes, "L")
        assert upright.size == image_size(image_bytes) == (60, 20), orientation
        tensor = transform(image_bytes)  # what training, eval and predict.py feed the model
        assert tensor.shape == (1, 20, transform.padded_width(*image_size(image_bytes))), orientation
        assert tensor[..., :20].max() < BLACK + 0.1 and tensor[..., 40:60].min() > WHITE - 0.1, orientation


def test_a_turned_image_lands_in_the_width_bucket_of_its_upright_size(tmp_path):
    """Evaluation batches images by the padded width their header gives: it must be the decoded one."""
    path = tmp_path / "phone"
    write_lmdb(path, [(with_orientation(6, "JPEG"), "ab"), (png(100, 20), "cd")])
    data = LmdbDataset(
        path, CTCCodec(ALPHABET), 26, ImageTransform(Preprocessing(32, 200, keep_aspect=True), width_step=8)
    )
    assert data.padded_widths().tolist() == [data[i][0].shape[-1] for i in range(len(data))] == [96, 160]


def bands(values: list[float], dtype: str) -> Image.Image:
    """Vertical bands of `values`, 30 pixels wide each, 10 high."""
    return Image.fromarray(np.repeat(np.array(values, dtype=dtype), 30)[None, :].repeat(10, axis=0))


@pytest.mark.parametrize(
    "kind, image_bytes, expected",
    [
        ("float 0..1 TIFF", encode(bands([0.0, 0.5, 1.0], "<f4"), "TIFF"), [BLACK, 0.0, WHITE]),
        ("float 0..255 TIFF", encode(bands([0.0, 127.5, 255.0], "<f4"), "TIFF"), [BLACK, 0.0, WHITE]),
        (
            "float TIFF with NaN and a negative value",
            encode(bands([np.nan, -3.0, 1.0], "<f4"), "TIFF"),
            [BLACK, BLACK, WHITE],
        ),
        ("32-bit integer TIFF of 8-bit values", encode(bands([0, 128, 255], "<i4"), "TIFF"), [BLACK, 0.0, WHITE]),
        ("32-bit integer TIFF of 16-bit values", encode(bands([0, 32768, 65535], "<i4"), "TIFF"), [BLACK, 0.0, WHITE]),
        (
            "32-bit integer TIFF of 31-bit values",
            encode(bands([0, 2**30, 2**31 - 1], "<i4"), "TIFF"),
            [BLACK, 0.0, WHITE],
        ),
        ("dark 16-bit PNG", encode(bands([0, 255, 65535], "<u2"), "PNG"), [BLACK, BLACK, WHITE]),
    ],
)
def test_wide_images_are_read_as_a_viewer_shows_them(kind, image_bytes, expected):
    """Before: the float images and the 8-bit values in 32 bits all read black (-1.0)."""
    image = ImageTransform(Preprocessing(10, 90))(image_bytes)
    middles = [image[0, :, 30 * band + 10 : 30 * band + 20] for band in range(3)]
    for middle, value in zip(middles, expected):
        assert torch.allclose(middle, torch.full_like(middle, value), atol=0.02), (kind, middle.mean(), value)


# F. The data tools refuse or report what they should not store.


def gt_folder(tmp_path: Path, lines: list[str]) -> tuple[Path, Path]:
    """Images a.png, b.png and c.png, and a GT file of `lines`."""
    root = tmp_path / "images"
    root.mkdir()
    for name in "abc":
        black_then_white().save(root / f"{name}.png")
    gt = tmp_path / "gt.txt"
    gt.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root, gt


def test_create_lmdb_refuses_a_third_column_and_writes_nothing(tmp_path, capsys):
    from scripts.create_lmdb import main

    root, gt = gt_folder(tmp_path, ["a.png\tcat", "b.png\tdog\t0.93", "c.png\t17\tcow"])
    code, _, _ = run_main(main, "--images", root, "--gt", gt, "--out", tmp_path / "out", capsys=capsys)
    assert code == (
        f"error: --gt {gt}: 2 line(s) have more than two tab-separated columns; a line is path<TAB>label"
        " and a label holds no tab: keep the two columns (e.g. cut -f1,2), nothing was written:\n"
        "  line 2: 'b.png\\tdog\\t0.93' has 3 columns\n  line 3: 'c.png\\t17\\tcow' has 3 columns"
    )
    assert sorted(os.listdir(tmp_path)) == ["gt.txt", "images"]


def test_create_lmdb_stores_labels_without_surrounding_whitespace_and_lists_them_first(tmp_path, capsys):
    from scripts.create_lmdb import main

    root, gt = gt_folder(tmp_path, ["a.png\t cat", "b.png\tdog ", "./b.png\tdog", "c.png\tred fox"])
    out = tmp_path / "out"
    code, stdout, _ = run_main(main, "--images", root, "--gt", gt, "--out", out, capsys=capsys)
    assert code == 0
    assert (
        f"2 label(s) stored without their surrounding whitespace (a word crop has none for the model to read);"
        f" fix {gt} if a label was cut elsewhere:\n  line 1: ' cat' -> 'cat'\n  line 2: 'dog ' -> 'dog'"
    ) in stdout
    assert stdout.index("surrounding whitespace") < stdout.index("wrote 3 samples")
    # 'dog ' and 'dog' are one label now: the image listed twice is stored once, not refused as two labels.
    assert [label for _, label in read_lmdb(out)] == ["cat", "dog", "red fox"]


def test_create_lmdb_checks_an_image_as_training_decodes_it(tmp_path, capsys):
    """A float TIFF passes the check and is stored as it is; training reads it as a viewer shows it."""
    from scripts.create_lmdb import main

    root, gt = gt_folder(tmp_path, ["float.tif\tab"])
    (root / "float.tif").write_bytes(encode(bands([0.0, 1.0, 1.0], "<f4"), "TIFF"))
    code, _, _ = run_main(main, "--images", root, "--gt", gt, "--out", tmp_path / "out", capsys=capsys)
    assert code == 0
    image = dataset(tmp_path / "out")[0][0]
    assert image[..., :25].max() < BLACK + 0.05 and image[..., 40:].min() > WHITE - 0.05


def test_create_lmdb_given_a_gt_file_in_utf16_says_to_resave_it(tmp_path, capsys):
    from scripts.create_lmdb import main

    root, gt = gt_folder(tmp_path, [])
    gt.write_text("a.png\tcat\n", encoding="utf-16")  # Windows Notepad's "Unicode"
    code, _, _ = run_main(main, "--images", root, "--gt", gt, "--out", tmp_path / "out", capsys=capsys)
    assert code.startswith(f"error: --gt {gt} is not UTF-8 text") and code.endswith("re-save it as UTF-8")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "alphabet, first", [("abcאבג", "'א', U+05D0 HEBREW LETTER ALEF"), ("0123ابت", "'ا', U+0627 ARABIC LETTER ALEF")]
)
@pytest.mark.slow
def test_make_synthetic_refuses_a_right_to_left_alphabet(tmp_path, alphabet, first):
    result = script("make_synthetic.py", "--out", tmp_path / "out", "--alphabet", alphabet, "--train", "4")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"error: --alphabet: it has 3 right-to-left characters ({first}, ...), which the"
        f" generator cannot draw in one visual order: give a left-to-right alphabet"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["nothing to write", "--out is a file", "a background that is no image"])
def test_make_synthetic_refuses_options_that_cannot_work_before_rendering(tmp_path, case):
    (tmp_path / "a_file").write_text("notes")
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "beach.jpg").write_text("not a photo")
    args, message = {
        "nothing to write": (
            ["--out", tmp_path / "out", "--train", "0", "--val", "0", "--test", "0"],
            "error: --train, --val and --test are all 0: there is nothing to write",
        ),
        "--out is a file": (
            ["--out", tmp_path / "a_file", "--train", "2", "--val", "0", "--test", "0"],
            f"error: {tmp_path / 'a_file'} is a file, not a folder, so {tmp_path / 'a_file' / 'train'}"
            f" cannot be written: give another --out",
        ),
        "a background that is no image": (
            [
                "--out",
                tmp_path / "out",
                "--train",
                "2",
                "--val",
                "0",
                "--test",
                "0",
                "--backgrounds",
                tmp_path / "photos",
            ],
            f"error: background photo {tmp_path / 'photos' / 'beach.jpg'} cannot be read (cannot identify image file",
        ),
    }[case]
    result = script("make_synthetic.py", *args, "--workers", "1")
    assert result.returncode in (1, 2) and "Traceback" not in result.stderr
    assert message in result.stderr and "train:" not in result.stderr  # refused before rendering began
    assert not (tmp_path / "out").exists() and (tmp_path / "a_file").read_text() == "notes"


def test_a_background_photo_cut_short_is_named_when_it_is_drawn(tmp_path):
    photo = tmp_path / "cut.jpg"
    full = encode(Image.new("RGB", (400, 300), "teal"), "JPEG")
    photo.write_bytes(full[: len(full) // 3])  # its header reads well: only drawing it fails
    with pytest.raises(ValueError, match=rf"background photo {photo} cannot be read \(.*truncated.*\); remove it"):
        load_photo(str(photo))


def test_inspect_lmdb_refuses_a_montage_name_pillow_cannot_write_before_scanning(tmp_path, capsys):
    from scripts.inspect_lmdb import main

    path = tmp_path / "set"
    write_lmdb(path, [(png(), "one")])
    code, out, err = run_main(main, path, "--montage", tmp_path / "montage.xyz", capsys=capsys)
    assert code == 2 and "scanned" not in out
    assert (
        f"--montage {tmp_path / 'montage.xyz'}: not a picture file name Pillow can write; end it in .png or .jpg" in err
    )


# G. Nothing left behind.


def test_the_staging_folder_is_removed_on_any_exception_keyboard_interrupt_included(tmp_path):
    def interrupted(error: BaseException):
        yield png(), "one"
        raise error

    for error in (KeyboardInterrupt(), OSError("disk gone")):
        with pytest.raises(type(error)):
            write_lmdb(tmp_path / "out", interrupted(error))
        assert os.listdir(tmp_path) == []
        with pytest.raises(type(error)):  # the folders made for it go too, while nothing else is in them
            write_lmdb(tmp_path / "new" / "train", interrupted(error))
        assert os.listdir(tmp_path) == []


def staging_folders(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.staging.*"))


def start_writer(out: Path) -> tuple[subprocess.Popen, Path]:
    """make_synthetic writing a large train split into `out`, once its staging folder exists."""
    process = start_command(
        sys.executable,
        REPO / "scripts" / "make_synthetic.py",
        "--out",
        out,
        "--train",
        "1000000",
        "--val",
        "0",
        "--test",
        "0",
        "--workers",
        "1",
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 90
    while not staging_folders(out / "train"):
        assert process.poll() is None and time.monotonic() < deadline, "the writer never started writing"
        time.sleep(0.2)
    return process, staging_folders(out / "train")[0]


@pytest.mark.slow
def test_ctrl_c_while_make_synthetic_writes_leaves_no_staging_folder(tmp_path):
    process, staging = start_writer(tmp_path / "synth")
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=60)
    assert process.returncode == 130
    assert not staging.exists() and not (tmp_path / "synth").exists()  # --out was made for this run: gone too


@pytest.mark.slow
def test_a_staging_folder_of_a_killed_writer_is_removed_by_the_next_one_and_a_live_ones_kept(tmp_path):
    out = tmp_path / "synth"
    process, killed = start_writer(out)
    process.kill()
    process.wait(timeout=30)
    assert killed.exists()  # SIGKILL: nothing could clean up
    prefix = staging_prefix(out / "train")
    live = out / f"{prefix}{os.getpid()}.0123abcd"  # this test's own process: alive
    elsewhere = out / f".train.staging.{socket.gethostname()}-other.{killed.name.split('.')[-2]}.0123abcd"
    live.mkdir()
    elsewhere.mkdir()  # another machine's writer, on a shared disk: its process cannot be checked from here
    root, gt = gt_folder(tmp_path, ["a.png\tcat"])
    result = script("create_lmdb.py", "--images", root, "--gt", gt, "--out", out / "train")  # another tool, alike
    assert result.returncode == 0, result.stderr
    assert (
        f"removed {killed}: a staging folder left by an earlier writer of {out / 'train'} (process "
        f"{killed.name.split('.')[-2]}) that was killed before it finished"
    ) in result.stdout
    assert not killed.exists() and live.is_dir() and elsewhere.is_dir()
    assert [label for _, label in read_lmdb(out / "train")] == ["cat"]


@pytest.mark.parametrize(
    "umask, folder_mode, file_mode", [(0o022, 0o755, 0o644), (0o002, 0o775, 0o664), (0o077, 0o700, 0o600)]
)
def test_an_lmdb_gets_the_permissions_the_umask_gives(tmp_path, umask, folder_mode, file_mode):
    previous = os.umask(umask)
    try:
        write_lmdb(tmp_path / "shared", [(png(), "one")])
    finally:
        os.umask(previous)
    assert (tmp_path / "shared").stat().st_mode & 0o777 == folder_mode
    assert {file.name: file.stat().st_mode & 0o777 for file in (tmp_path / "shared").iterdir()} == {
        "data.mdb": file_mode,
        "lock.mdb": file_mode,
    }


def test_export_checks_a_turned_photo_at_the_width_of_its_upright_size():
    """export.py compares each check image alone at its own width: that of the image as the model reads
    it (upright), not of the pixels as stored (a phone photo stored sideways)."""
    from interop.export import check_batches

    sideways = with_orientation(6, "JPEG")  # stored 20 x 60, shown 60 x 20
    [*_, (names, alone)] = check_batches([("phone", sideways)], Preprocessing(32, 100))
    assert names == ["phone"] and alone.shape == (1, 1, 32, 96)  # 60 * 32 / 20, not 20 * 32 / 60
