"""What a run trains with: the objects train.py's build_setup makes from the config, in one record, and the
steps of building them that take more than a line there (the model, the datasets, the loader workers, the
precision)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader

from data.codec import CTCCodec
from data.label_index import index_cache_dir
from data.lmdb_dataset import LmdbDataset
from data.samplers import GlobalBatchSampler
from data.transforms import DeviceTransform, ImageTransform, Preprocessing, build_transform
from models import model_from_config, output_frames
from training.config import Config, ConfigError
from training.precision_choice import choose_precision
from training.weight_average import WeightAverage
from utils.distributed import DistEnv, loader_workers, read_env, usable_cores
from utils.sync_batchnorm import convert_sync_batchnorm


@dataclass(kw_only=True)  # sixteen fields, several of one type: built by name, never by position
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
    device_transform: DeviceTransform  # the loader's uint8 pixels to the model's input: augmented, normalised
    precision: str
    loader_workers: int  # data.num_workers, `auto` resolved for this machine (loader_workers_of)
    memory_format: torch.memory_format
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    average: WeightAverage | None  # optim.ema_decay > 0: the moving average of model's weights

    @property
    def evaluated_model(self) -> nn.Module:
        """What validation scores and checkpoints hold: the weight average when the run keeps one."""
        return self.average.model if self.average is not None else self.model


def model_and_frames(config: Config, codec: CTCCodec, env: DistEnv) -> tuple[nn.Module, int]:
    """config.model for `codec`'s classes (its initial weights drawn from the current seed), not yet on the
    device, and its frames per image; an image size the network cannot take is named by its data.* keys."""
    data = config.data
    model = model_from_config(config.model, codec.num_classes)
    try:
        frames = output_frames(model, config.model.in_channels, data.img_height, data.img_width)
    except ValueError as error:
        raise ConfigError(f"data.img_height={data.img_height}, data.img_width={data.img_width}: {error}") from None
    if config.model.sync_bn and env.distributed:
        model = convert_sync_batchnorm(model, env.device)
    return model, frames


def open_datasets(
    config: Config, preprocessing: Preprocessing, codec: CTCCodec, frames: int
) -> tuple[list[LmdbDataset], list[LmdbDataset]]:
    """data.train's LMDBs, which share the transform whose uint8 pixels training augments on the device, and
    data.val's, which share one that pads to data.eval_width_step. Each keeps the samples whose labels fit
    `codec` and `frames` (data.unknown_characters: whether a character outside the alphabet leaves its
    sample out or is removed from its label)."""
    data = config.data
    cache = index_cache_dir(data.index_cache)
    remove_unknown = data.unknown_characters == "remove"

    def open_lmdb(root: str, transform: ImageTransform) -> LmdbDataset:
        return LmdbDataset(root, codec, frames, transform, remove_unknown=remove_unknown, index_cache=cache)

    train_transform = build_transform(config, preprocessing, train=True)
    train_sets = [open_lmdb(root, train_transform) for root in data.train]
    val_transform = build_transform(config, preprocessing)
    return train_sets, [open_lmdb(root, val_transform) for root in data.val]


def training_precision(
    config: Config,
    env: DistEnv,
    model: nn.Module,
    memory_format: torch.memory_format,
    log: Callable[[str], None],
    recorded_precision: str | None,
) -> str:
    """train.precision as the precision this run trains in: `auto` times the candidates on one process's
    batch, unless the run resumes one that measured it at its start (`recorded_precision`), which it keeps."""
    precision = config.train.precision
    if precision == "auto" and recorded_precision:
        log(f"precision auto: {recorded_precision}, as the run measured it at its start")
        precision = recorded_precision
    data = config.data
    input_shape = (config.train.batch_size // env.world_size, config.model.in_channels, data.img_height, data.img_width)
    return choose_precision(
        precision,
        env.device,
        model,
        input_shape,
        training=True,
        memory_format=memory_format,
        log=log,
        is_main=env.is_main,
        group=env.cpu_group,
    )


def loader_workers_of(config: Config, env: DistEnv, log: Callable[[str], None]) -> int:
    """data.num_workers as a number: `auto` resolved for this machine and this run's processes, and said
    once at start-up. The config keeps `auto`, so a run resumed on another machine resolves it again."""
    workers = config.data.num_workers
    if workers != "auto":
        return workers
    cores, processes = usable_cores(), read_env()[3]
    workers = loader_workers(cores, processes, env.device.type)
    if env.device.type == "cuda":
        plural, floor = "es" if processes > 1 else "", "; at least 1" if cores // processes < 2 else ""
        why = f"{cores} cores / {processes} process{plural}, one left for each training process{floor}"
    else:
        why = "on the CPU the training processes fill the cores themselves: each loads its own batches"
    log(f"data.num_workers auto: {workers} loader worker{'s' if workers != 1 else ''} per process ({why})")
    return workers
