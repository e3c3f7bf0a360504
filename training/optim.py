"""The optimizers and learning-rate schedules a run can name (optim.name, optim.schedule): one table each,
which training.config.validate reads for the names it accepts.

A fork adds an optimizer or a schedule with one entry in its dict below, e.g.

    "sgd": lambda parameters, optim: torch.optim.SGD(parameters, lr=optim.lr, momentum=0.9),    # OPTIMIZERS
    "linear": lambda progress, optim: 1 - (1 - optim.min_lr_ratio) * progress,                  # SCHEDULES

and `optim.name=sgd` or `optim.schedule=linear` then selects it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

# `optim` below is the config's optim section (training.config.OptimConfig). It is not imported for
# its name: training.config imports this module to read the tables, and imports run one way.
OptimSection = Any

# optim.name -> the optimizer over a model's parameters, with optim.lr and optim.weight_decay.
OPTIMIZERS: dict[str, Callable[[Iterable[nn.Parameter], OptimSection], torch.optim.Optimizer]] = {
    # Fused: one kernel for all parameters instead of a loop over them, 1.4 ms against 5-8 ms a step
    # for configs/crnn.yaml's model on one CPU thread (docs/performance.md).
    "adam": lambda parameters, optim: torch.optim.Adam(
        parameters, lr=optim.lr, weight_decay=optim.weight_decay, fused=True
    ),
    # The deep-text-recognition-benchmark recipe (use optim.lr=1.0).
    "adadelta": lambda parameters, optim: torch.optim.Adadelta(
        parameters, lr=optim.lr, rho=0.95, eps=1e-8, weight_decay=optim.weight_decay
    ),
}


def cosine(progress: float, optim: OptimSection) -> float:
    """From 1 down to optim.min_lr_ratio along half a cosine."""
    return optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def stable_then_decay(progress: float, optim: OptimSection) -> float:
    """1 until the last optim.decay_share of the steps, then the cosine down over them
    ("warmup-stable-decay"). A run that plans its end again (train.max_minutes) moves only the decay: the
    rate of every step before it stays what it was, where a re-planned cosine jumps (docs/training.md)."""
    stable = 1 - optim.decay_share
    return 1.0 if progress <= stable else cosine((progress - stable) / optim.decay_share, optim)


# optim.schedule -> the factor of optim.lr after the warm-up, from the share of those steps done (0 to 1).
SCHEDULES: dict[str, Callable[[float, OptimSection], float]] = {
    "cosine": cosine,
    "wsd": stable_then_decay,
    "constant": lambda progress, optim: 1.0,
}


def build_optimizer(
    optim: OptimSection, max_steps: int, model: nn.Module
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The run's optimizer over `model`'s parameters, and its learning rate: a linear warm-up over
    optim.warmup_steps, then the schedule over the rest of the `max_steps` (train.max_steps)."""
    optimizer = OPTIMIZERS[optim.name](model.parameters(), optim)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(optim, max_steps))


def lr_factor(optim: OptimSection, max_steps: int) -> Callable[[int], float]:
    """The factor of optim.lr at each step of a run that ends at `max_steps`."""
    schedule = SCHEDULES[optim.schedule]

    def factor(step: int) -> float:
        # Linear warm-up: large early steps push a CTC model into predicting blanks everywhere.
        if step < optim.warmup_steps:
            return (step + 1) / optim.warmup_steps
        progress = (step - optim.warmup_steps) / max(1, max_steps - optim.warmup_steps)
        return schedule(min(progress, 1.0), optim)

    return factor


def fit_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, optim: OptimSection, max_steps: int) -> None:
    """`scheduler` (build_optimizer's) refitted to end at `max_steps`, from the step it is at on: the
    learning rate of the next step is the new schedule's."""
    scheduler.lr_lambdas = [lr_factor(optim, max_steps) for _ in scheduler.optimizer.param_groups]
    apply_schedule(scheduler)


def apply_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """The optimizer's learning rates set to what `scheduler` gives at its position."""
    for group, base_lr, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base_lr * factor(scheduler.last_epoch)
