"""Calibrated confidence: the calibration error, the temperature's fit, its fold into the classifier,
scripts/calibrate.py, eval.sh's report of it, predict.py's confidences, and train.py's end-of-run fit."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from data.codec import CTCCodec
from evaluation.calibration import (
    FrameCollector,
    confidences,
    expected_calibration_error,
    fit_temperature,
    greedy_frames,
    join_frames,
    join_samples,
)
from models import build_model
from tests.conftest import ALPHABET, REPO, TORCHRUN_TWO, one_line_error, run_command, train_small, write_images
from training.checkpoint import (
    CheckpointError,
    classifier_keys,
    fold_temperature,
    load_checkpoint,
    save_checkpoint,
)


def test_calibration_error_is_the_share_weighted_gap_of_each_bin():
    # Bin 14 (0.95): half right, a gap of 0.45; bin 2 (0.15): none right, a gap of 0.15; each holds half.
    confidence = torch.tensor([0.95, 0.95, 0.15, 0.15])
    correct = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert expected_calibration_error(confidence, correct) == pytest.approx(0.5 * 0.45 + 0.5 * 0.15)
    assert expected_calibration_error(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])) == 0.0


def random_logits(count: int, seed: int = 0) -> torch.Tensor:
    """`[count, 12, 6]` logits whose greedy readings have varied lengths and confidences."""
    generator = torch.Generator().manual_seed(seed)
    return 3 * torch.randn(count, 12, 6, generator=generator)


def test_greedy_frames_give_the_codecs_confidence_at_temperature_one():
    codec = CTCCodec("abcde")
    logits = random_logits(50)
    readings = codec.decode(logits)
    frames = join_frames(greedy_frames(logits), [False] * 50)
    assert confidences(frames).tolist() == pytest.approx([reading.confidence for reading in readings], rel=1e-5)
    assert confidences(frames, 2.0).tolist() == pytest.approx(
        [reading.confidence for reading in codec.decode(logits / 2.0)], rel=1e-5
    )


def test_the_fit_recovers_the_temperature_the_correctness_was_drawn_at():
    logits = random_logits(4000, seed=1)
    frames = join_frames(greedy_frames(logits), [False] * 4000)
    truth = confidences(frames, 2.0)  # what a reading's chance of being right is
    correct = (torch.rand(4000, generator=torch.Generator().manual_seed(2), dtype=torch.float64) < truth).tolist()
    assert fit_temperature(join_frames(greedy_frames(logits), correct)) == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize(
    "arch, settings",
    [
        ("crnn", {"cnn_shortcut": True}),
        ("crnn", {"lstm_layers": 0}),
        ("crnn_pytorch", {}),
        ("dtrb_vgg", {"channels": 32}),
    ],
)
def test_folding_the_temperature_divides_every_architectures_logits(arch, settings):
    torch.manual_seed(0)
    model = build_model(arch, 7, 1, 16, **settings).eval()
    images = torch.rand(3, 1, 32, 64)
    with torch.no_grad():
        expected = model(images) / 1.7
        fold_temperature(model, 1.7, 7, SimpleNamespace(channels=1, height=32, width=64), "model.pt")
        assert torch.allclose(model(images), expected, atol=1e-5)


def test_a_model_whose_hidden_layer_is_as_wide_as_its_classes_is_refused_not_miscalibrated():
    # dtrb_vgg's BiLSTM projection has hidden_size rows: with 16 classes it looks like a classifier too.
    model = build_model("dtrb_vgg", 16, 1, 16, channels=32).eval()
    with pytest.raises(CheckpointError, match="a temperature cannot be applied to this model"):
        fold_temperature(model, 1.7, 16, SimpleNamespace(channels=1, height=32, width=64), "model.pt")


@pytest.mark.parametrize("value", [-1.0, 0, math.nan, "hot", True])
def test_a_bad_temperature_is_refused_by_name(checkpoint, tmp_path, value):
    bad = tmp_path / "bad.pt"
    save_checkpoint(bad, {**load_checkpoint(checkpoint), "temperature": value})
    with pytest.raises(CheckpointError, match=f"{bad}: its 'temperature' is .*not a temperature"):
        load_checkpoint(bad)


def test_predict_names_a_bad_temperature_in_one_line(checkpoint, synth, tmp_path):
    bad = tmp_path / "bad.pt"
    save_checkpoint(bad, {**load_checkpoint(checkpoint), "temperature": -2.0})
    image = write_images(synth, tmp_path / "images", 1)[0]
    result = run_command(sys.executable, REPO / "scripts" / "predict.py", bad, image, cwd=None)
    one_line_error(result, str(bad), "'temperature'")


@pytest.mark.parametrize(
    "problem, fragments",
    [
        ("missing LMDB", ("nowhere",)),
        ("--out a folder", ("--out", "is a folder")),
        ("--batch-size 0", ("--batch-size 0",)),
    ],
)
def test_calibrate_py_refuses_bad_input_in_one_line(checkpoint, synth, tmp_path, problem, fragments):
    lmdb, out, options = synth / "val", tmp_path / "calibrated.pt", []
    if problem == "missing LMDB":
        lmdb = tmp_path / "nowhere"
    elif problem == "--out a folder":
        out = tmp_path
    else:
        options = ["--batch-size", "0"]
    result = run_command(sys.executable, "scripts/calibrate.py", checkpoint, lmdb, "--out", out, *options)
    one_line_error(result, *fragments)
    assert not (tmp_path / "calibrated.pt").exists()


@pytest.fixture(scope="module")
def confident(checkpoint, tmp_path_factory) -> Path:
    """tiny_run's best.pt with its blank suppressed and its classifier sharpened: it reads every image, wrongly,
    and is sure of it; an overconfident model for the fit to correct."""
    path = tmp_path_factory.mktemp("confident") / "confident.pt"
    weights = load_checkpoint(checkpoint)
    weights.pop("temperature", None)
    weights.pop("calibration", None)
    model = weights["model"]
    for key in classifier_keys(model, len(ALPHABET) + 1):
        model[key] = model[key] * 4
        if key.endswith("bias"):
            model[key][0] -= 10
    save_checkpoint(path, weights)
    return path


def predictions(checkpoint: Path, images: list[Path]) -> list[tuple[str, float]]:
    result = run_command(
        sys.executable,
        REPO / "scripts" / "predict.py",
        checkpoint,
        *images,
        "--precision",
        "fp32",
        cwd=None,
        check=True,
    )
    return [(line.split("\t")[1], float(line.split("\t")[2])) for line in result.stdout.splitlines()]


@pytest.mark.slow
def test_calibrate_py_stores_a_temperature_that_eval_and_predict_apply(confident, synth, tmp_path):
    calibrated, results, picture = tmp_path / "calibrated.pt", tmp_path / "eval.json", tmp_path / "reliability.png"
    fit = run_command(sys.executable, "scripts/calibrate.py", confident, synth / "val", "--out", calibrated, check=True)
    assert "temperature" in fit.stdout and "fitted on 33 readings" in fit.stdout
    stored = load_checkpoint(calibrated)
    assert stored["temperature"] > 1.5  # sure and wrong: the fit softens it
    assert stored["calibration"]["readings"] == 33 and stored["calibration"]["metric_mode"] == "benchmark"
    raw_weights = load_checkpoint(confident)["model"]
    assert all(torch.equal(stored["model"][key], raw_weights[key]) for key in raw_weights)  # the weights stay raw

    evaluated = run_command(
        "bash", "scripts/eval.sh", calibrated, synth / "val", "--json", results, "--reliability", picture,
        "--precision", "fp32", env={"PYTHON": sys.executable}, check=True,
    )  # fmt: skip
    assert "expected calibration error" in evaluated.stdout and f"reliability diagram: {picture}" in evaluated.stdout
    figures = json.loads(results.read_text())["combined"]["calibration"]
    assert figures["temperature"] == pytest.approx(stored["temperature"])
    assert figures["ece_after"] < figures["ece_before"]
    assert figures["ece_before"] == pytest.approx(stored["calibration"]["ece_before"], abs=1e-4)
    with Image.open(picture) as image:
        assert image.format == "PNG"

    images = write_images(synth, tmp_path / "images", 6)
    raw, fitted = predictions(confident, images), predictions(calibrated, images)
    assert [text for text, _ in fitted] == [text for text, _ in raw] and all(text for text, _ in raw)
    assert all(after < before for (_, before), (_, after) in zip(raw, fitted))

    # A refit starts from the raw weights: the same temperature, not one stacked on the first.
    run_command(sys.executable, "scripts/calibrate.py", calibrated, synth / "val", "--out", calibrated, check=True)
    assert load_checkpoint(calibrated)["temperature"] == pytest.approx(stored["temperature"], rel=1e-6)


@pytest.mark.slow
def test_eval_of_an_uncalibrated_checkpoint_reports_the_raw_calibration_error(confident, synth, tmp_path):
    results = tmp_path / "eval.json"
    evaluated = run_command(
        "bash", "scripts/eval.sh", confident, synth / "val", "--json", results, "--precision", "fp32",
        env={"PYTHON": sys.executable}, check=True,
    )  # fmt: skip
    assert "not calibrated" in evaluated.stdout
    figures = json.loads(results.read_text())["sets"][0]["calibration"]
    assert figures["temperature"] == 1.0 and figures["ece_before"] == figures["ece_after"] > 0


def test_training_ends_by_calibrating_best_pt_on_data_val(tiny_run):
    best = load_checkpoint(tiny_run / "best.pt")
    assert best["calibration"]["readings"] == 33 and best["calibration"]["metric_mode"] == "exact"
    assert best["calibration"]["fitted_on"] == [os.path.abspath(best["config"]["data"]["val"][0])]
    assert 0.05 <= best["temperature"] <= 20  # 4 steps read little, and wrongly: a high temperature
    assert best["calibration"]["ece_after"] <= best["calibration"]["ece_before"]


@pytest.mark.slow
def test_two_processes_calibrate_best_pt_on_all_of_data_val(synth, tmp_path):
    out_dir = tmp_path / "run"
    steps = ("train.max_steps=4", "train.eval_every=4", "train.log_every=4")
    result = train_small(synth, out_dir, *steps, launcher=TORCHRUN_TWO, check=True)
    assert "calibrated best.pt on data.val: temperature " in result.stdout
    assert "(33 crops)" in result.stdout
    assert load_checkpoint(out_dir / "best.pt")["calibration"]["readings"] == 33
    off = train_small(synth, tmp_path / "off", *steps, "train.calibrate=false", check=True)
    assert "calibrated" not in off.stdout and "temperature" not in load_checkpoint(tmp_path / "off" / "best.pt")


def test_collected_samples_merge_in_key_order():
    codec = CTCCodec("abcde")
    logits = random_logits(4)
    collector = FrameCollector(codec, "exact")
    collector(SimpleNamespace(labels=["a", "b", "c", "d"]), codec.decode(logits), logits)
    merged = join_samples(list(reversed(collector.samples)))
    assert confidences(merged).tolist() == pytest.approx([reading.confidence for reading in codec.decode(logits)])
