"""What a run leaves for people watching it: TensorBoard scalars and decoded validation samples, and
how many samples each training set gave when the sets are mixed by ratio."""

from __future__ import annotations

import json
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from evaluation.visualize import IMAGE_BOX, PAD
from tests.conftest import SMALL_RUN, run_command

pytestmark = pytest.mark.slow  # starts real processes: `pytest -m "not slow"` skips it


def test_mixed_datasets_and_tensorboard(synth, tmp_path):
    out_dir = tmp_path / "run"
    train, val = synth / "train", synth / "val"
    result = run_command(
        sys.executable,
        "train.py",
        "--config",
        "crnn.yaml",
        f"data.train=[{train},{val}]",
        "data.train_ratios=[3,1]",
        f"data.val=[{val}]",
        f"train.out_dir={out_dir}",
        *SMALL_RUN,
        "train.max_steps=4",
        "train.log_every=2",
        "train.eval_every=4",
        "train.tensorboard=true",  # what this test reads
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    drawn = [r["drawn"] for r in records if "drawn" in r]
    assert drawn == [{str(train): 12, str(val): 4}] * 2  # 2 steps of 6 + 2 per log line

    events = EventAccumulator(str(out_dir / "tensorboard"), size_guidance={"images": 0}).Reload()
    scalars = events.Tags()["scalars"]
    assert {"train/loss", "train/lr", "train/images_per_s", "train/data_wait_share", "val/val/accuracy"} <= set(scalars)
    assert "val/val/cer" in scalars
    assert all(0 <= r["data_wait_share"] <= 1 for r in records if "lr" in r)
    assert [event.step for event in events.Scalars("train/loss")] == [2, 4]
    [samples] = events.Images("val/samples")
    assert samples.step == 4 and samples.width == 4 * (IMAGE_BOX[0] + 2 * PAD)  # a grid of 4 columns
