"""A run set up, from its config to the loop's first step, in one place: `start_run` runs the stages in the
order they must run (the checkpoint it resumes, what it trains with, its state, its folder, its validation
loaders, the model the loop steps), and each stage follows it in that order. The run folder's lock, held while
the run lives, is `holding_run_folder`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from data.codec import CTCCodec
from data.label_index import index_cache_dir
from data.lmdb_dataset import LmdbDataset
from data.loaders import build_eval_loader, build_train_loader
from data.provenance import resumed_record, run_record
from data.transforms import ImageTransform, Preprocessing, build_device_transform, build_transform
from models import count_parameters, model_from_config, output_frames
from training.alphabet_policy import run_alphabet
from training.checkpoint import check_config, load_checkpoint, load_initial_weights
from training.config import Config, ConfigError, config_warnings, to_dict
from training.log_window import LogWindow
from training.optim import build_optimizer
from training.precision_choice import choose_precision
from training.run import Run, Setup
from training.run_folder import (
    best_in_folder,
    clear_run_folder,
    find_latest_checkpoint,
    lock_run_folder,
    unlock_run_folder,
    write_config,
    write_provenance,
)
from training.run_log import RunLog
from training.state import TrainState
from training.time_limit import TimeLimit
from training.weight_average import WeightAverage
from utils.distributed import DistEnv, broadcast_object, loader_workers, read_env, usable_cores
from utils.rng import restore_rng_state
from utils.sync_batchnorm import convert_sync_batchnorm

Checkpoint = tuple[str, dict[str, Any]]  # the path of a training checkpoint to resume, and what it holds


@contextmanager
def holding_run_folder(config: Config, env: DistEnv, log: RunLog) -> Iterator[None]:
    """Rank 0 locks the run folder (training.run_folder.lock_run_folder) for as long as the run lives; every
    rank stops alike when another run holds it."""
    lock, refusal = None, ""
    if env.is_main:
        try:
            lock, leftovers = lock_run_folder(config.train.out_dir)
        except ConfigError as error:
            refusal = str(error)
        else:
            if leftovers:
                log.info(
                    f"removed {len(leftovers)} temporary file(s) a run killed while writing left: "
                    f"{', '.join(path.name for path in leftovers)}"
                )
    refusal = broadcast_object(refusal, group=env.cpu_group)
    if refusal:
        raise ConfigError(refusal)
    try:
        yield
    finally:
        if lock is not None:
            unlock_run_folder(lock)


def start_run(config: Config, env: DistEnv, log: RunLog) -> tuple[Run, nn.Module, list[DataLoader]]:
    """The run, resumed or started afresh and described in the log; the model the loop steps
    (run.setup.model, wrapped by wrap_for_training); the loaders of data.val, then data.retain."""
    resume_from = find_resume_checkpoint(config, env, log)  # read before train.overwrite clears the folder
    provenance = data_provenance(config, resume_from)  # a bad meta.json stops the run before the data is read
    log.info(f"config:\n{yaml.safe_dump(to_dict(config), sort_keys=False)}")
    setup = build_setup(config, env, log.info, resume_from)
    state = TrainState(window=LogWindow(env.device), end=config.train.max_steps)
    run = Run(config=config, env=env, setup=setup, state=state, provenance=provenance)
    if resume_from:
        resume(run, log, *resume_from)
    elif config.train.init_from:
        log.info(load_initial_weights(setup.model, config.train.init_from, setup.codec.alphabet, config))
        if setup.average is not None:  # a copy of the model as built: what validation before a step would score
            setup.average.load(setup.model.state_dict(), updates=0)
    if not config.train.overwrite:
        keep_best_of_folder(run, log)
    start_run_folder(run, log, resume_from)  # the first write: everything that can fail has run
    val_loaders = build_val_loaders(run, log)
    model = wrap_for_training(setup.model, env, config.train.compile)
    describe_run(run, log)
    if resume_from:  # last: model building and data loading above draw random numbers too
        restore_random_state(resume_from[1]["rng"], env, log)
    return run, model, val_loaders


def find_resume_checkpoint(config: Config, env: DistEnv, log: RunLog) -> Checkpoint | None:
    """The checkpoint this run continues from, the same on every rank: rank 0 chooses, the others load it."""
    resume = config.train.resume
    if resume == "none" or (resume == "auto" and config.train.overwrite):
        return None
    if resume != "auto":
        return resume, load_checkpoint(resume)
    found = find_latest_checkpoint(config.train.out_dir, warn=log.info) if env.is_main else None
    path = broadcast_object(str(found[0]) if found else "", group=env.cpu_group)
    if not path:
        return None
    return path, found[1] if env.is_main else load_checkpoint(path)


def data_provenance(config: Config, resume_from: Checkpoint | None) -> dict[str, Any]:
    """What the run trains on (data/provenance.py): the meta.json of data.train's and data.val's LMDBs; a
    resume keeps its checkpoint's record; a fine-tune adds its start checkpoint's own."""
    record = run_record(config.data.train, config.data.val)
    if resume_from:
        return resumed_record(record, resume_from[1].get("provenance"))
    start = config.train.init_from
    if not start:
        return record
    return run_record(config.data.train, config.data.val, start, load_checkpoint(start).get("provenance"))


def build_setup(
    config: Config, env: DistEnv, log: Callable[[str], None] = print, resume_from: Checkpoint | None = None
) -> Setup:
    """Everything the run trains with. `resume_from`: the checkpoint a resumed run continues, whose alphabet
    a union run reads again (training/alphabet_policy.py) and whose precision, measured at the run's start,
    is kept under `auto` so that the run goes on as it began."""
    torch.manual_seed(config.train.seed)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)
    data = config.data
    codec = CTCCodec(run_alphabet(config, resume_from), fold_case=data.fold_case)
    model, frames = model_and_frames(config, codec, env)
    preprocessing = Preprocessing.from_config(config)  # the datasets' and every checkpoint's: one record
    train_sets, val_sets, retain_sets = open_datasets(config, preprocessing, codec, frames)
    workers = loader_workers_of(config, env, log)  # data.num_workers `auto`: resolved for this machine
    loader, sampler = build_train_loader(
        train_sets, codec, config.train.batch_size, data.train_ratios or None, config.train.seed, workers, env
    )
    memory_format = torch.channels_last if config.train.channels_last else torch.contiguous_format
    model.to(env.device, memory_format=memory_format)
    recorded_precision = resume_from[1].get("precision") if resume_from else None
    precision = training_precision(config, env, model, memory_format, log, recorded_precision)
    optimizer, scheduler = build_optimizer(config.optim, config.train.max_steps, model)
    # fp16 needs loss scaling to keep small gradients from flushing to zero; bf16 and fp32 do not.
    scaler = torch.amp.GradScaler(env.device.type, enabled=precision == "fp16")
    average = WeightAverage(model, config.optim.ema_decay) if config.optim.ema_decay > 0 else None
    return Setup(
        codec=codec,
        preprocessing=preprocessing,
        model=model,
        frames=frames,
        train_sets=train_sets,
        val_sets=val_sets,
        retain_sets=retain_sets,
        loader=loader,
        sampler=sampler,
        device_transform=build_device_transform(config, train_sets[0].transform),
        precision=precision,
        loader_workers=workers,
        memory_format=memory_format,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        average=average,
    )


def model_and_frames(config: Config, codec: CTCCodec, env: DistEnv) -> tuple[nn.Module, int]:
    """config.model for `codec`'s classes (its initial weights drawn from the current seed), not yet on the
    device, and its frames per image; an image size the network cannot take is named by its data.* keys."""
    data = config.data
    model = model_from_config(config.model, codec.num_classes)
    try:
        frames = output_frames(model, config.model.in_channels, data.img_height, data.img_width)
    except ValueError as error:
        raise ConfigError(f"data.img_height={data.img_height}, data.img_width={data.img_width}: {error}") from None
    # The overfit check too: with its few samples, rank 0's statistics of its slice would not read the other
    # ranks' slices, and the check would fail where one process with the same global batch passes.
    if (config.model.sync_bn or config.train.overfit_batches) and env.distributed:
        model = convert_sync_batchnorm(model, env.device)
    return model, frames


def open_datasets(
    config: Config, preprocessing: Preprocessing, codec: CTCCodec, frames: int
) -> tuple[list[LmdbDataset], list[LmdbDataset], list[LmdbDataset]]:
    """data.train's LMDBs, which share the transform whose uint8 pixels training augments on the device, and
    data.val's and data.retain's, which share one that pads to data.eval_width_step. Each keeps the samples
    whose labels fit `codec` and `frames` (data.unknown_characters: whether a character outside the alphabet
    leaves its sample out or is removed from its label)."""
    data = config.data
    cache = index_cache_dir(data.index_cache)
    remove_unknown = data.unknown_characters == "remove"

    def open_lmdb(root: str, transform: ImageTransform) -> LmdbDataset:
        return LmdbDataset(root, codec, frames, transform, remove_unknown=remove_unknown, index_cache=cache)

    train_transform = build_transform(config, preprocessing, train=True)
    train_sets = [open_lmdb(root, train_transform) for root in data.train]
    val_transform = build_transform(config, preprocessing)
    val_sets = [open_lmdb(root, val_transform) for root in data.val]
    return train_sets, val_sets, [open_lmdb(root, val_transform) for root in data.retain]


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


def resume(run: Run, log: RunLog, path: str, checkpoint: dict[str, Any]) -> None:
    """Continue from `checkpoint` (at `path`), after checking it against this run's config, and say what
    this run does differently."""
    config, state, sampler = run.config, run.state, run.setup.sampler
    changes = check_config(checkpoint, path, config, "train.resume")
    run.load_state_dict(checkpoint, path)
    if changes:
        log.info("changed on resume (this run's values apply):\n  " + "\n  ".join(changes))
    if state.step > config.train.max_steps:  # the loop would end at once, having trained and saved nothing
        raise ConfigError(
            f"train.max_steps={config.train.max_steps}: {path} is at step {state.step} already; set "
            f"train.max_steps above {state.step} to train it further"
        )
    measured_on = checkpoint["config"]["data"]["val"]
    if measured_on != config.data.val:  # a score of other sets would block every best.pt of these
        log.info(
            f"best val accuracy {state.best_accuracy:.4f} was measured on data.val {measured_on}; this run "
            f"validates on {config.data.val}: the best score starts afresh, and the next validation writes "
            f"best.pt"
        )
        state.best_accuracy, state.best_readings = TrainState.best_accuracy, {}
    if checkpoint["data_sizes"] != sampler.sizes:
        log.info(
            f"warning: data.train now has {sampler.sizes} usable samples, not {checkpoint['data_sizes']}: "
            f"the batches from here on are not those the run would have seen (not an exact resume)"
        )
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    log.info(
        f"resumed from {path} at step {state.step} (epoch {state.step // sampler.batches_per_epoch}); "
        f"torchrun restart {restart}"
    )


def keep_best_of_folder(run: Run, log: RunLog) -> None:
    """A best.pt already in the folder, scored on these data.val sets, is replaced only by a better score:
    a run started afresh or resumed from an older checkpoint must not put worse weights under its name."""
    config, env, state = run.config, run.env, run.state
    kept = best_in_folder(config.train.out_dir, config.data.val, log.info) if env.is_main else None
    kept = broadcast_object(kept, group=env.cpu_group)
    if kept is not None and kept > state.best_accuracy:
        log.info(
            f"{Path(config.train.out_dir) / 'best.pt'} scores {kept:.4f} on data.val; a validation must beat it "
            f"to replace it"
        )
        state.best_accuracy = kept


def start_run_folder(run: Run, log: RunLog, resume_from: Checkpoint | None) -> None:
    """Only now, with the data read and the model built, does the run write to its folder: a start that
    fails leaves nothing there to bind the folder to a config."""
    config = run.config
    if not run.env.is_main:
        return
    out_dir = Path(config.train.out_dir)  # made by holding_run_folder's lock
    if config.train.overwrite:
        clear_run_folder(out_dir, log.info)
    write_config(out_dir, config)
    write_provenance(out_dir, run.provenance)
    resumed_step = resume_from[1]["step"] if resume_from else 0
    log.drop_records_after(resumed_step)
    if config.train.tensorboard:
        log.start_tensorboard(first_step=resumed_step + 1 if resume_from else 0)


def build_val_loaders(run: Run, log: RunLog) -> list[DataLoader]:
    config, env, setup = run.config, run.env, run.setup
    for dataset in setup.train_sets + setup.validated_sets:
        log.info(f"{dataset.report.summary()}\n  sample index: {dataset.report.source}")
    loaders = [
        build_eval_loader(
            dataset, setup.codec, config.train.eval_batch_size // env.world_size, setup.loader_workers, env
        )
        for dataset in setup.validated_sets
    ]
    # Their persistent workers are forked now, while no other thread runs: a fork at the first
    # validation, with DDP's threads busy, can deadlock the child on CPython < 3.12 (cpython#112275).
    for loader in loaders:
        iter(loader)
    return loaders


def wrap_for_training(model: nn.Module, env: DistEnv, compile: bool) -> nn.Module:
    """What the training step calls: `model` in DDP when distributed, then compiled if asked.
    Parameters are shared, so `model` itself stays the one to save and evaluate."""
    if env.distributed:
        # Bucket views: gradients live in DDP's all-reduce buffers, no copy in or out. (static_graph=True
        # measured no gain here: docs/performance.md.)
        model = DistributedDataParallel(
            model, device_ids=[env.device] if env.device.type == "cuda" else None, gradient_as_bucket_view=True
        )
    # Compiled around DDP, as PyTorch recommends: the compiler then splits graphs at bucket boundaries
    # so gradient all-reduces still overlap the backward pass.
    return torch.compile(model) if compile else model


def describe_run(run: Run, log: RunLog) -> None:
    config, env, setup = run.config, run.env, run.setup
    per_process = config.train.batch_size // env.world_size
    log.info(
        f"{config.model.arch}: {count_parameters(setup.model) / 1e6:.2f} M parameters, {setup.frames} frames "
        f"per image, {setup.codec.num_classes - 1} characters"
    )
    log.info(
        f"{env.world_size} process(es) on {env.device.type} x {torch.get_num_threads()} thread(s), "
        f"global batch {config.train.batch_size} = {env.world_size} x {per_process}, lr {config.optim.lr}, "
        f"{run.state.end} steps, precision {setup.precision}, {setup.sampler.batches_per_epoch} "
        f"steps per epoch"
    )
    time_limit = TimeLimit.start_up_line(run)
    if config.train.overfit_batches:  # training/overfit.py runs instead of the loop, without a time limit
        time_limit = (
            f"train.overfit_batches={config.train.overfit_batches}: the overfit check, on the first batches "
            f"unaugmented, for up to {config.train.max_steps} steps; no validation, checkpoint or time limit"
        )
    if time_limit:
        log.info(time_limit)
    for warning in config_warnings(config, env.device.type):
        log.info(f"warning: {warning}")


def restore_random_state(states: list[dict[str, Any]], env: DistEnv, log: RunLog) -> None:
    if len(states) == env.world_size:
        restore_rng_state(states[env.rank], env.device)
    else:
        log.info(
            f"warning: the checkpoint holds RNG states of {len(states)} processes, this run has "
            f"{env.world_size}: random streams restart (the data order is still exact)"
        )
