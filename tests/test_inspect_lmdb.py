"""scripts/inspect_lmdb.py on a small LMDB with one of each problem, run as a user runs it."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest
from PIL import Image

from tests.conftest import run_command

pytestmark = pytest.mark.slow  # starts real processes: `pytest -m "not slow"` skips it

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "inspect_lmdb.py"


def encoded(width: int, format: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    # Noise, so that the pixel data outweighs the header and a file cut in half keeps its header.
    Image.effect_noise((width, 32), 60).convert("RGB").save(buffer, format=format)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def broken_lmdb(tmp_path_factory) -> Path:
    """7 samples: #2 is not an image, #3's label has '#', #4 has no image key, #6 is a truncated JPEG."""
    root = tmp_path_factory.mktemp("lmdb") / "broken"
    env = lmdb.open(str(root), map_size=1 << 24)
    with env.begin(write=True) as txn:
        samples = {
            1: (encoded(100), "abc"),
            2: (b"not an image", "def"),
            3: (encoded(64), "ab#"),
            4: (None, "ghi"),
            5: (encoded(120, "JPEG"), "hello"),
            6: (encoded(80, "JPEG")[:-400], "cut"),
            7: (encoded(90), "xyz"),
        }
        for index, (image_bytes, label) in samples.items():
            if image_bytes is not None:
                txn.put(b"image-%09d" % index, image_bytes)
            txn.put(b"label-%09d" % index, label.encode())
        txn.put(b"num-samples", b"7")
    env.close()
    (root / "lock.mdb").unlink()  # inspection must not bring it back: it opens read-only
    return root


def inspect(*args: str | Path) -> subprocess.CompletedProcess:
    return run_command(sys.executable, SCRIPT, *args, cwd=None, timeout=120)


def test_reports_each_problem_and_writes_a_montage(broken_lmdb, tmp_path):
    before = hashlib.sha256((broken_lmdb / "data.mdb").read_bytes()).hexdigest()
    montage = tmp_path / "montage.png"
    result = inspect(
        broken_lmdb, "--alphabet", "0123456789abcdefghijklmnopqrstuvwxyz", "--montage", montage, "--samples", "4"
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "num-samples: 7" in out
    assert "image-000000001 .. image-000000007; label-000000001 .. label-000000007; num-samples" in out
    assert "missing keys: 0 labels, 1 images" in out and "image missing at #4" in out
    assert "undecodable images: 1 (reading headers only" in out and "#2: not an image format" in out
    assert "in 1 labels (#3)" in out and "'#' (U+0023 NUMBER SIGN): 1" in out
    assert "min 3, median 3, max 5" in out  # label lengths
    assert "image formats: PNG RGB 3, JPEG RGB 2" in out
    assert "montage: wrote 4 samples (seed 0)" in out
    with Image.open(montage) as image:
        assert image.format == "PNG" and image.width > 500 and image.height > 80
    assert hashlib.sha256((broken_lmdb / "data.mdb").read_bytes()).hexdigest() == before
    assert not (broken_lmdb / "lock.mdb").exists()


def test_decode_finds_truncated_images_and_limit_scans_a_prefix(broken_lmdb):
    result = inspect(broken_lmdb, "--decode", "--limit", "6")
    assert result.returncode == 0, result.stderr
    assert "scanned: samples 1 to 6 of 7 (--limit)" in result.stdout
    assert "undecodable images: 2 (decoding every image)" in result.stdout
    assert "#6: OSError: image file is truncated" in result.stdout


def test_clear_errors_for_what_is_not_an_lmdb(tmp_path):
    missing = inspect(tmp_path / "nothing")
    assert missing.returncode != 0 and "does not exist" in missing.stderr
    empty = inspect(tmp_path)
    assert empty.returncode != 0 and "holds no data.mdb: it is not an LMDB folder" in empty.stderr
    (tmp_path / "data.mdb").write_bytes(b"a text file, not an LMDB\n" * 200)
    junk = inspect(tmp_path)
    assert junk.returncode != 0 and "is not a readable LMDB" in junk.stderr


def test_labels_are_counted_as_training_reads_them_unicode_form_and_case(tmp_path):
    """Decomposed labels (`e` + U+0301, as macOS file names store them) against a composed alphabet:
    training composes them (CTCCodec.normalize), so inspection finds nothing outside the alphabet."""
    root = tmp_path / "nfd"
    with lmdb.open(str(root), map_size=1 << 22) as env, env.begin(write=True) as txn:
        for index, label in enumerate(["Cafe\u0301", "the\u0301", "cafe"], start=1):
            txn.put(b"image-%09d" % index, encoded(64))
            txn.put(b"label-%09d" % index, label.encode())
        txn.put(b"num-samples", b"3")
    result = inspect(root, "--alphabet", "abcdefghijklmnopqrstuvwxyzé", "--fold-case")
    assert result.returncode == 0, result.stderr
    assert (
        "characters outside the alphabet (27 characters from abcdefghijklmnopqrstuvwxyzé): 0 distinct" in result.stdout
    )
    assert "min 3, median 4, max 4" in result.stdout  # `café` is 4 characters, as training counts them
