"""scripts/plot.py, run as a user runs it, on a hand-written metrics.jsonl."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

pytestmark = pytest.mark.slow  # starts real processes: `pytest -m "not slow"` skips it

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "plot.py"
BLUE, VERMILLION = (0x00, 0x72, 0xB2), (0xD5, 0x5E, 0x00)  # the first two series colours


def plot(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def write_metrics(run: Path) -> None:
    records = []
    for step in (50, 100, 150, 200):
        records.append(
            {
                "time": 1.0,
                "step": step,
                "epoch": 0,
                "lr": 0.001 * step / 200,
                "loss": 30.0 / step,
                "images_per_s": 30 + step / 50,
                "infinite_losses": 0,
                "undecodable_images": int(step == 100),
                "skipped_steps": 0,
            }
        )
    for step in (100, 200):
        for number, root in enumerate(("datasets/synth/val", "datasets/iiit5k")):
            records.append(
                {
                    "time": 1.0,
                    "step": step,
                    "val": root,
                    "samples": 33,
                    "accuracy": step / 400 + number / 10,
                    "cer": 0.5 - step / 500,
                    "one_minus_ned": 0.8,
                }
            )
    lines = [json.dumps(record) for record in records]
    # Lines that are neither kind of record: another tool's event, a record without a step, a line
    # cut short by a crash. All ignored.
    lines += [json.dumps({"event": "tensorboard started"}), json.dumps({"loss": 1.0}), '{"step": 250, "lo']
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_draws_every_curve_into_one_png(tmp_path):
    write_metrics(tmp_path)
    result = plot(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "4 training records, 4 validation records over 2 sets" in result.stdout
    with Image.open(tmp_path / "curves.png") as image:
        assert image.format == "PNG" and 1000 <= image.width <= 3000 and 700 <= image.height <= 2000
        colors = {color for _, color in image.convert("RGB").getcolors(maxcolors=1 << 20)}
    assert BLUE in colors and VERMILLION in colors  # a line for each validation set

    elsewhere = tmp_path / "plots" / "run.png"
    assert plot(tmp_path, "--out", elsewhere).returncode == 0 and elsewhere.is_file()


def test_clear_errors_without_metrics(tmp_path):
    missing_folder = plot(tmp_path / "no-such-run")
    assert missing_folder.returncode != 0 and "run folder" in missing_folder.stderr
    assert "does not exist" in missing_folder.stderr
    no_file = plot(tmp_path)
    assert no_file.returncode != 0 and "metrics.jsonl does not exist" in no_file.stderr
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"event": "started"}) + "\n", encoding="utf-8")
    no_records = plot(tmp_path)
    assert no_records.returncode != 0 and "holds no training or validation record" in no_records.stderr
    assert not (tmp_path / "curves.png").exists()
