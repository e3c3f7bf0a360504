"""The optimizers and schedules: one table each, read by build_optimizer and by validate."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from training import optim
from training.config import ConfigError, load_config, validate
from training.optim import OPTIMIZERS, SCHEDULES, build_optimizer, fit_schedule


def learning_rates(config, steps: int) -> list[float]:
    optimizer, scheduler = build_optimizer(config.optim, config.train.max_steps, nn.Linear(2, 2))
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_the_learning_rate_warms_up_linearly_then_follows_the_schedule():
    config = load_config(
        "crnn.yaml",
        [
            "optim.lr=1.0",
            "optim.warmup_steps=4",
            "train.max_steps=14",
            "optim.min_lr_ratio=0.1",
            "optim.schedule=cosine",
        ],
    )
    rates = learning_rates(config, 16)
    assert rates[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert rates[4] == pytest.approx(1.0) and rates[9] == pytest.approx(0.55)  # cosine: halfway down at half
    assert rates[14:] == pytest.approx([0.1, 0.1])  # min_lr_ratio from max_steps on
    config.optim.schedule = "constant"
    assert learning_rates(config, 16)[4:] == pytest.approx([1.0] * 12)
    config.optim.name = "adadelta"
    optimizer, _ = build_optimizer(config.optim, config.train.max_steps, nn.Linear(2, 2))
    assert isinstance(optimizer, torch.optim.Adadelta) and optimizer.defaults["rho"] == 0.95


def test_wsd_holds_the_rate_until_its_decay_and_a_refitted_end_moves_only_the_decay():
    config = load_config(
        "crnn.yaml",
        ["optim.lr=1.0", "optim.warmup_steps=4", "train.max_steps=24", "optim.min_lr_ratio=0.1", "optim.schedule=wsd"],
    )
    rates = learning_rates(config, 26)  # decay_share 0.2: over the last 4 of the 20 steps after the warm-up
    assert rates[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert rates[4:21] == pytest.approx([1.0] * 17)
    assert rates[22] == pytest.approx(0.55) and rates[24:] == pytest.approx([0.1, 0.1])  # cosine: half at half
    optimizer, scheduler = build_optimizer(config.optim, 1000, nn.Linear(2, 2))
    for _ in range(300):
        optimizer.step()
        scheduler.step()
    fit_schedule(scheduler, config.optim, 500)  # a plan made again in the stable part: the rate stays
    assert optimizer.param_groups[0]["lr"] == 1.0
    assert scheduler.lr_lambdas[0](500) == pytest.approx(0.1) and scheduler.lr_lambdas[0](401) < 1.0


def test_an_entry_added_to_a_table_is_a_name_the_config_takes(monkeypatch):
    config = load_config("crnn.yaml", ["optim.name=sgd", "optim.schedule=linear"])
    with pytest.raises(ConfigError, match=f"optim.name: 'sgd' is not one of {', '.join(OPTIMIZERS)}$"):
        validate(config)
    monkeypatch.setitem(
        optim.OPTIMIZERS, "sgd", lambda parameters, settings: torch.optim.SGD(parameters, lr=settings.lr)
    )
    with pytest.raises(ConfigError, match=f"optim.schedule: 'linear' is not one of {', '.join(SCHEDULES)}$"):
        validate(config)
    monkeypatch.setitem(optim.SCHEDULES, "linear", lambda progress, settings: 1 - progress)
    validate(config)
    optimizer, scheduler = build_optimizer(config.optim, config.train.max_steps, nn.Linear(2, 2))
    assert isinstance(optimizer, torch.optim.SGD) and scheduler.lr_lambdas[0](config.train.max_steps) == 0
