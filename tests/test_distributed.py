from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from data.samplers import ShardSampler
from tests.conftest import REPO, run_env
from utils.distributed import loader_workers, pick_device, process_group_backend, threads_per_process


@pytest.mark.parametrize("length, world_size", [(33, 2), (10, 3), (2, 4), (0, 2)])
def test_shards_cover_every_sample_exactly_once(length, world_size):
    shards = [list(ShardSampler(length, rank, world_size)) for rank in range(world_size)]
    assert sorted(i for shard in shards for i in shard) == list(range(length))
    assert [len(ShardSampler(length, rank, world_size)) for rank in range(world_size)] == [len(s) for s in shards]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine's answer")
def test_device_ids_without_cuda_is_a_clear_error():
    assert pick_device(0, 1, []) == torch.device("cpu")
    with pytest.raises(ValueError, match=r"device_ids=\[1\].*CUDA is not available"):
        pick_device(0, 1, [1])


def test_threads_split_the_cores_between_local_processes(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("utils.distributed.usable_cores", lambda: 8)
    assert threads_per_process(0, 4) == 2 and threads_per_process(3, 4) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads_per_process(0, 1) == 1


def test_threads_count_only_the_cores_this_process_may_run_on(monkeypatch):
    """A job scheduler's or taskset's share of the machine, not all of its cores: more threads than cores
    slow every step several-fold."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        assert threads_per_process(0, 1) == 1
    finally:
        os.sched_setaffinity(0, allowed)


@pytest.mark.parametrize(
    "cores, processes, device, workers",
    [
        (16, 1, "cuda", 15),  # one GPU: every core but the training process's
        (16, 2, "cuda", 7),
        (16, 8, "cuda", 1),
        (8, 8, "cuda", 1),  # no core to spare: still one, so that decoding runs beside the step
        (4, 8, "cuda", 1),
        (2, 1, "cpu", 0),  # the training processes fill the cores: they load their own batches
        (64, 2, "cpu", 0),
    ],
)
def test_auto_loader_workers_leave_a_core_for_each_training_process_on_gpus_and_none_on_the_cpu(
    cores, processes, device, workers
):
    assert loader_workers(cores, processes, device) == workers


@pytest.mark.slow
def test_global_batch_must_divide_by_the_world_size(synth):
    """Fails on every rank before any process group exists (WORLD_SIZE as torchrun would set it)."""
    env = {**run_env(), "WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "test"}
    result = subprocess.run(
        [sys.executable, "train.py", "--config", "crnn.yaml", "train.batch_size=64"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "train.batch_size=64" in result.stderr and "3 processes" in result.stderr


def test_device_ids_naming_a_missing_gpu_or_too_few_gpus_is_a_clear_error(monkeypatch):
    """A 2-GPU node, faked: pick_device decides from these two calls before touching any GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pick_device(1, 2, [1, 0]) == torch.device("cuda", 0)
    with pytest.raises(
        ValueError, match=r"device_ids=\[0, 5\]: GPU\(s\) \[5\] do not exist; this node has 2 \(0\.\.1\)"
    ):
        pick_device(0, 2, [0, 5])
    with pytest.raises(ValueError, match=r"device_ids=\[1\] lists 1 GPUs for 2 processes on this node"):
        pick_device(0, 2, [1])
    with pytest.raises(ValueError, match=r"local rank 2 needs GPU 2 but this node has 2"):
        pick_device(2, 3, [])


def test_processes_that_share_a_gpu_join_over_gloo_since_nccl_refuses_that():
    gpu = torch.device("cuda", 0)
    assert process_group_backend(gpu, [], 2) == "nccl"  # local rank i on cuda:i
    assert process_group_backend(gpu, [1, 0], 2) == "nccl"
    assert process_group_backend(gpu, [0, 0], 2) == "gloo"  # two processes, one GPU
    assert process_group_backend(gpu, [2, 2, 3], 2) == "gloo"  # only the node's own ranks count
    assert process_group_backend(gpu, [2, 3, 3], 2) == "nccl"
    assert process_group_backend(torch.device("cpu"), [], 2) == "gloo"
