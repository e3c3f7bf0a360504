"""train.max_minutes: the plan's arithmetic, the refitted schedule, and real runs that plan, keep and
replace their plan across resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import TORCHRUN_TWO, train_small
from training.config import load_config
from training.optim import build_optimizer, fit_schedule
from training.time_budget import ROUND_TO, TIMED_STEPS, UNTIMED_STEPS, Pace, Plan, steps_that_fit


def test_all_the_steps_when_they_fit_else_the_round_step_that_fits():
    pace = Pace(seconds_per_step=0.5, seconds_per_validation=0.0, eval_every=2000)
    fit = dict(step=110, max_steps=13500)
    assert steps_that_fit(pace, 1e6, **fit) == 13500
    assert steps_that_fit(pace, (13500 - 110) * 0.5, **fit) == 13500  # exactly enough
    assert steps_that_fit(pace, 995.0, **fit) == 2100  # 110 + 1,990 steps fit: 2,100 is round
    assert steps_that_fit(pace, 995.0 + 0.5 * (ROUND_TO - 1), **fit) == 2100  # 2,199: not 2,200
    assert steps_that_fit(pace, -5.0, **fit) == 110  # the minutes are spent: end here


def test_validations_are_part_of_the_plan():
    # Steps of 0.5 s, and a validation of 100 s every 500 steps and at the end.
    fit = dict(step=0, max_steps=2000)
    assert steps_that_fit(Pace(0.5, 0.0, eval_every=500), 1000.0, **fit) == 2000
    assert steps_that_fit(Pace(0.5, 100.0, eval_every=500), 1000.0, **fit) == 1200
    assert steps_that_fit(Pace(0.5, 100.0, eval_every=500), 1500.0, **fit) == 2000
    # Measured: a validated image costs a third of a trained one.
    assert Pace.measured(0.32, batch_size=32, validation_images=300, eval_every=500).seconds_per_validation == (
        pytest.approx(1.0)
    )


def test_a_refitted_schedule_ends_annealed_where_the_plan_ends():
    config = load_config("crnn.yaml", ["optim.lr=1.0", "optim.warmup_steps=10", "optim.min_lr_ratio=0.1"])
    optimizer, scheduler = build_optimizer(config.optim, 1000, nn.Linear(2, 2))
    for _ in range(110):
        optimizer.step()
        scheduler.step()
    before = optimizer.param_groups[0]["lr"]
    fit_schedule(scheduler, config.optim, 300)
    # From here on the schedule ends at step 300: the next step's rate is already the new one's (lower).
    assert optimizer.param_groups[0]["lr"] < before
    for _ in range(110, 300):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # annealed to min_lr_ratio at step 300
    # A scheduler written to a checkpoint and loaded into one built for the configured 1,000 steps, then
    # refitted, as a resume that keeps the plan does: the same rate.
    _, resumed = build_optimizer(config.optim, 1000, nn.Linear(2, 2))
    resumed.load_state_dict(scheduler.state_dict())
    fit_schedule(resumed, config.optim, 300)
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(0.1)


def test_a_resume_keeps_the_plan_only_under_the_minutes_and_steps_it_was_made_for():
    record = Plan(minutes=16.0, max_steps=13500, steps=3300).to_dict()
    assert Plan.kept(record, 16.0, 13500) == Plan(16.0, 13500, 3300)
    assert Plan.kept(record, 20.0, 13500) is None  # other minutes: plan again
    assert Plan.kept(record, 16.0, 20000) is None  # other steps: plan again
    assert Plan.kept(record, None, 13500) is None  # no limit now: train.max_steps
    assert Plan.kept(None, 16.0, 13500) is None  # a checkpoint written without a plan


def train(synth: Path, out_dir: Path, max_steps: int, minutes: float) -> str:
    """A 2-process run (torchrun, gloo) of a small model; its log."""
    overrides = (f"train.max_steps={max_steps}", f"train.max_minutes={minutes}", "train.eval_every=1000")
    result = train_small(synth, out_dir, *overrides, "train.log_every=10", launcher=TORCHRUN_TWO)
    assert result.returncode == 0, result.stderr[-5000:]
    return result.stdout + result.stderr


def last_train_record(out_dir: Path) -> dict:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [record for record in records if "loss" in record and "val" not in record][-1]


@pytest.mark.slow
def test_a_run_out_of_minutes_ends_annealed_at_the_step_it_planned_and_a_resume_keeps_the_plan(synth, tmp_path):
    out_dir = tmp_path / "run"
    planned_at = UNTIMED_STEPS + TIMED_STEPS
    # 0.001 minutes are spent before the timed steps end: the plan ends the run where it is made.
    log = train(synth, out_dir, max_steps=1000, minutes=0.001)
    assert f"the run ends at step {planned_at} instead, its learning-rate schedule fitted" in log
    checkpoint = torch.load(out_dir / "last.pt", weights_only=True)
    assert checkpoint["step"] == planned_at
    assert checkpoint["plan"] == {"minutes": 0.001, "max_steps": 1000, "steps": planned_at}
    record = last_train_record(out_dir)
    assert record["step"] == planned_at and record["lr"] == pytest.approx(1e-3 * 0.05)  # min_lr_ratio: annealed
    assert (out_dir / "best.pt").is_file()  # validated at its last step

    # The same command again: the run keeps its plan and has nothing left to train.
    log = train(synth, out_dir, max_steps=1000, minutes=0.001)
    assert f"the run ends at step {planned_at}, as planned" in log
    assert torch.load(out_dir / "last.pt", weights_only=True)["step"] == planned_at

    # Other minutes: this run's value applies, and it plans anew from its own first steps.
    log = train(synth, out_dir, max_steps=1000, minutes=0.002)
    checkpoint = torch.load(out_dir / "last.pt", weights_only=True)
    assert checkpoint["step"] == 2 * planned_at
    assert checkpoint["plan"] == {"minutes": 0.002, "max_steps": 1000, "steps": 2 * planned_at}
