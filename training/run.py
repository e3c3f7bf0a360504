"""A training run as one object: what it trains with (`Setup`, which training/setup.py builds), how far its
loop has come (`TrainState`), and its state as a training checkpoint holds it: saved with one call
(`Run.state_dict()`) and resumed with one (`Run.load_state_dict()`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from data.codec import CTCCodec
from data.lmdb_dataset import LmdbDataset
from data.samplers import GlobalBatchSampler
from data.transforms import DeviceTransform, Preprocessing
from training.checkpoint import is_training_checkpoint, weights_checkpoint
from training.config import Config
from training.optim import apply_schedule, fit_schedule
from training.state import TrainState
from training.time_budget import Plan
from training.weight_average import WeightAverage
from utils.distributed import DistEnv, gather_objects
from utils.rng import capture_rng_state


@dataclass(kw_only=True)  # sixteen fields, several of one type: built by name, never by position
class Setup:
    """What a run trains with, built from its config (training/setup.py's build_setup): shared by train.py
    and tools/benchmark.py."""

    codec: CTCCodec
    preprocessing: Preprocessing  # what turns an image into the model's input; stored in every checkpoint
    model: nn.Module  # on the device, not wrapped: the one the optimizer steps
    frames: int  # per image: the longest label CTC can align
    train_sets: list[LmdbDataset]
    val_sets: list[LmdbDataset]
    retain_sets: list[LmdbDataset]  # data.retain: read with data.val, never choosing best.pt
    loader: DataLoader
    sampler: GlobalBatchSampler
    device_transform: DeviceTransform  # the loader's uint8 pixels to the model's input: augmented, normalised
    precision: str
    loader_workers: int  # data.num_workers, `auto` resolved for this machine (setup.py's loader_workers_of)
    memory_format: torch.memory_format
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    average: WeightAverage | None  # optim.ema_decay > 0: the moving average of model's weights

    @property
    def validated_sets(self) -> list[LmdbDataset]:
        """Every set a validation reads: data.val's, then data.retain's."""
        return self.val_sets + self.retain_sets

    @property
    def evaluated_model(self) -> nn.Module:
        """What validation scores and checkpoints hold: the weight average when the run keeps one."""
        return self.average.model if self.average is not None else self.model


@dataclass(kw_only=True)
class Run:
    """A training run: its config, its processes, what it trains with and how far its loop has come.

    The training part of the checkpoint schema (training/checkpoint.py lists every key) is written by
    `state_dict()` and restored by `load_state_dict()`, side by side so that they cannot drift apart.
    What a resume only compares with this run (config, data sizes) and the RNG states, restored last,
    are training/setup.py's.
    """

    config: Config
    env: DistEnv
    setup: Setup
    state: TrainState
    provenance: dict[str, Any] | None = None  # what it trains on (data/provenance.py), in every checkpoint

    def weights(self, accuracy: float | None) -> dict[str, Any]:
        """What best.pt holds: the weights validation scores at this step, and `accuracy`, their score
        on data.val (None when not scored)."""
        setup = self.setup
        checkpoint = weights_checkpoint(
            setup.evaluated_model,
            self.config,
            setup.codec.alphabet,
            setup.preprocessing,
            step=self.state.step,
            accuracy=accuracy,
            world_size=self.env.world_size,
            precision=setup.precision,
            provenance=self.provenance,
        )
        return {**checkpoint, "start_readings": self.state.start_readings}

    def state_dict(self) -> dict[str, Any]:
        """The weights plus everything an exact resume needs. A collective: every rank calls it and adds
        its RNG state and log sums, and rank 0's result, the one that holds them all, is the one to save.
        With a weight average, `model` holds the average and `raw_model` the weights the optimizer steps.
        `best_accuracy` was measured on the config's data.val: a resumed run that validates on other sets
        starts it afresh."""
        setup, state = self.setup, self.state
        log_window = state.window.state_dict()
        rng = gather_objects(capture_rng_state(self.env.device), group=self.env.cpu_group)
        checkpoint = {
            **self.weights(accuracy=None),
            "optimizer": setup.optimizer.state_dict(),
            "scheduler": setup.scheduler.state_dict(),
            "scaler": setup.scaler.state_dict(),
            "best_accuracy": state.best_accuracy,
            "best_readings": state.best_readings,
            "log_window": log_window,
            "rng": rng,
            "data_sizes": setup.sampler.sizes,
            "plan": state.plan.to_dict() if state.plan else None,
        }
        if setup.average is not None:
            checkpoint.update(raw_model=setup.model.state_dict(), average_updates=setup.average.updates)
        return checkpoint

    def load_state_dict(self, checkpoint: dict[str, Any], path: str | Path) -> None:
        """Continue from a training checkpoint (train.resume, `path` names it in errors): the weights, the
        weight average when the run keeps one (a checkpoint written without one starts it there), the
        optimizer, scheduler and scaler, the step, the best accuracy, the log window, and train.max_minutes's
        plan where this run keeps it (time_budget.Plan.kept). The RNG states are left to the caller:
        building the loaders and the model draws random numbers, so they are restored last."""
        setup = self.setup
        if not is_training_checkpoint(checkpoint):
            raise ValueError(
                f"train.resume: {path} holds weights only (best.pt?); resume from a ckpt-*.pt or "
                f"last.pt, or start from these weights with train.init_from"
            )
        alphabet = setup.codec.alphabet
        if checkpoint.get("alphabet") != alphabet:
            raise ValueError(
                f"train.resume: {path} was trained with another alphabet "
                f"({len(checkpoint.get('alphabet') or '')} characters; data.alphabet has {len(alphabet)}, "
                f"or another order). To train on these characters, start a new run from its weights: "
                f"train.init_from={path}"
            )
        averaged = "raw_model" in checkpoint
        setup.model.load_state_dict(checkpoint["raw_model"] if averaged else checkpoint["model"], strict=True)
        if setup.average is not None and averaged:
            setup.average.load(checkpoint["model"], checkpoint["average_updates"])
        load_optimizer_position(setup.optimizer, setup.scheduler, checkpoint)
        setup.scaler.load_state_dict(checkpoint["scaler"])
        self.state.step, self.state.best_accuracy = checkpoint["step"], checkpoint["best_accuracy"]
        # Written before data.retain existed: no readings, and the run's end reports none
        self.state.best_readings = checkpoint.get("best_readings", {})
        self.state.start_readings = checkpoint.get("start_readings", {})
        self.state.window.load_state_dict(checkpoint["log_window"], self.env.is_main)
        train = self.config.train
        plan = Plan.kept(checkpoint.get("plan"), train.max_minutes, train.max_steps)
        if plan is not None:
            self.state.plan, self.state.end = plan, plan.steps
            fit_schedule(setup.scheduler, self.config.optim, plan.steps)


def load_optimizer_position(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR, checkpoint: dict[str, Any]
) -> None:
    """The optimizer's state (moments, the step count) and the scheduler's position come from the
    checkpoint, the hyperparameters and the schedule from this run's config: optim.lr or
    optim.weight_decay changed on resume apply, as the log says they do."""
    hyperparameters = [
        {key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups
    ]
    optimizer.load_state_dict(checkpoint["optimizer"])
    for group, values in zip(optimizer.param_groups, hyperparameters):
        group.update(values)
    scheduler.load_state_dict(checkpoint["scheduler"])  # its position; the schedule is this run's (LambdaLR)
    scheduler.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
    apply_schedule(scheduler)
