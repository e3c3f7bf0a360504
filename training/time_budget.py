"""train.max_minutes: a run that fits its minutes on the machine it runs on.

The loop times its first steps (`UNTIMED_STEPS` left out, then `TIMED_STEPS`), and from their pace plans
the step the run ends at: train.max_steps when they fit, else as many as do, the learning-rate schedule
fitted to end there (training/optim.py). A cosine schedule cut short by a clock would stop at a high
learning rate; fitted, the shorter run still ends annealed. Every `REPLAN_EVERY` steps after that the
plan is made again from every step timed so far and the last validation's own time: a machine whose
speed drifted after the first steps (CPUs here moved +-20 % from minute to minute) ends nearer its
minutes, whether or not it validates before its end. A plan is
made on rank 0 and is every rank's; a checkpoint keeps it (`Plan.to_dict`), and a resume under the same
train.max_minutes and train.max_steps goes on to the planned step, wherever it runs.

What it counts: the training loop, validations and checkpoints included, from its first step; not the
start-up before it, nor what ran before train.py. It is a plan, not a deadline: what drifts in the last
`REPLAN_EVERY` steps, and the last validation itself, end the run early or late by as much.

This module is the arithmetic and the clock; training/time_limit.py's `TimeLimit` carries the plans out in
the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

# The first steps choose kernels and fill caches: slower than the rest. Then 200 steps are timed: on a
# 2-core Xeon the 100 after the first 10 ran at 311 images/s, the next 900 at 323-335 and the whole run
# at ~340, so a plan from them left a tenth of the minutes unused (docs/training.md).
UNTIMED_STEPS = 50
TIMED_STEPS = 200
# A plan that cuts ends on a round step, as a person would set train.max_steps (and the logs and the
# checkpoints' numbers line up with it); it leaves at most that many steps' time unused.
ROUND_TO = 100
# How often the plan is made again: each time a collective (rank 0's plan is every rank's), so not every
# step; 100 steps are 20 to 40 s on the 2-core CPUs measured, a few hundredths of their minutes.
REPLAN_EVERY = 100
# A plan made again moves the end only where the one it has would miss the minutes by more than this share
# of them (18 s of 15 minutes): less is the clock's own noise, and each move jumps the learning rate a little.
REPLAN_TOLERANCE = 0.02
# What validating an image costs against training on one: a forward pass, against a step's forward and
# backward (about twice the forward).
VALIDATION_SHARE = 1 / 3


@dataclass(frozen=True)
class Plan:
    """A run's planned end, and what it was planned under."""

    minutes: float  # train.max_minutes
    max_steps: int  # train.max_steps
    steps: int  # the step the run ends at

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def kept(cls, record: dict[str, Any] | None, minutes: float | None, max_steps: int) -> Plan | None:
        """A checkpoint's plan (`record`), if this run is to go on with it: planned under the same
        train.max_minutes and train.max_steps. Changed on resume, this run's values apply instead."""
        if record is None or minutes is None:
            return None
        plan = cls(**record)
        return plan if (plan.minutes, plan.max_steps) == (minutes, max_steps) else None


@dataclass(frozen=True)
class Pace:
    """What a run's steps cost on this machine: a training step, and a validation (every `eval_every`
    steps and at the end)."""

    seconds_per_step: float
    seconds_per_validation: float
    eval_every: int

    @classmethod
    def measured(cls, seconds_per_step: float, batch_size: int, validation_images: int, eval_every: int) -> Pace:
        per_image = seconds_per_step / batch_size
        return cls(seconds_per_step, validation_images * per_image * VALIDATION_SHARE, eval_every)

    def seconds_for(self, steps: int) -> float:
        return steps * self.seconds_per_step_and_share() + self.seconds_per_validation

    def seconds_per_step_and_share(self) -> float:
        """A step, and its share of the validations."""
        return self.seconds_per_step + self.seconds_per_validation / self.eval_every


def steps_that_fit(pace: Pace, seconds_left: float, step: int, max_steps: int) -> int:
    """The step a run at `step` ends at to finish within `seconds_left` at `pace`: at most `max_steps`;
    fewer are rounded down to a multiple of `ROUND_TO`, and never below `step` (nothing more fits: end now)."""
    if pace.seconds_for(max_steps - step) <= seconds_left:
        return max_steps
    fit = step + int(max(0.0, seconds_left - pace.seconds_per_validation) // pace.seconds_per_step_and_share())
    return max(step, min(fit, max_steps) // ROUND_TO * ROUND_TO)


def end_planned_again(pace: Pace, seconds_left: float, step: int, end: int, max_steps: int, minutes: float) -> int:
    """The end a run at `step` planned to stop at `end` keeps where it still finishes within
    `REPLAN_TOLERANCE` of its minutes at `pace`, else the one that fits now (`steps_that_fit`)."""
    if abs(seconds_left - pace.seconds_for(end - step)) <= REPLAN_TOLERANCE * 60 * minutes:
        return end
    return steps_that_fit(pace, seconds_left, step, max_steps)


class StepClock:
    """Times the loop from its first step: the `TIMED_STEPS` after the first `UNTIMED_STEPS` for the plan,
    and every step and validation after them for the plans made again."""

    def __init__(self, first_step: int, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now
        self.started = now()
        self.timed_from = first_step + UNTIMED_STEPS
        self.plan_at = self.timed_from + TIMED_STEPS  # the step after which the plan is made
        self.timing_started = self.started
        self.step = first_step
        self.validating = 0.0  # seconds spent validating since the timing started
        self.last_validation = 0.0  # the first plan's estimate until a validation is timed (`expect_validation`)

    def tick(self, step: int) -> None:
        """Call after each step, with the number of steps taken."""
        self.step = step
        if step == self.timed_from:
            self.timing_started = self.now()

    def plans_again(self, step: int, end: int) -> bool:
        """Whether the plan is made again after `step`: every `REPLAN_EVERY` steps after the first plan,
        until the planned `end`."""
        return self.plan_at < step < end and step % REPLAN_EVERY == 0

    def expect_validation(self, seconds: float) -> None:
        """The first plan's estimate of a validation, for the plans made before one is timed."""
        self.last_validation = seconds

    def validated(self, seconds: float) -> None:
        """Call after each validation, with the seconds it took."""
        if self.step >= self.timed_from:
            self.validating += seconds
            self.last_validation = seconds

    def seconds_per_step(self) -> float:
        """The pace of the `TIMED_STEPS`, for the plan."""
        return (self.now() - self.timing_started) / TIMED_STEPS

    def pace_so_far(self, eval_every: int) -> Pace:
        """What every step since the timing started cost, validations apart, and what the last validation
        took (or, before one is timed, the first plan's estimate): for the plans made again."""
        stepping = self.now() - self.timing_started - self.validating
        return Pace(stepping / max(1, self.step - self.timed_from), self.last_validation, eval_every)

    def seconds_left(self, minutes: float) -> float:
        return 60 * minutes - (self.now() - self.started)
