"""A step with a NaN or infinite gradient is skipped, on every rank alike, and counted."""
from __future__ import annotations

import copy

import torch
from torch.nn.parallel import DistributedDataParallel

from data.codec import CTCCodec
from data.lmdb_dataset import Batch
from models import build_model
from tests.conftest import ALPHABET, run_on_two_processes
from train import train_step


def make_batch(poisoned: bool) -> Batch:
    codec = CTCCodec(ALPHABET)
    labels = ["abc", "12"]
    targets, lengths = codec.encode(labels)
    images = torch.zeros(2, 1, 32, 100)
    if poisoned:
        images[0, 0, 0, 0] = float("nan")  # what a broken augmentation or a corrupt tensor would do
    return Batch(images, labels, targets, lengths, num_dropped=0)


def step(model: torch.nn.Module, trained: torch.nn.Module, poisoned: bool) -> bool:
    optimizer = torch.optim.Adam(trained.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    _, _, taken = train_step(model, make_batch(poisoned), optimizer, scaler, 5.0, torch.device("cpu"), "fp32",
                             torch.contiguous_format)
    return taken


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("crnn", len(ALPHABET) + 1, 1, 16)


def test_a_nan_batch_leaves_the_weights_as_they_were():
    model = tiny_model()
    before = copy.deepcopy(model.state_dict())
    assert step(model, model, poisoned=True) is False
    after = model.state_dict()
    # Parameters untouched; BatchNorm statistics may move (the forward ran), as in any skipped step.
    assert all(torch.equal(before[k], after[k]) for k, _ in model.named_parameters())
    assert step(model, model, poisoned=False) is True
    assert not all(torch.equal(before[k], model.state_dict()[k]) for k, _ in model.named_parameters())


def one_rank_poisoned(rank: int) -> dict:
    model = tiny_model()
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    ddp = DistributedDataParallel(model)
    taken = step(ddp, model, poisoned=rank == 1)  # only rank 1's batch holds a NaN
    unchanged = all(torch.equal(before[k], p) for k, p in model.named_parameters())
    gathered = [None, None]
    torch.distributed.all_gather_object(gathered, (taken, unchanged))
    return {"ranks": gathered}


def test_a_nan_on_one_rank_makes_every_rank_skip_the_step(tmp_path):
    result = run_on_two_processes(one_rank_poisoned, tmp_path)
    assert result["ranks"] == [(False, True), (False, True)]


def test_too_many_skipped_steps_in_a_row_stop_the_run_with_a_message(synth, tmp_path):
    """A learning rate of 1e30 blows the weights up after the first step; every later step is NaN."""
    import subprocess
    import sys

    from tests.conftest import REPO, run_env

    result = subprocess.run(
        [sys.executable, "train.py", "--config", "crnn.yaml", f"data.train=[{synth / 'train'}]",
         f"data.val=[{synth / 'val'}]", f"train.out_dir={tmp_path / 'run'}", "train.batch_size=8", "train.max_steps=20",
         "optim.lr=1e30", "optim.warmup_steps=1", "train.max_nonfinite_steps=3", "data.num_workers=0",
         "model.hidden_size=32", "train.precision=fp32"],
        cwd=REPO, env=run_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "step skipped (1 in a row)" in result.stderr + result.stdout
    assert "error: 3 steps in a row up to step 4 had a NaN or infinite loss or gradient" in result.stderr
