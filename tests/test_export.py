"""scripts/export.py: ONNX and a torch.export program (.pt2) with a dynamic batch and width, checked against
PyTorch."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data.transforms import ImageTransform, Preprocessing
from tests.conftest import REPO, read_lmdb, run_env, write_images
from training.checkpoint import load_model
from utils.config import load_config

WIDTH = load_config("crnn.yaml", []).data.img_width


@pytest.fixture(scope="module")
def checkpoint(tiny_run) -> Path:
    return tiny_run / "best.pt"


def export(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "export.py"), *args],
                          env={**run_env(), **extra_env}, capture_output=True, text=True, timeout=300)


@torch.inference_mode()
def assert_matches_pytorch(run, checkpoint: Path, synth: Path) -> None:
    """`run` (images -> logits) gives PyTorch's logits and texts at batch sizes 1 and 3, widths 100 and 160."""
    model, codec, config, _ = load_model(checkpoint, "cpu")
    images = [image_bytes for image_bytes, _ in read_lmdb(synth / "val")[:3]]
    for width in (100, 160):
        batch = torch.stack([ImageTransform(Preprocessing(32, width))(image_bytes) for image_bytes in images])  # [3, 1, 32, W]
        for size in (1, 3):
            expected, actual = model(batch[:size]), run(batch[:size])
            assert actual.shape == (size, width // 4 + 1, codec.num_classes)  # T = W/4 + 1
            assert (actual - expected).abs().max().item() < 1e-4
            assert [text for text, _ in codec.decode(actual)] == [text for text, _ in codec.decode(expected)]


def assert_passing_report(stdout: str, images: int, runs: int, sizes: str) -> None:
    lines = stdout.splitlines()
    assert lines[-4].startswith(f"{images} images, {runs} runs: batch sizes {sizes}; widths ")
    difference = float(lines[-3].removeprefix("max abs logit difference: ").split()[0])
    assert difference < 1e-4 and lines[-3].endswith("(tolerance 0.001)")
    texts = 3 * images  # each image in the two batches and alone
    assert lines[-2:] == [f"decoded texts identical: {texts} of {texts}", "check passed"]


@pytest.mark.slow
def test_onnx_export_checks_itself_on_rendered_images_and_runs_under_onnxruntime(checkpoint, synth):
    onnxruntime = pytest.importorskip("onnxruntime")
    result = export(str(checkpoint), "--format", "onnx")
    assert result.returncode == 0, result.stdout + result.stderr
    out = checkpoint.with_name("best.onnx")
    assert result.stdout.startswith(f"exported onnx to {out} (")
    assert "images [batch, 1, 32, width] -> logits [batch, frames, 37]" in result.stdout
    assert "checking against PyTorch on images rendered by scripts/make_synthetic.py" in result.stdout
    assert_passing_report(result.stdout, images=6, runs=8, sizes="1, 6")

    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [axis for axis in session.get_inputs()[0].shape] == ["batch", 1, 32, "width"]
    assert_matches_pytorch(lambda images: torch.from_numpy(session.run(None, {"images": images.numpy()})[0]),
                           checkpoint, synth)
    described = json.loads(session.get_modelmeta().custom_metadata_map["crnn"])
    assert described["alphabet"] == "0123456789abcdefghijklmnopqrstuvwxyz"
    assert described["preprocessing"] == {"height": 32, "width": WIDTH, "color": "L", "keep_aspect": False,
                                          "interpolation": "bilinear", "mean": [0.5], "std": [0.5],
                                          "padding": "replicate"}


@pytest.mark.slow
def test_pt2_export_checks_itself_on_a_folder_and_an_lmdb(checkpoint, synth, tmp_path):
    write_images(synth, tmp_path / "images", 2)
    out = tmp_path / "exported" / "crnn.pt2"
    result = export(str(checkpoint), "--format", "pt2", "--out", str(out),
                    "--check", str(tmp_path / "images"), str(synth / "val"), "--check-limit", "4")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"checking against PyTorch on images from {tmp_path / 'images'}, {synth / 'val'}" in result.stdout
    assert_passing_report(result.stdout, images=4, runs=6, sizes="1, 4")

    extra = {"crnn.json": ""}
    program = torch.export.load(out, extra_files=extra)
    assert_matches_pytorch(program.module(), checkpoint, synth)
    assert json.loads(extra["crnn.json"])["alphabet"] == "0123456789abcdefghijklmnopqrstuvwxyz"


@pytest.mark.slow
def test_without_onnxruntime_the_onnx_check_is_skipped_with_a_message(checkpoint, tmp_path, monkeypatch, capsys):
    from scripts.export import main

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    out = tmp_path / "model.onnx"
    monkeypatch.setattr(sys, "argv", ["export.py", str(checkpoint), "--format", "onnx", "--out", str(out)])
    assert main() == 0
    assert out.is_file()
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"onnxruntime is not installed: {out} was not run, and not compared with PyTorch"
        " (pip install -r requirements-export.txt)")


@torch.inference_mode()
def test_the_check_fails_on_differing_logits_or_texts(checkpoint, synth):
    from scripts.export import check_batches, compare

    model, codec, _, preprocessing = load_model(checkpoint, "cpu")
    batches = check_batches([(f"val{i}", image) for i, (image, _) in enumerate(read_lmdb(synth / "val")[:2])],
                            preprocessing)
    assert compare(model, model, codec, batches, 1e-3)[-1] == "check passed"
    assert [images.shape[0] for _, images in batches] == [2, 2, 1, 1]

    noisy = compare(model, lambda images: model(images) + 2e-3, codec, batches, 1e-3)  # same argmax, same texts
    assert noisy[-1] == "check FAILED: logits differ"
    assert "max abs logit difference: 2.00e-03 (tolerance 0.001)" in noisy
    assert "decoded texts identical: 6 of 6" in noisy

    def next_class(images):  # every frame's argmax moved to the next class: other texts
        logits = model(images)  # [B, T, classes]
        return torch.nn.functional.one_hot((logits.argmax(-1) + 1) % codec.num_classes, codec.num_classes) * 100.0

    wrong = compare(model, next_class, codec, batches, 1e-3)
    assert wrong[-1] == "check FAILED: texts differ and logits differ"
    assert any(line.startswith(f"  differs: val0 at width {WIDTH}: ") for line in wrong)

    def fixed_width(images):  # what the torch.export-based ONNX exporter produced: T frozen at the traced width's
        if images.shape[3] != WIDTH:
            raise RuntimeError("cannot reshape to {26,-1,64}")
        return model(images)

    assert compare(model, fixed_width, codec, batches, 1e-3) == [
        f"check FAILED: the exported model failed on images (2, 1, 32, {2 * WIDTH}): cannot reshape to {{26,-1,64}}"]
