"""configs/crnn_gpu.yaml, the recipe for GPUs, and `data.num_workers: auto`, checked on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models import model_from_config
from tests.conftest import train_small
from training.config import load_config, validate
from training.setup import loader_workers_of
from utils.distributed import DistEnv

PAPER_WIDTHS = [64, 128, 256, 256, 512, 512, 512]


def test_the_gpu_recipe_builds_the_papers_network():
    config = load_config("crnn_gpu.yaml", [])
    validate(config)
    model = model_from_config(config.model, num_classes=37)
    assert [layer.out_channels for layer in model.modules() if isinstance(layer, nn.Conv2d)] == PAPER_WIDTHS
    lstms = [layer for layer in model.modules() if isinstance(layer, nn.LSTM)]
    assert [(lstm.hidden_size, lstm.bidirectional) for lstm in lstms] == [(256, True), (256, True)]
    assert config.data.num_workers == "auto" and config.train.max_minutes is None


def test_auto_workers_on_a_gpu_are_the_process_share_of_the_cores_less_one(monkeypatch):
    """What a 16-core node with 2 GPUs under torchrun prints (no GPU is touched: the device is only named)."""
    monkeypatch.setattr("training.setup.usable_cores", lambda: 16)
    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")  # as torchrun sets them
    env = DistEnv(rank=1, local_rank=1, world_size=2, device=torch.device("cuda", 1))
    said = []
    assert loader_workers_of(load_config("crnn_gpu.yaml", []), env, said.append) == 7
    assert said == [
        "data.num_workers auto: 7 loader workers per process (16 cores / 2 processes, one left for each training "
        "process)"
    ]
    assert loader_workers_of(load_config("crnn_gpu.yaml", ["data.num_workers=3"]), env, said.append) == 3
    assert len(said) == 1  # a number is that number, and nothing is said


@pytest.mark.slow
def test_the_gpu_recipe_trains_two_steps_on_the_cpu_with_auto_loading_in_the_process(synth, tmp_path):
    out_dir = tmp_path / "gpu_recipe"
    result = train_small(
        synth,
        out_dir,
        "train.max_steps=2",
        "train.batch_size=4",
        "train.eval_batch_size=8",
        "train.eval_every=2",
        "train.log_every=1",
        "model.hidden_size=256",  # the recipe's own, which SMALL_RUN shrinks
        "data.num_workers=auto",  # the recipe's own, which SMALL_RUN sets to 0
        config="crnn_gpu.yaml",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "data.num_workers auto: 0 loader workers per process (on the CPU the training processes fill the cores "
        "themselves: each loads its own batches)" in result.stdout
    )
    assert "crnn: 8.35 M parameters" in result.stdout
    checkpoint = torch.load(out_dir / "last.pt", weights_only=True)
    assert checkpoint["step"] == 2
    assert checkpoint["config"]["data"]["num_workers"] == "auto"  # resolved again wherever the run resumes
    assert checkpoint["config"]["model"]["channels"] == PAPER_WIDTHS
