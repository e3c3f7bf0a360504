"""A step with a NaN or infinite gradient is skipped, on every rank alike, leaves the whole model as it
was (BatchNorm's buffers too), and is counted."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from data.codec import CTCCodec
from data.lmdb_dataset import Batch, LmdbDataset
from data.loaders import build_eval_loader
from data.transforms import ImageTransform, Preprocessing
from evaluation.evaluate import evaluate
from models import build_model
from tests.conftest import ALPHABET, run_on_two_processes
from train import train_step
from training.checkpoint import save_checkpoint
from utils.distributed import DistEnv


def make_batch(poisoned: bool) -> Batch:
    codec = CTCCodec(ALPHABET)
    labels = ["abc", "12"]
    targets, lengths = codec.encode(labels)
    images = torch.rand(2, 1, 32, 100, generator=torch.Generator().manual_seed(0)) * 2 - 1
    if poisoned:
        images[0, 0, 0, 0] = float("nan")  # what a broken augmentation or a corrupt tensor would do
    return Batch(
        images, labels, targets, lengths, num_dropped=0, widths=torch.tensor([100, 100]), seeds=torch.tensor([0, 1])
    )


def step(model: torch.nn.Module, trained: torch.nn.Module, poisoned: bool) -> bool:
    optimizer = torch.optim.Adam(trained.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    _, _, taken = train_step(
        model,
        make_batch(poisoned),
        inputs=lambda pixels, widths, seeds: pixels,  # the batch's images as they are: a NaN as augmentation could make
        optimizer=optimizer,
        scaler=scaler,
        grad_clip=5.0,
        device=torch.device("cpu"),
        precision="fp32",
        memory_format=torch.contiguous_format,
    )
    return taken


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("crnn", len(ALPHABET) + 1, 1, 16)


def same_state(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> bool:
    """Parameters and buffers (BatchNorm's running statistics and counters) alike."""
    return before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_a_nan_batch_leaves_the_whole_model_as_it_was():
    model = tiny_model()
    before = copy.deepcopy(model.state_dict())
    assert step(model, model, poisoned=True) is False
    assert same_state(before, model.state_dict())  # running_mean and running_var too: the forward ran
    assert step(model, model, poisoned=False) is True
    after = model.state_dict()
    assert not torch.equal(before["backbone.1.running_mean"], after["backbone.1.running_mean"])
    assert not torch.equal(before["backbone.0.weight"], after["backbone.0.weight"])


def one_rank_poisoned(rank: int, val: str, checkpoint: str) -> dict:
    """Rank 1's batch holds a NaN: every rank skips, keeps its whole state, then evaluates and saves a
    model with finite numbers after a good step."""
    model = tiny_model()
    before = copy.deepcopy(model.state_dict())
    ddp = DistributedDataParallel(model)
    taken = step(ddp, model, poisoned=rank == 1)
    unchanged = same_state(before, model.state_dict())
    taken_after = step(ddp, model, poisoned=False)
    env = DistEnv(rank=rank, local_rank=rank, world_size=2, device=torch.device("cpu"))
    codec = CTCCodec(ALPHABET)
    dataset = LmdbDataset(val, codec, 26, ImageTransform(Preprocessing(32, 100)))
    counts = evaluate(model, build_eval_loader(dataset, codec, 8, 0, env), codec, env, "fp32")
    if rank == 0:
        save_checkpoint(checkpoint, {"model": model.state_dict()})
    gathered = [None, None]
    torch.distributed.all_gather_object(gathered, (taken, unchanged, taken_after))
    return {"ranks": gathered, "loss_fixed": counts["loss_fixed"], "samples": counts["samples"]}


@pytest.mark.slow
def test_a_nan_on_one_rank_makes_every_rank_skip_the_step_and_keep_its_buffers(tmp_path, synth):
    checkpoint = tmp_path / "after.pt"
    result = run_on_two_processes(one_rank_poisoned, tmp_path, str(synth / "val"), str(checkpoint))
    assert result["ranks"] == [(False, True, True), (False, True, True)]
    assert result["samples"] == 33 and math.isfinite(result["loss_fixed"]) and result["loss_fixed"] > 0
    saved = torch.load(checkpoint, weights_only=True)["model"]
    assert all(torch.isfinite(value).all() for value in saved.values() if value.is_floating_point())


@pytest.mark.slow
def test_too_many_skipped_steps_in_a_row_stop_the_run_with_a_message(synth, tmp_path):
    """A learning rate of 1e30 blows the weights up after the first step; every later step is NaN."""
    from tests.conftest import train_small

    overrides = ("train.max_steps=20", "optim.lr=1e30", "optim.warmup_steps=1", "train.max_nonfinite_steps=3")
    result = train_small(synth, tmp_path / "run", *overrides)
    assert result.returncode == 1
    assert "step skipped (1 in a row)" in result.stderr + result.stdout
    assert "error: 3 steps in a row up to step 4 had a NaN or infinite loss or gradient" in result.stderr
