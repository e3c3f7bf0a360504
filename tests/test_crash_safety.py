"""Crash-safe training with real torchrun processes on the CPU (gloo): a signal to one rank, a killed
worker under --max-restarts, two rendezvous "nodes" on 127.0.0.1, SyncBatchNorm's DDP-equals-one-process.

Every run uses the same small recipe; the uninterrupted reference run is what the others must equal.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import SMALL_RUN, TORCHRUN, TORCHRUN_TWO, TORCHRUN_TWO_UNTIL_EACH_FAILS, start_command, torchrun
from training.config import load_config

pytestmark = pytest.mark.slow  # starts real processes: `pytest -m "not slow"` skips it

MAX_STEPS = 16


def train_args(synth: Path, out_dir: Path, *overrides: str) -> list[str]:
    return [
        "train.py",
        "--config",
        "crnn.yaml",
        f"data.train=[{synth / 'train'}]",
        f"data.val=[{synth / 'val'}]",
        f"train.out_dir={out_dir}",
        *SMALL_RUN,
        f"train.max_steps={MAX_STEPS}",
        "train.save_every=4",
        "train.log_every=1",
        "train.eval_every=8",
        "train.eval_batch_size=8",
        "data.num_workers=1",
        "optim.warmup_steps=2",
        "data.augment=strong",  # augmented: exact too
        "train.tensorboard=true",  # as a user's run writes it
        *overrides,
    ]


def launch(command: list[str]) -> subprocess.Popen:
    """`command` in its own session (a test that fails can kill the launcher with all its workers), its stdout and
    stderr in one pipe."""
    return start_command(*command, stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen, expect_success: bool = True, timeout: float = 240) -> str:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"still running after {timeout} s:\n{process.communicate()[0][-6000:]}")
    assert (process.returncode == 0) == expect_success, f"exit {process.returncode}:\n{output[-6000:]}"
    return output


def train_records(out_dir: Path) -> list[dict]:
    """The logged training numbers, without the clock-dependent ones."""
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time", "images_per_s", "data_wait_share")} for r in records]


def wait_for_step(out_dir: Path, step: int, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the run ended before step {step}:\n{process.communicate()[0][-4000:]}"
        path = out_dir / "metrics.jsonl"
        if path.is_file() and any(r["step"] >= step for r in train_records(out_dir)):
            return
        time.sleep(0.05)
    raise TimeoutError(f"no step {step} logged in {timeout} s")


def worker_pids(launcher_pid: int) -> dict[int, int]:
    """{rank: pid} of the workers a torchrun process started, from /proc."""
    workers = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if parent != launcher_pid:
                continue
            environ = dict(
                item.split("=", 1) for item in (stat.parent / "environ").read_text().split("\0") if "=" in item
            )
        except (OSError, ValueError, IndexError):
            continue  # a process that ended while we looked
        if "RANK" in environ:
            workers[int(environ["RANK"])] = int(stat.parent.name)
    return workers


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def stepped_weights(path: Path) -> dict[str, torch.Tensor]:
    """The weights the optimizer stepped: with optim.ema_decay (crnn.yaml) `model` is their average."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return checkpoint.get("raw_model", checkpoint["model"])


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [key for key in a if not torch.equal(a[key], b[key])]
    assert not different, f"not bit-identical: {different[:5]}"


@pytest.fixture(scope="module")
def reference(synth, tmp_path_factory) -> Path:
    """Two processes, never interrupted."""
    out_dir = tmp_path_factory.mktemp("reference") / "run"
    finish(launch([*TORCHRUN_TWO, *train_args(synth, out_dir)]))
    return out_dir


def test_sigterm_to_one_rank_stops_every_rank_with_a_checkpoint_and_resume_is_exact(reference, synth, tmp_path):
    out_dir = tmp_path / "run"
    command = [*TORCHRUN_TWO, *train_args(synth, out_dir)]
    process = launch(command)
    wait_for_step(out_dir, 5, process)
    ranks = worker_pids(process.pid)
    assert sorted(ranks) == [0, 1]
    sent = time.monotonic()
    signal_rank = 1
    os.kill(ranks[signal_rank], signal.SIGTERM)
    output = finish(process, expect_success=False, timeout=120)
    print(f"SIGTERM to rank {signal_rank} -> torchrun exited after {time.monotonic() - sent:.1f} s")
    # Rank 0's message may share a line with its progress bar: keep what follows "stopped by".
    stopped = [line[line.index("stopped by") :] for line in output.splitlines() if "stopped by SIGTERM at step" in line]
    assert len(stopped) == 2, output[-4000:]  # both ranks, the same step and message
    step = int(stopped[0].split("at step ")[1].split(";")[0])
    assert 5 <= step < MAX_STEPS and stopped[0] == stopped[1]
    checkpoint = torch.load(out_dir / f"ckpt-{step:07d}.pt", weights_only=True)
    assert checkpoint["step"] == step and len(checkpoint["rng"]) == 2
    assert "exitcode  : 143" in output  # 128 + SIGTERM, as a shell reports it

    output = finish(launch(command))  # the same command continues the run
    assert f"resumed from {out_dir / f'ckpt-{step:07d}.pt'} at step {step}" in output
    assert_same_weights(weights(out_dir / "last.pt"), weights(reference / "last.pt"))
    assert train_records(out_dir) == train_records(reference)  # the same logged losses, once each


