"""What a run trains with: the objects train.py's build_setup makes from the config, in one record."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader

from data.codec import CTCCodec
from data.lmdb_dataset import LmdbDataset
from data.samplers import GlobalBatchSampler
from data.transforms import Preprocessing
from training.weight_average import WeightAverage


@dataclass(kw_only=True)  # fourteen fields, several of one type: built by name, never by position
class Setup:
    """What a run trains with, built from its config: shared by train.py and tools/benchmark.py."""

    codec: CTCCodec
    preprocessing: Preprocessing  # what turns an image into the model's input; stored in every checkpoint
    model: nn.Module  # on the device, not wrapped: the one the optimizer steps
    frames: int  # per image: the longest label CTC can align
    train_sets: list[LmdbDataset]
    val_sets: list[LmdbDataset]
    loader: DataLoader
    sampler: GlobalBatchSampler
    precision: str
    memory_format: torch.memory_format
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    average: WeightAverage | None  # optim.ema_decay > 0: the moving average of model's weights

    @property
    def evaluated_model(self) -> nn.Module:
        """What validation scores and checkpoints hold: the weight average when the run keeps one."""
        return self.average.model if self.average is not None else self.model
