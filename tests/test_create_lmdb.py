"""scripts/create_lmdb.py on a real folder of good and bad images, run as a real process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from PIL import Image

from tests.conftest import read_lmdb

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "create_lmdb.py"


def run_script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # cwd elsewhere than the repository: the script must find its own imports.
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def save_image(path: Path, image_format: str, color: str) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (40, 16), color).save(path, format=image_format)
    return path.read_bytes()


def test_writes_good_lines_and_reports_each_skip(tmp_path):
    root = tmp_path / "images"
    good = [
        ("a.png", save_image(root / "a.png", "PNG", "red"), "hello"),
        ("sub/b.jpg", save_image(root / "sub" / "b.jpg", "JPEG", "blue"), "café 42"),
        ("c.png", save_image(root / "c.png", "PNG", "white"), "x"),
    ]
    # Half a JPEG: Image.open reads its header, only a full decode notices the missing data.
    jpeg = save_image(root / "full.jpg", "JPEG", "green")
    (root / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    (root / "noise.png").write_bytes(b"not an image at all")
    lines = [
        "a.png\thello",
        "truncated.jpg\tbroken",
        "",
        "sub/b.jpg\tcafé 42",
        "missing.png\tgone",
        "full.jpg\t",
        "full.jpg no tab here",
        "noise.png\tnoise",
        "full.jpg\tHELLO",
        "c.png\tx",
    ]
    gt = tmp_path / "gt.txt"
    gt.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "lmdb"

    alphabet = "abcdefghijklmnopqrstuvwxyzé0123456789 "
    result = run_script(
        "--images", str(root), "--gt", str(gt), "--out", str(out), "--check-alphabet", alphabet, cwd=tmp_path
    )

    assert result.returncode == 0, result.stderr
    assert read_lmdb(out) == [(image_bytes, label) for _, image_bytes, label in good]
    assert "wrote 3 samples" in result.stdout
    expected_skips = {
        "image cannot be decoded": ["line 2: truncated.jpg", "line 8: noise.png"],
        "image file missing": ["line 5: missing.png"],
        "empty label": ["line 6: full.jpg"],
        "line has no tab": ["line 7: full.jpg no tab here"],
        "outside the alphabet": ["line 9: full.jpg (EHLO)"],
    }
    for reason, examples in expected_skips.items():
        assert reason in result.stdout
        for example in examples:
            assert example in result.stdout


def test_missing_gt_file_is_an_error(tmp_path):
    result = run_script(
        "--images", str(tmp_path), "--gt", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "db"), cwd=tmp_path
    )
    assert result.returncode != 0
    assert "--gt" in result.stderr and "nope.txt" in result.stderr
    assert not (tmp_path / "db").exists()


def test_nothing_valid_keeps_the_existing_lmdb(tmp_path):
    gt = tmp_path / "gt.txt"
    gt.write_text("missing.png\tword\n", encoding="utf-8")
    out = tmp_path / "db"
    out.mkdir()
    (out / "keep").write_text("an earlier dataset")

    result = run_script("--images", str(tmp_path), "--gt", str(gt), "--out", str(out), "--overwrite", cwd=tmp_path)

    assert result.returncode != 0
    assert "no valid samples" in result.stderr
    assert "image file missing" in result.stdout
    assert (out / "keep").read_text() == "an earlier dataset"


def test_the_writer_maps_what_the_data_needs_and_grows_when_it_fills(tmp_path, monkeypatch):
    import lmdb

    from data import lmdb_writer

    monkeypatch.setattr(lmdb_writer, "INITIAL_MAP_SIZE", 1 << 20)  # 1 MiB: filled many times over below
    monkeypatch.setattr(lmdb_writer, "COMMIT_EVERY", 7)
    samples = [(bytes([index % 251]) * 20_000, f"w{index}") for index in range(300)]  # 6 MB
    assert lmdb_writer.write_lmdb(tmp_path / "grown", samples) == 300
    assert read_lmdb(tmp_path / "grown") == samples
    env = lmdb.open(str(tmp_path / "grown"), readonly=True, lock=False)
    map_size = env.info()["map_size"]
    env.close()
    assert 6_000_000 < map_size <= 32 << 20  # doubled as needed, not a fixed terabyte
    assert (tmp_path / "grown" / "data.mdb").stat().st_size <= map_size