def test_torchrun_restarts_a_killed_worker_and_the_run_ends_as_if_never_killed(reference, synth, tmp_path):
    out_dir = tmp_path / "run"
    process = launch([*torchrun(2, "--max-restarts=1"), *train_args(synth, out_dir)])
    wait_for_step(out_dir, 6, process)
    assert (out_dir / "ckpt-0000004.pt").is_file()
    os.kill(worker_pids(process.pid)[0], signal.SIGKILL)
    output = finish(process)
    assert "torchrun restart 1" in output and "resumed from" in output
    checkpoint = torch.load(out_dir / "last.pt", weights_only=True)
    assert checkpoint["step"] == MAX_STEPS
    assert_same_weights(checkpoint["model"], weights(reference / "last.pt"))
    assert train_records(out_dir) == train_records(reference)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_rendezvous_nodes_on_the_loopback_address(reference, synth, tmp_path):
    out_dir = tmp_path / "run"
    node = [
        *TORCHRUN,
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=127.0.0.1:{free_port()}",
        "--rdzv_id=loopback",
        "--local_addr=127.0.0.1",
        *train_args(synth, out_dir),
    ]
    nodes = [launch(node), launch(node)]
    for process in nodes:
        finish(process)
    checkpoint = torch.load(out_dir / "last.pt", weights_only=True)
    assert checkpoint["world_size"] == 2 and checkpoint["step"] == MAX_STEPS
    # The same two ranks as the one-machine reference, so the same computation.
    assert_same_weights(checkpoint["model"], weights(reference / "last.pt"))


def distance_over_travel(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], start: dict[str, torch.Tensor]
) -> float:
    """|a - b| over |a - start| across the learned weights: how far apart two runs ended, relative to
    how far training moved them."""
    keys = [key for key in start if start[key].is_floating_point() and "running" not in key]
    apart = sum(((a[k] - b[k]).double() ** 2).sum() for k in keys) ** 0.5
    travelled = sum(((a[k] - start[k]).double() ** 2).sum() for k in keys) ** 0.5
    return float(apart / travelled)


def test_two_processes_with_sync_bn_equal_one_process(synth, tmp_path):
    """Same global batch, seed and steps: with SyncBatchNorm, 2 x 4 images compute what 1 x 8 does.

    The layer is exact (tests/test_sync_batchnorm.py checks it in float64); in float32 this model's
    gradients are sensitive to rounding (a ReLU input near zero flips) and Adam's first steps move
    each weight by about lr whatever its gradient's size, so the runs drift apart slowly. Without
    SyncBatchNorm they are different computations from the first step.
    """
    steps = ["train.max_steps=6", "train.save_every=6", "train.eval_every=6"]
    runs = {}
    for name, launcher, extra in [
        ("one", [sys.executable], ["model.sync_bn=true"]),
        ("two_sync", TORCHRUN_TWO, ["model.sync_bn=true"]),
        ("two_local", TORCHRUN_TWO, []),
    ]:
        runs[name] = tmp_path / name
        finish(launch([*launcher, *train_args(synth, runs[name], *steps, *extra)]))
    losses = {name: [r["loss"] for r in train_records(path) if "val" not in r] for name, path in runs.items()}
    first_gap = {name: abs(losses[name][0] / losses["one"][0] - 1) for name in ("two_sync", "two_local")}
    torch.manual_seed(0)  # train.seed: the initial weights
    from models import model_from_config
    from training.config import load_config

    start = model_from_config(load_config("crnn.yaml", [*SMALL_RUN]).model, 37).state_dict()
    one = stepped_weights(runs["one"] / "last.pt")
    apart = {
        name: distance_over_travel(one, stepped_weights(runs[name] / "last.pt"), start)
        for name in ("two_sync", "two_local")
    }
    print(f"first-step loss gap to one process: {first_gap}; weights apart / travelled after 6 steps: {apart}")
    assert first_gap["two_sync"] < 1e-5 < 1e-4 < first_gap["two_local"]
    assert apart["two_sync"] < 0.25 and apart["two_local"] > 4 * apart["two_sync"]


def test_another_config_in_a_used_run_folder_stops_every_rank_before_training(reference, synth):
    before = {path.name: path.stat().st_mtime_ns for path in reference.iterdir()}
    lr = load_config("crnn.yaml", []).optim.lr
    output = finish(
        launch([*TORCHRUN_TWO_UNTIL_EACH_FAILS, *train_args(synth, reference, f"optim.lr={2 * lr}")]),
        expect_success=False,
        timeout=120,
    )
    assert output.count("holds a run with another configuration:") == 2  # each rank, the same message
    assert f"optim.lr: {lr} -> {2 * lr}" in output
    assert {path.name: path.stat().st_mtime_ns for path in reference.iterdir()} == before  # nothing touched
