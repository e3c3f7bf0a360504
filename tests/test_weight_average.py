"""optim.ema_decay: the moving average of the weights, its warm-up, and what the checkpoints of a real
2-process run hold."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from models import build_model
from tests.conftest import SMALL_RUN, TORCHRUN_TWO, run_command
from training.config import ConfigError, load_config, validate
from training.weight_average import WeightAverage


def decay_at(update: int, decay: float) -> float:
    return 0.0 if update == 1 else min(decay, (1 + update) / (10 + update))


def test_the_average_copies_first_then_follows_with_the_warmed_up_decay():
    torch.manual_seed(0)
    model = build_model("crnn", 11, 1, 16, channels=(4, 4, 8, 8, 8, 8, 8), lstm_layers=1)
    average = WeightAverage(model, decay=0.5)
    history = []
    for _ in range(4):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter))
        model(torch.randn(2, 1, 32, 16))  # train mode: moves the BatchNorm statistics too
        history.append({key: value.clone() for key, value in model.state_dict().items()})
        average.update(nn.Sequential(model))  # wrapped, as DDP wraps it: matched by position
    expected = dict(history[0])
    for update, state in enumerate(history[1:], start=2):
        weight = 1 - decay_at(update, 0.5)
        expected = {
            key: torch.lerp(expected[key], value, weight) if value.is_floating_point() else value
            for key, value in state.items()
        }
    assert [decay_at(n, 0.5) for n in (1, 2, 3, 4)] == [0.0, 0.25, 4 / 13, 5 / 14]
    averaged = average.model.state_dict()
    assert averaged.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(averaged[key], value, rtol=1e-6, atol=1e-6, msg=key)
    assert averaged["backbone.1.num_batches_tracked"] == 4  # copied, not averaged
    assert not any(parameter.requires_grad for parameter in average.model.parameters())
    assert not average.model.training

    restored = WeightAverage(model, decay=0.5)
    restored.load(average.model.state_dict(), average.updates)
    assert restored.updates == 4
    torch.testing.assert_close(restored.model.state_dict(), averaged, rtol=0, atol=0)


@pytest.mark.parametrize("decay", ["1", "1.5", "-0.1"])
def test_a_decay_outside_zero_to_one_is_refused_by_name(decay):
    with pytest.raises(ConfigError, match=rf"optim.ema_decay={decay}"):
        validate(load_config("crnn.yaml", [f"optim.ema_decay={decay}"]))


@pytest.mark.slow
def test_a_ddp_run_saves_and_validates_the_average_and_resumes_it(synth, tmp_path):
    out_dir = tmp_path / "run"
    command = [
        *TORCHRUN_TWO,
        "train.py",
        "--config",
        "crnn.yaml",
        f"data.train=[{synth / 'train'}]",
        f"data.val=[{synth / 'val'}]",
        f"train.out_dir={out_dir}",
        *SMALL_RUN,
        "train.eval_batch_size=8",
        "train.eval_every=3",
        "train.save_every=1",
        "train.keep_checkpoints=10",
        "optim.warmup_steps=1",
        "optim.schedule=constant",
        "optim.ema_decay=0.9",
    ]

    def train(max_steps: int) -> None:
        run_command(*command, f"train.max_steps={max_steps}", check=True)

    train(3)
    checkpoints = {step: torch.load(out_dir / f"ckpt-{step:07d}.pt", weights_only=True) for step in (1, 2, 3)}
    assert [checkpoints[step]["average_updates"] for step in (1, 2, 3)] == [1, 2, 3]
    first = checkpoints[1]
    for key, value in first["raw_model"].items():
        torch.testing.assert_close(first["model"][key], value, rtol=0, atol=0)  # the first update copies
    for step in (2, 3):
        previous, current = checkpoints[step - 1]["model"], checkpoints[step]
        for key, raw in current["raw_model"].items():
            if raw.is_floating_point():  # BatchNorm statistics too: rank 0 averages its own and saves them
                expected = torch.lerp(previous[key], raw, 1 - decay_at(step, 0.9))
                torch.testing.assert_close(current["model"][key], expected, rtol=1e-6, atol=1e-7, msg=key)
    assert not torch.equal(
        checkpoints[3]["model"]["sequence.0.linear.weight"], checkpoints[3]["raw_model"]["sequence.0.linear.weight"]
    )
    best = torch.load(out_dir / "best.pt", weights_only=True)
    assert best["step"] == 3 and "raw_model" not in best
    for key, value in checkpoints[3]["model"].items():
        torch.testing.assert_close(best["model"][key], value, rtol=0, atol=0)

    # Continue the same run to step 5, then compare with a run that went there in one go (a constant
    # learning rate: the cosine schedule would depend on max_steps).
    train(5)
    resumed = torch.load(out_dir / "last.pt", weights_only=True)
    uninterrupted_dir = tmp_path / "uninterrupted"
    command[command.index(f"train.out_dir={out_dir}")] = f"train.out_dir={uninterrupted_dir}"
    train(5)
    uninterrupted = torch.load(uninterrupted_dir / "last.pt", weights_only=True)
    assert resumed["average_updates"] == uninterrupted["average_updates"] == 5
    for part in ("model", "raw_model"):
        for key, value in uninterrupted[part].items():
            torch.testing.assert_close(resumed[part][key], value, rtol=0, atol=0, msg=f"{part} {key}")
