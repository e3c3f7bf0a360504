"""The preprocessing travels with the model: a run records it in its checkpoints, and evaluation,
prediction and export apply the checkpoint's record, whatever the code's defaults say."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from data.transforms import ImageTransform, Preprocessing, PreprocessingError
from tests.conftest import REPO, read_lmdb, run_env, train_small, write_images
from training.checkpoint import (
    LEGACY,
    classifier_keys,
    load_checkpoint,
    load_model,
    read_preprocessing,
    save_checkpoint,
)
from training.config import load_config

# A record unlike every default: a transform built from the config instead would feed other numbers.
RECORD = {
    "height": 32,
    "width": 100,
    "color": "L",
    "keep_aspect": False,
    "max_stretch": 2.5,
    "interpolation": "nearest",
    "mean": [0.3],
    "std": [0.2],
    "padding": "replicate",
}


@pytest.fixture(scope="module")
def recorded(tiny_run, tmp_path_factory) -> Path:
    """tiny_run's best.pt with RECORD as its preprocessing (its config keeps the defaults), and a
    classifier sharpened 50 times: the 4-step model reads every image alike, and the test needs
    readings that change with the input."""
    checkpoint = load_checkpoint(tiny_run / "best.pt")
    checkpoint["preprocessing"] = RECORD
    # Uncalibrated: the temperature fitted on the 4-step model's readings (all wrong) would flatten them again.
    for key in ("temperature", "calibration"):
        checkpoint.pop(key, None)
    for key in classifier_keys(checkpoint["model"], len(checkpoint["alphabet"]) + 1):
        checkpoint["model"][key] = checkpoint["model"][key] * 50
    path = tmp_path_factory.mktemp("recorded") / "best.pt"
    save_checkpoint(path, checkpoint)
    return path


@pytest.mark.slow
def test_a_run_records_the_preprocessing_its_config_asks_for(synth, tmp_path):
    out_dir = tmp_path / "run"
    train_small(
        synth,
        out_dir,
        "train.max_steps=2",
        "train.eval_every=2",
        "model.hidden_size=16",
        "data.interpolation=bicubic",
        "data.mean=[0.4]",
        "data.std=[0.25]",
        "data.keep_aspect=true",
        "data.max_stretch=3",
        check=True,
    )
    for name in ("best.pt", "last.pt"):
        record = torch.load(out_dir / name, weights_only=True)["preprocessing"]
        assert record == {
            "height": 32,
            "width": load_config("crnn.yaml", []).data.img_width,
            "color": "L",
            "keep_aspect": True,
            "max_stretch": 3.0,
            "interpolation": "bicubic",
            "mean": [0.4],
            "std": [0.25],
            "padding": "replicate",
        }


def test_load_model_returns_the_checkpoint_record_not_the_config(recorded):
    *_, preprocessing = load_model(recorded)
    assert preprocessing.to_dict() == RECORD


@pytest.mark.slow
def test_predict_and_eval_apply_the_checkpoint_record(recorded, synth, tmp_path):
    samples = read_lmdb(synth / "val")[:6]
    paths = write_images(synth, tmp_path, 6)
    model, codec, _, _ = load_model(recorded)
    with torch.inference_mode():
        expected = codec.decode(
            model(torch.stack([ImageTransform(Preprocessing.from_dict(RECORD, "test"))(image) for image, _ in samples]))
        )
        default = codec.decode(
            model(torch.stack([ImageTransform(Preprocessing(32, 100))(image) for image, _ in samples]))
        )
    # Printed with 4 decimals: a transform other than the record's would be told apart here.
    assert max(abs(a.confidence - b.confidence) for a, b in zip(expected, default)) > 5e-4

    result = subprocess.run(
        [sys.executable, "scripts/predict.py", str(recorded), *map(str, paths), "--precision", "fp32"],
        cwd=REPO,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    read = [
        (text, float(confidence))
        for _, text, confidence, _ in (line.split("\t") for line in result.stdout.splitlines())
    ]
    assert [text for text, _ in read] == [r.text for r in expected]
    assert [confidence for _, confidence in read] == pytest.approx([r.confidence for r in expected], abs=1.5e-4)

    dump = tmp_path / "dump.tsv"
    result = subprocess.run(
        [
            "bash",
            "scripts/eval.sh",
            str(recorded),
            str(synth / "val"),
            "--dump",
            str(dump),
            "--metric-mode",
            "exact",
            "--precision",
            "fp32",
        ],
        cwd=REPO,
        env={**run_env(), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(dump.open(), delimiter="\t"))[:6]
    assert [row["prediction"] for row in rows] == [r.text for r in expected]
    assert [float(row["confidence"]) for row in rows] == pytest.approx([r.confidence for r in expected], abs=1.5e-4)


def test_a_checkpoint_from_before_the_record_gets_the_constants_of_its_time():
    config = {"data": {"img_height": 32, "img_width": 128, "keep_aspect": True}, "model": {"in_channels": 3}}
    preprocessing = read_preprocessing({"config": config}, "old.pt")
    assert preprocessing.to_dict() == {"height": 32, "width": 128, "color": "RGB", "keep_aspect": True, **LEGACY}


def test_a_kept_aspect_ratio_is_stretched_up_to_max_stretch_and_a_record_without_it_stretches_nothing():
    # (width, height) of a crop -> the width it is resized to at height 32, before padding to 128
    crops = {(27, 32): (27, 54), (40, 32): (40, 80), (60, 32): (60, 120), (200, 32): (128, 128), (16, 64): (8, 16)}
    for max_stretch, column in ((1.0, 0), (2.0, 1)):
        transform = ImageTransform(Preprocessing(32, 128, keep_aspect=True, max_stretch=max_stretch))
        assert {crop: transform.resized_width(*crop) for crop in crops} == {
            crop: widths[column] for crop, widths in crops.items()
        }
        image = Image.new("L", (27, 32), 0)
        image.paste(255, (0, 0, 5, 32))  # a white bar on the left: its width says how far it was stretched
        row = transform.to_tensor(image)[0, 16]
        assert row.shape == (128,) and int((row > 0).sum()) == round(5 * max_stretch)
    stretched = ImageTransform(Preprocessing(32, 128, max_stretch=2.0))  # without keep_aspect: always to the width
    assert stretched.resized_width(27, 32) == 128
    before = {key: value for key, value in RECORD.items() if key != "max_stretch"}
    assert Preprocessing.from_dict({**before, "keep_aspect": True}, "old.pt").max_stretch == 1.0


def test_a_record_with_a_step_this_version_cannot_apply_is_an_error_naming_the_file():
    with pytest.raises(
        PreprocessingError, match=r"fork\.pt: its preprocessing has steps this version cannot " r"apply: \['deskew'\]"
    ):
        Preprocessing.from_dict({**RECORD, "deskew": True}, "fork.pt")
    with pytest.raises(
        PreprocessingError,
        match="fork.pt: its preprocessing record is not usable: interpolation: " "'area' is not one of",
    ):
        Preprocessing.from_dict({**RECORD, "interpolation": "area"}, "fork.pt")


def test_a_record_is_checked_against_the_ranges_the_config_keys_have():
    for change, message in (
        ({"height": 0}, r"height=0: must be at least 1"),
        ({"max_stretch": 0.5}, r"max_stretch=0.5: must be at least 1"),
        ({"std": [0.0]}, r"std\[0\]=0.0: must be from 1e-06 to 1000"),
        ({"mean": [0.5, 0.5]}, r"mean=\[0.5, 0.5\]: give 1 value, or one per channel \(1\)"),
    ):
        with pytest.raises(PreprocessingError, match=r"fork\.pt: its preprocessing record is not usable: " + message):
            Preprocessing.from_dict({**RECORD, **change}, "fork.pt")


def test_config_values_are_the_keys_from_config_reads_back():
    preprocessing = Preprocessing.from_dict(
        {**RECORD, "color": "RGB", "keep_aspect": True, "mean": [0.4, 0.5, 0.6]}, "test"
    )
    values = preprocessing.config_values()
    assert values == {
        "img_height": 32,
        "img_width": 100,
        "keep_aspect": True,
        "max_stretch": 2.5,
        "interpolation": "nearest",
        "mean": [0.4, 0.5, 0.6],
        "std": [0.2],
    }
    config = load_config(
        "crnn.yaml",
        [f"data.{key}={value}" for key, value in values.items()] + [f"model.in_channels={preprocessing.channels}"],
    )
    assert Preprocessing.from_config(config) == preprocessing


def test_normalisation_maps_pixels_as_torchvision_does_and_back():
    image = Preprocessing(4, 6, "RGB", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    transform = ImageTransform(image)
    pixels = Image.new("RGB", (6, 4), (255, 128, 0))
    tensor = transform.to_tensor(pixels)
    expected = (torch.tensor([255, 128, 0]) / 255 - torch.tensor(image.mean)) / torch.tensor(image.std)
    torch.testing.assert_close(tensor[:, 0, 0], expected.float())
    assert transform.to_image(tensor).getpixel((0, 0)) == (255, 128, 0)
    default = ImageTransform(Preprocessing(4, 6))
    assert default.to_tensor(Image.new("L", (6, 4), 255)).unique().tolist() == [1.0]
    assert default.to_tensor(Image.new("L", (6, 4), 0)).unique().tolist() == [-1.0]
