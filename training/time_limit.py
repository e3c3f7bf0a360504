"""train.max_minutes in a running loop: `TimeLimit`, the one object the training loop calls, once a step.

It times the loop's steps (time_budget.StepClock), plans the step the run ends at from their pace and plans
again as the pace drifts (time_budget.py holds the arithmetic and says why), and carries each plan out: the
run's end, its learning-rate schedule refitted to end there, the progress bar's total and the record the
checkpoints keep. Rank 0's plan is every rank's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from training.config import short_of_warmup
from training.optim import fit_schedule
from training.run import Run
from training.run_log import RunLog
from training.time_budget import TIMED_STEPS, UNTIMED_STEPS, Pace, Plan, StepClock, end_planned_again, steps_that_fit
from utils.distributed import broadcast_object

Result = TypeVar("Result")


def plans_its_end(run: Run) -> bool:
    """Whether this run times its steps to plan its end: train.max_minutes set, no plan kept from a
    checkpoint, and more steps to go than the timing takes."""
    state = run.state
    return (
        run.config.train.max_minutes is not None
        and state.plan is None
        and state.end - state.step > UNTIMED_STEPS + TIMED_STEPS
    )


class TimeLimit:
    """train.max_minutes for one loop: made where the loop starts (the minutes count from there), told of
    each step (`after_step`), and handed the validation to time it apart from the steps (`timing`). A run
    without the limit, or one that keeps its checkpoint's plan, gets one that does nothing."""

    def __init__(self, run: Run, log: RunLog) -> None:
        self.run, self.log = run, log
        self.clock = StepClock(run.state.step) if plans_its_end(run) else None

    @staticmethod
    def start_up_line(run: Run) -> str | None:
        """What the start-up log says of train.max_minutes: the end a resumed run keeps, or how it will be planned."""
        minutes = run.config.train.max_minutes
        if run.state.plan is not None:
            return f"train.max_minutes={minutes:g}: the run ends at step {run.state.end}, as planned"
        if plans_its_end(run):
            return (
                f"train.max_minutes={minutes:g}: the steps that fit are planned from the pace of {TIMED_STEPS} steps, "
                f"after the first {UNTIMED_STEPS}"
            )
        return None

    def after_step(self) -> None:
        """Plans the end once the timed steps are done, and again every REPLAN_EVERY steps after them: may
        move run.state.end. Every rank calls it after every step (a plan is a collective)."""
        clock, state = self.clock, self.run.state
        if clock is None:
            return
        clock.tick(state.step)
        if state.step == clock.plan_at:
            self.plan()
        elif state.plan is not None and clock.plans_again(state.step, state.end):
            self.plan_again()

    def timing(self, validate: Callable[..., Result]) -> Callable[..., Result]:
        """`validate`, its seconds told to the clock: the plans made again count steps and validations apart."""
        clock = self.clock
        if clock is None:
            return validate

        def timed(*args: Any, **kwargs: Any) -> Result:
            started = clock.now()
            result = validate(*args, **kwargs)
            clock.validated(clock.now() - started)
            return result

        return timed

    def plan(self) -> None:
        """The step this run ends at, from the pace of the steps the clock timed, with the schedule refitted
        to it."""
        config, clock, state = self.run.config, self.clock, self.run.state
        validation_images = sum(len(dataset) for dataset in self.run.setup.validated_sets)
        pace = Pace.measured(
            clock.seconds_per_step(), config.train.batch_size, validation_images, config.train.eval_every
        )
        clock.expect_validation(pace.seconds_per_validation)
        end = steps_that_fit(pace, clock.seconds_left(config.train.max_minutes), state.step, config.train.max_steps)
        end = broadcast_object(end, group=self.run.env.cpu_group)
        self.end_at(end)
        steps = config.train.max_steps - state.step
        verdict = (
            f"they fit: the run ends at step {end}"
            if end == config.train.max_steps
            else f"the run ends at step {end} instead, its learning-rate schedule fitted to end there"
        )
        self.log.info(
            f"train.max_minutes={config.train.max_minutes:g}: {pace.seconds_per_step:.3f} s a step here, so the "
            f"{steps} steps to train.max_steps={config.train.max_steps} would take "
            f"~{pace.seconds_for(steps) / 60:.1f} more minutes; {verdict}"
        )

    def plan_again(self) -> None:
        """The plan made again from every step timed so far and the last validation's own time, where the
        machine's pace has drifted from the first steps'."""
        config, clock, state = self.run.config, self.clock, self.run.state
        minutes, pace = config.train.max_minutes, clock.pace_so_far(config.train.eval_every)
        end = end_planned_again(
            pace, clock.seconds_left(minutes), state.step, state.end, config.train.max_steps, minutes
        )
        end = broadcast_object(end, group=self.run.env.cpu_group)
        if end != state.end:
            self.log.info(
                f"train.max_minutes={minutes:g}: {pace.seconds_per_step:.3f} s a step since step "
                f"{clock.timed_from} and {pace.seconds_per_validation:.1f} s a validation; the run ends at step "
                f"{end} instead of {state.end}, its learning-rate schedule fitted to end there"
            )
            self.end_at(end)

    def end_at(self, end: int) -> None:
        """The plan's end: kept in the checkpoints, the schedule refitted to it, the progress bar's total."""
        config, state = self.run.config, self.run.state
        state.plan, state.end = Plan(config.train.max_minutes, config.train.max_steps, end), end
        fit_schedule(self.run.setup.scheduler, config.optim, end)
        self.log.set_total(end)
        warning = short_of_warmup(
            config.optim, end, f"the {end} steps that fit train.max_minutes={config.train.max_minutes:g}"
        )
        if warning:
            self.log.info(f"warning: {warning}; raise train.max_minutes or lower optim.warmup_steps")
