"""scripts/predict.py on a checkpoint trained for 3 steps: folders, globs, files, broken images, bad paths."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data.transforms import build_transform
from tests.conftest import REPO, run_command, write_images
from training.checkpoint import load_model


def predict(*args: str) -> subprocess.CompletedProcess:
    """predict.py in fp32, the precision the tests' own readings are computed in."""
    return run_command(sys.executable, REPO / "scripts" / "predict.py", *args, "--precision", "fp32", cwd=None)


def parse(stdout: str) -> list[tuple[str, str, str]]:
    """(path, text, confidence) of each line; its fourth column, the characters' probabilities, is checked here."""
    rows = [tuple(line.split("\t")) for line in stdout.splitlines()]
    assert all(len(row) == 4 for row in rows), stdout
    for _, text, confidence, char_probs in rows:
        probs = [float(prob) for prob in char_probs.split()]
        expected = math.prod(probs) ** (2 / math.sqrt(len(probs))) if probs else 0.0  # from the 4-decimal probabilities
        assert len(probs) == len(text) and float(confidence) == pytest.approx(expected, abs=1e-3), stdout
    return [row[:3] for row in rows]


@torch.inference_mode()
def reference(checkpoint: Path, paths: list[str]) -> list[tuple[str, float]]:
    """What load_model + build_transform + codec.decode give for each image alone, as the README shows:
    padded as predict.py pads it (to a multiple of data.eval_width_step where the model keeps the aspect ratio)."""
    model, codec, config, preprocessing = load_model(checkpoint, "cpu")
    transform = build_transform(config, preprocessing)
    readings = [codec.decode(model(transform(Path(path).read_bytes())[None]))[0] for path in paths]
    return [(reading.text, reading.confidence) for reading in readings]


@pytest.mark.slow
def test_folder_glob_and_files_print_one_line_per_image_with_the_models_text(checkpoint, synth, tmp_path):
    folder = write_images(synth, tmp_path / "folder", 4)
    (tmp_path / "folder" / "notes.txt").write_text("not an image")  # a folder means its image files
    globbed = write_images(synth, tmp_path / "globbed", 3, start=4)
    singles = write_images(synth, tmp_path / "singles", 2, start=7)
    result = predict(
        str(checkpoint),
        str(tmp_path / "folder"),
        str(tmp_path / "globbed" / "*.jpg"),
        *map(str, singles),
        "--batch-size",
        "3",
        "--device",
        "cpu",
    )
    assert result.returncode == 0, result.stderr
    rows = parse(result.stdout)
    assert [path for path, _, _ in rows] == [str(path) for path in folder + globbed + singles]
    expected = reference(checkpoint, [path for path, _, _ in rows])
    for (path, text, confidence), (expected_text, expected_confidence) in zip(rows, expected):
        assert len(confidence.split(".")[1]) == 4 and 0 <= float(confidence) <= 1
        # Batches of 3 against batches of 1: the same text; the float may differ in its last bits.
        assert text == expected_text and float(confidence) == pytest.approx(expected_confidence, abs=1.5e-4)


@pytest.mark.slow
def test_an_undecodable_image_is_named_on_stderr_skipped_and_makes_the_exit_status_1(checkpoint, synth, tmp_path):
    good = write_images(synth, tmp_path, 3)
    (tmp_path / "truncated.jpg").write_bytes(good[0].read_bytes()[:40])
    (tmp_path / "empty.png").write_bytes(b"")
    result = predict(str(checkpoint), str(tmp_path), "--batch-size", "2")
    assert result.returncode == 1
    assert [path for path, _, _ in parse(result.stdout)] == [str(path) for path in good]  # all the others
    assert f"{tmp_path / 'truncated.jpg'}: cannot decode (" in result.stderr
    assert f"{tmp_path / 'empty.png'}: cannot decode (not an image format Pillow reads)" in result.stderr
    assert "2 of 5 images could not be decoded and were skipped" in result.stderr


@pytest.mark.slow
def test_a_missing_checkpoint_is_a_clear_error_naming_it(synth, tmp_path):
    image = write_images(synth, tmp_path, 1)[0]
    result = predict(str(tmp_path / "nope.pt"), str(image))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == f"error: checkpoint {tmp_path / 'nope.pt'} does not exist"


def test_inputs_resolve_to_sorted_unique_image_files_and_missing_ones_are_named(tmp_path):
    from data.image_files import image_paths

    for name in ("b.png", "a.JPG", "c.txt", "sub/d.png"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    folder = [str(tmp_path / "a.JPG"), str(tmp_path / "b.png")]
    assert image_paths([str(tmp_path)]) == folder  # image suffixes only, not recursive, sorted
    assert image_paths([str(tmp_path / "b.png"), str(tmp_path)]) == folder[::-1]  # each file once, first place
    assert image_paths([str(tmp_path / "**" / "*.png")]) == [str(tmp_path / "b.png"), str(tmp_path / "sub" / "d.png")]
    (tmp_path / "empty").mkdir()
    for bad, message in [
        ("gone.png", "gone.png does not exist"),
        ("*.tif", "no file matches"),
        ("empty", "folder .* holds no image files"),
    ]:
        with pytest.raises(FileNotFoundError, match=message):
            image_paths([str(tmp_path / bad)])
