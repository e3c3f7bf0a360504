"""A second architecture is one registration away: a toy model, registered through the public registry
in this test only, is trained, saved, evaluated and exported by the project's own entry points, with
its own setting passed from the config to its constructor."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from torch import Tensor, nn

from models import ARCHITECTURES, register_model
from tests.conftest import SMALL_RUN, write_images
from training.checkpoint import load_model
from training.config import ConfigError, load_config, validate

pytestmark = pytest.mark.slow  # trains, evaluates and exports for real


class ToyRecognizer(nn.Module):
    """One convolution, the height averaged away, one linear layer: `[B, C, 32, W] -> [B, W / stride, classes]`."""

    def __init__(self, num_classes: int, in_channels: int, hidden_size: int, stride: int = 4) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(in_channels, hidden_size, 3, stride=(1, stride), padding=1)
        self.classify = nn.Linear(hidden_size, num_classes)

    def forward(self, images: Tensor) -> Tensor:
        features = self.conv(images).relu().mean(dim=2)  # [B, hidden, T]
        return self.classify(features.transpose(1, 2))  # [B, T, num_classes]


@pytest.fixture(scope="module")
def toy_arch():
    register_model("toy")(ToyRecognizer)
    yield "toy"
    del ARCHITECTURES["toy"]


def run_main(module, monkeypatch, argv: list[str]) -> None:
    monkeypatch.setattr(sys, "argv", argv)
    module.main()


def test_a_registered_architecture_trains_saves_evaluates_and_exports(toy_arch, synth, tmp_path, monkeypatch):
    import train
    from scripts import eval as eval_script
    from scripts import export

    out_dir = tmp_path / "toy"
    run_main(
        train,
        monkeypatch,
        [
            "train.py",
            "model.arch=toy",
            f"data.train=[{synth / 'train'}]",
            f"data.val=[{synth / 'val'}]",
            f"train.out_dir={out_dir}",
            *SMALL_RUN,
            "model.hidden_size=16",
            "model.stride=2",
            "train.max_steps=3",
            "train.eval_every=3",
            "train.log_every=3",
        ],
    )
    checkpoint = torch.load(out_dir / "best.pt", weights_only=True)
    assert checkpoint["config"]["model"]["arch"] == "toy" and checkpoint["config"]["model"]["stride"] == 2
    assert set(checkpoint["model"]) == {"conv.weight", "conv.bias", "classify.weight", "classify.bias"}

    model, codec, _, preprocessing = load_model(out_dir / "best.pt")
    assert isinstance(model, ToyRecognizer) and model.stride == 2
    assert model(torch.zeros(1, 1, 32, 128)).shape == (1, 64, codec.num_classes)  # 128 / stride frames

    results = tmp_path / "eval.json"
    run_main(
        eval_script,
        monkeypatch,
        ["eval.py", str(out_dir / "best.pt"), str(synth / "test"), "--json", str(results), "--workers", "0"],
    )
    assert json.loads(results.read_text())["sets"][0]["samples"] == 20  # every test sample, read by the toy model

    exported = tmp_path / "toy.onnx"
    images = write_images(synth, tmp_path / "images", count=4)
    run_main(
        export,
        monkeypatch,
        [
            "export.py",
            str(out_dir / "best.pt"),
            "--format",
            "onnx",
            "--out",
            str(exported),
            "--check",
            str(images[0].parent),
        ],
    )  # onnxruntime's logits against PyTorch's
    assert exported.is_file() and exported.stat().st_size > 0


def test_a_setting_the_architecture_does_not_take_is_a_config_error(toy_arch):
    with pytest.raises(ConfigError, match="model.depth: the toy architecture has no such setting; it takes stride"):
        validate(load_config(None, ["model.arch=toy", "model.depth=3"]))
    with pytest.raises(ConfigError, match="model.channels: the toy architecture has no such setting"):
        validate(load_config("crnn.yaml", ["model.arch=toy"]))  # crnn.yaml's CRNN widths
