"""The CUDA lane: what only a GPU runs. Every test carries the `cuda` marker and is skipped, with the
reason, where CUDA is absent (CI, and every CPU machine); `tools/gpu_check.sh` runs it on a GPU:

    python -m pytest -q -m cuda -rs

Multi-process DDP on one GPU: NCCL refuses two processes on one device, so `device_ids: [0, 0]`
joins them over gloo, which carries CUDA tensors through host memory (utils.distributed.
process_group_backend). NCCL itself is run with one process per GPU, two where the machine has two.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import read_lmdb, run_command, torchrun

from training.checkpoint import load_checkpoint

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the GPU lane: tools/gpu_check.sh)"),
]
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def train(
    synth: Path, out_dir: Path, *overrides: str, processes: int = 1, env: dict | None = None
) -> subprocess.CompletedProcess:
    # At most a few minutes: these runs take seconds on a GPU, and a hang must not spend a short GPU lease.
    return run_command(
        *torchrun(processes),
        "train.py",
        "--config",
        "crnn.yaml",
        f"data.train=[{synth / 'train'}]",
        f"data.val=[{synth / 'val'}]",
        f"train.out_dir={out_dir}",
        "train.batch_size=16",
        "train.log_every=1",
        "data.num_workers=1",
        *overrides,
        env=env,
        timeout=240,
        check=True,
    )


def losses(out_dir: Path) -> list[float]:
    lines = (out_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [record["loss"] for record in map(json.loads, lines) if "loss" in record and "val" not in record]


def test_a_run_on_the_gpu_trains_and_its_checkpoint_loads_on_the_cpu(synth, tmp_path):
    result = train(synth, tmp_path / "run", "train.max_steps=20", "train.eval_every=20")
    log = result.stdout + result.stderr
    assert "on cuda" in log
    checkpoint = load_checkpoint(tmp_path / "run" / "best.pt")  # map_location cpu
    assert all(tensor.device.type == "cpu" for tensor in checkpoint["model"].values())
    assert "cuda" in load_checkpoint(tmp_path / "run" / "last.pt")["rng"][0]  # the CUDA generator is saved


@TWO_GPUS
def test_two_processes_on_two_gpus_join_over_nccl_with_sync_batchnorm(synth, tmp_path):
    result = train(
        synth, tmp_path / "run", "train.max_steps=6", "train.eval_every=6", "model.sync_bn=true", processes=2
    )
    assert "2 process(es) on cuda" in result.stdout + result.stderr
    assert all(math.isfinite(loss) for loss in losses(tmp_path / "run"))


def test_two_processes_share_one_gpu_over_gloo(synth, tmp_path):
    result = train(synth, tmp_path / "run", "train.max_steps=6", "train.eval_every=6", "device_ids=[0,0]", processes=2)
    assert "2 process(es) on cuda" in result.stdout + result.stderr
    assert load_checkpoint(tmp_path / "run" / "last.pt")["world_size"] == 2


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_steps_are_finite_and_the_loss_falls(synth, tmp_path, precision):
    train(synth, tmp_path / "run", "train.max_steps=60", "train.eval_every=60", f"train.precision={precision}")
    values = losses(tmp_path / "run")
    assert len(values) == 60 and all(math.isfinite(loss) for loss in values)
    assert sum(values[-10:]) < sum(values[:10])
    scaler = load_checkpoint(tmp_path / "run" / "last.pt")["scaler"]
    if precision == "fp16":  # GradScaler is on, and its scale travels with the checkpoint
        assert scaler and scaler["scale"] > 0
        train(synth, tmp_path / "run", "train.max_steps=62", "train.eval_every=62", "train.precision=fp16")
        assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 62


def test_a_resumed_run_on_the_gpu_continues_where_it_stopped(synth, tmp_path):
    """The same data, RNG (CUDA's included) and optimizer state as an uninterrupted run; the weights then
    agree to rounding, not to the bit: cuDNN's benchmark mode picks algorithms by timing, and CUDA's CTC
    backward adds with atomics (docs/testing.md, "The CUDA lane")."""
    settings = ["train.eval_every=100", "train.save_every=3", "train.precision=fp32"]
    train(synth, tmp_path / "whole", "train.max_steps=6", *settings)
    train(synth, tmp_path / "split", "train.max_steps=3", *settings)
    train(synth, tmp_path / "split", "train.max_steps=6", *settings)
    assert losses(tmp_path / "split")[3:] == pytest.approx(losses(tmp_path / "whole")[3:], rel=1e-3)
    whole = load_checkpoint(tmp_path / "whole" / "last.pt")["model"]
    split = load_checkpoint(tmp_path / "split" / "last.pt")["model"]
    for key in whole:
        torch.testing.assert_close(split[key], whole[key], rtol=1e-3, atol=1e-4)


def test_device_ids_pick_the_gpu_through_cuda_visible_devices(synth, tmp_path):
    train(
        synth,
        tmp_path / "run",
        "train.max_steps=2",
        "train.eval_every=2",
        "device_ids=[0]",
        env={"CUDA_VISIBLE_DEVICES": "0"},
    )
    missing = run_command(
        sys.executable,
        "train.py",
        "--config",
        "crnn.yaml",
        f"data.train=[{synth / 'train'}]",
        f"data.val=[{synth / 'val'}]",
        f"train.out_dir={tmp_path / 'bad'}",
        "device_ids=[7]",
        env={"CUDA_VISIBLE_DEVICES": "0"},
    )
    assert missing.returncode != 0 and "device_ids=[7]: GPU(s) [7] do not exist; this node has 1" in missing.stderr


def test_batches_arrive_pinned_and_copy_without_blocking(synth):
    from training.config import load_config
    from training.setup import build_setup
    from utils.distributed import DistEnv

    config = load_config(
        "crnn.yaml",
        [f"data.train=[{synth / 'train'}]", f"data.val=[{synth / 'val'}]", "data.num_workers=1", "train.batch_size=8"],
    )
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cuda", 0), cpu_group=None)
    batch = next(iter(build_setup(config, env).loader))
    assert batch.images.is_pinned() and batch.targets.is_pinned()
    on_gpu = batch.images.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    torch.testing.assert_close(on_gpu.cpu(), batch.images)


def test_the_tools_read_the_same_on_cuda_as_on_the_cpu(tiny_run, synth, tmp_path):
    folder = tmp_path / "words"
    folder.mkdir()
    for index, (image_bytes, _) in enumerate(read_lmdb(synth / "val")[:8]):
        (folder / f"{index}.png").write_bytes(image_bytes)

    def predict(device: str) -> list[str]:
        result = run_command(
            sys.executable,
            "scripts/predict.py",
            tiny_run / "best.pt",
            folder,
            "--device",
            device,
            "--precision",
            "fp32",
            check=True,
        )
        return [line.split("\t")[1] for line in result.stdout.splitlines()]

    assert predict("cuda:0") == predict("cpu")

    def evaluate(visible: str) -> str:
        result = run_command(
            "bash",
            "scripts/eval.sh",
            tiny_run / "best.pt",
            synth / "val",
            "--precision",
            "fp32",
            env={"CUDA_VISIBLE_DEVICES": visible},
            check=True,
        )
        return next(line for line in result.stdout.splitlines() if line.startswith("val "))

    assert evaluate("0").split()[:4] == evaluate("").split()[:4]  # set, evaluated, in LMDB, accuracy


def test_compiled_training_on_the_gpu(synth, tmp_path):
    train(synth, tmp_path / "run", "train.max_steps=4", "train.eval_every=4", "train.compile=true")
    assert all(math.isfinite(loss) for loss in losses(tmp_path / "run"))
