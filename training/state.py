"""What the training loop changes as it runs, in one object."""

from __future__ import annotations

from dataclasses import dataclass, field

from training.log_window import LogWindow
from training.time_budget import Plan


@dataclass(kw_only=True)
class TrainState:
    window: LogWindow  # the numbers of the next log line
    end: int  # the step the run ends at: train.max_steps, or the plan's
    plan: Plan | None = None  # train.max_minutes's, once made
    step: int = 0  # optimizer steps taken (skipped ones included)
    best_accuracy: float = -1.0  # the best validation accuracy so far (best.pt's)
    # Word accuracy by LMDB (data.val and data.retain): train.init_from's before the first step, and best.pt's
    best_readings: dict[str, float] = field(default_factory=dict)
    start_readings: dict[str, float] = field(default_factory=dict)
    skipped_in_a_row: int = 0  # steps skipped for a non-finite gradient since the last good one
