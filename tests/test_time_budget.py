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
from training.time_budget import (
    REPLAN_EVERY,
    ROUND_TO,
    TIMED_STEPS,
    UNTIMED_STEPS,
    Pace,
    Plan,
    StepClock,
    end_planned_again,
    steps_that_fit,
)

OPTIM = load_config("crnn.yaml", []).optim  # the train helper's runs are crnn.yaml's


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


def test_the_plan_made_again_counts_every_step_timed_and_the_last_validation():
    now = 0.0
    clock = StepClock(0, now=lambda: now)

    def steps(count: int, seconds: float) -> None:
        nonlocal now
        for _ in range(count):
            now += seconds
            clock.tick(clock.step + 1)

    def validation(seconds: float) -> None:
        nonlocal now
        now += seconds
        clock.validated(seconds)

    steps(10, 1.0)
    validation(5.0)  # before the timing: neither a step's time nor the last validation's
    steps(UNTIMED_STEPS - 10, 1.0)
    steps(TIMED_STEPS, 0.1)
    assert clock.seconds_per_step() == pytest.approx(0.1)  # the first plan's pace
    steps(2000 - clock.step, 0.2)  # the machine slowed down after the timed steps
    validation(30.0)
    pace = clock.pace_so_far(eval_every=2000)
    assert pace.seconds_per_step == pytest.approx((TIMED_STEPS * 0.1 + 1750 * 0.2) / 1950)
    assert pace.seconds_per_validation == 30.0
    # 15 minutes: 455 s spent (55 before the timing, 20 timed, 350 slower, 30 validating), 445 left; a
    # step costs 0.190 s and 30/2000 of a validation, and the last validation 30 s: 2,026 more steps fit.
    assert clock.seconds_left(15) == pytest.approx(445.0)
    assert steps_that_fit(pace, clock.seconds_left(15), clock.step, 13500) == 4000
    # The first plan's pace would have let the run go on to step 5,600.
    assert steps_that_fit(Pace(0.1, 30.0, 2000), clock.seconds_left(15), clock.step, 13500) == 5600


def test_the_plan_is_made_again_every_100_steps_and_reckons_the_validation_it_has_not_timed():
    now = 0.0
    clock = StepClock(0, now=lambda: now)
    # From the first plan (after step 250) to the end, whether or not a validation comes first.
    assert [step for step in range(1, 1001) if clock.plans_again(step, end=1000)] == list(range(300, 1000, 100))
    assert REPLAN_EVERY == 100
    for _ in range(UNTIMED_STEPS + TIMED_STEPS):
        now += 0.1
        clock.tick(clock.step + 1)
    clock.expect_validation(12.0)  # the first plan's estimate: no validation timed yet
    assert clock.pace_so_far(eval_every=2000).seconds_per_validation == 12.0
    clock.validated(30.0)
    assert clock.pace_so_far(eval_every=2000).seconds_per_validation == 30.0


def test_the_plan_made_again_moves_the_end_only_where_it_would_miss_the_minutes_by_more_than_2_percent():
    pace = Pace(seconds_per_step=0.125, seconds_per_validation=0.0, eval_every=2000)
    plan = dict(step=4000, end=8000, max_steps=13500, minutes=15)  # 2 % of 15 minutes: 18 s
    assert end_planned_again(pace, 500.0, **plan) == 8000  # the 4,000 steps take the 500 s left
    assert end_planned_again(pace, 515.0, **plan) == 8000  # 15 s to spare: kept (8,100 would fit)
    assert end_planned_again(pace, 485.0, **plan) == 8000  # 15 s short: kept
    assert end_planned_again(pace, 525.0, **plan) == 8200  # 25 s to spare: two hundred steps more
    assert end_planned_again(pace, 375.0, **plan) == 7000  # the machine slowed down: a thousand fewer
    assert end_planned_again(pace, -30.0, **plan) == 4000  # the minutes are spent: end here
    assert end_planned_again(pace, 1e6, **plan) == 13500  # never past train.max_steps


def test_a_refitted_schedule_ends_annealed_where_the_plan_ends():
    config = load_config(
        "crnn.yaml", ["optim.lr=1.0", "optim.warmup_steps=10", "optim.min_lr_ratio=0.1", "optim.schedule=cosine"]
    )
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


def train(synth: Path, out_dir: Path, max_steps: int, minutes: float, warmup_steps: int = 100) -> str:
    """A 2-process run (torchrun, gloo) of a small model; its log."""
    # By default warmed up within the 250 steps a plan made at once ends at, so that the end is annealed.
    overrides = (
        f"train.max_steps={max_steps}",
        f"train.max_minutes={minutes}",
        "train.eval_every=1000",
        f"optim.warmup_steps={warmup_steps}",
        "train.log_every=10",
    )
    result = train_small(synth, out_dir, *overrides, launcher=TORCHRUN_TWO)
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
    assert record["step"] == planned_at and record["lr"] == pytest.approx(OPTIM.lr * OPTIM.min_lr_ratio)  # annealed
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


@pytest.mark.slow
def test_a_plan_that_ends_the_run_inside_its_warm_up_says_so(synth, tmp_path):
    """train.max_steps is past the warm-up, so the start-up says nothing; the minutes are not."""
    planned_at = UNTIMED_STEPS + TIMED_STEPS
    log = train(synth, tmp_path / "run", max_steps=1000, minutes=0.001, warmup_steps=400)
    assert (
        f"warning: optim.warmup_steps=400 is more than the {planned_at} steps that fit train.max_minutes=0.001: "
        f"the learning rate never reaches optim.lr={OPTIM.lr} (it ends at 62.5% of it); raise "
        "train.max_minutes or lower optim.warmup_steps" in log
    )
    assert log.count("warning:") == 1
    assert last_train_record(tmp_path / "run")["step"] == planned_at


@pytest.mark.slow
def test_a_run_within_its_minutes_plans_again_before_any_validation_and_keeps_its_end(synth, tmp_path):
    """The plan made again at step 300, on both processes (a collective), with no validation before the
    end: all 400 steps still fit an hour, so the end stays, and the schedule with it."""
    out_dir = tmp_path / "run"
    overrides = (
        "train.max_steps=400",
        "train.max_minutes=60",
        "train.eval_every=1000",
        "train.log_every=10",
        "optim.warmup_steps=100",  # warmed up before the end, so that the end is annealed
    )
    result = train_small(synth, out_dir, *overrides, launcher=TORCHRUN_TWO)
    assert result.returncode == 0, result.stderr[-5000:]
    log = result.stdout + result.stderr
    assert "they fit: the run ends at step 400" in log and "instead of" not in log
    checkpoint = torch.load(out_dir / "last.pt", weights_only=True)
    assert checkpoint["step"] == 400 and checkpoint["plan"] == {"minutes": 60, "max_steps": 400, "steps": 400}
    validated = [
        json.loads(line)["step"] for line in (out_dir / "metrics.jsonl").read_text().splitlines() if '"val"' in line
    ]
    assert validated == [400]
    assert last_train_record(out_dir)["lr"] == pytest.approx(OPTIM.lr * OPTIM.min_lr_ratio)  # annealed at step 400
