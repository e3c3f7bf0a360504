"""CpuSyncBatchNorm in two real processes (gloo) computes what BatchNorm does on the whole batch.

Checked in float64, where the comparison is exact up to rounding: in float32 a ReLU input near zero
that rounds the other way changes a gradient, and that noise would hide a real error.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from models import build_model
from tests.conftest import run_on_two_processes
from utils.sync_batchnorm import convert_sync_batchnorm

pytestmark = pytest.mark.slow  # starts real processes: `pytest -m "not slow"` skips it

GLOBAL_BATCH = 8


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(GLOBAL_BATCH, 1, 32, 100, generator=generator, dtype=torch.float64)
    weights = torch.randn(GLOBAL_BATCH, 26, 37, generator=generator, dtype=torch.float64)
    return images, weights


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("crnn", 37, 1, 32).double()


def rank_zero_gradients(rank: int, sync: bool) -> dict:
    local = model()
    if sync:
        local = convert_sync_batchnorm(local, torch.device("cpu"))
    ddp = DistributedDataParallel(local)
    images, weights = batch()
    half = slice(rank * GLOBAL_BATCH // 2, (rank + 1) * GLOBAL_BATCH // 2)
    loss = (ddp(images[half]) * weights[half]).sum() / (GLOBAL_BATCH // 2)  # a per-rank mean, as in training
    loss.backward()
    return {name: p.grad.numpy() for name, p in local.named_parameters()} | {
        name: b.numpy() for name, b in local.named_buffers() if b.is_floating_point()
    }


def two_process_gradients(tmp_path, sync: bool) -> dict[str, torch.Tensor]:
    return {
        name: torch.from_numpy(value)
        for name, value in run_on_two_processes(rank_zero_gradients, tmp_path, sync).items()
    }


def test_two_processes_compute_the_gradients_of_the_whole_batch(tmp_path):
    reference = model()
    images, weights = batch()
    ((reference(images) * weights).sum() / GLOBAL_BATCH).backward()
    expected = {name: p.grad for name, p in reference.named_parameters()}
    expected |= {name: b for name, b in reference.named_buffers() if b.is_floating_point()}

    def worst_error(gradients: dict[str, torch.Tensor]) -> float:
        return max(float((gradients[k] - v).abs().max() / v.abs().max().clamp(min=1e-30)) for k, v in expected.items())

    synced = worst_error(two_process_gradients(tmp_path, sync=True))
    per_process = worst_error(two_process_gradients(tmp_path, sync=False))
    assert synced < 1e-10  # gradients and running statistics
    assert per_process > 1e-3  # plain BatchNorm in DDP normalises each half with its own statistics
