"""Train a CRNN text recognizer (CNN + BiLSTM + CTC) on LMDB datasets.

    python train.py --config crnn.yaml                                      # one process: GPU 0 or the CPU
    torchrun --standalone --nproc_per_node=4 train.py --config crnn_gpu.yaml   # 4 GPUs on one machine
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d \\
        --rdzv_endpoint=HOST:29500 train.py --config crnn_gpu.yaml           # 2 machines x 8 GPUs
    python train.py --config crnn.yaml train.max_steps=20 train.batch_size=8 # CPU smoke run

Options after the config file are dotted overrides: optim.lr=3e-4 data.train=[datasets/a,datasets/b].
`train.batch_size` is the global batch: each of the N processes takes batch_size / N.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from data.alphabet import load_alphabet
from data.codec import CTCCodec
from data.lmdb_dataset import Batch
from data.loaders import build_eval_loader, build_train_loader
from data.transforms import DeviceTransform, Preprocessing, build_device_transform
from evaluation.evaluate import decode_samples, evaluate
from evaluation.metrics import summarize
from evaluation.visualize import caption_grid
from models import count_parameters
from models.losses import ctc_losses
from training.checkpoint import check_config, load_checkpoint, load_initial_weights, save_checkpoint
from training.config import (
    Config,
    ConfigError,
    ConfigFileOption,
    config_warnings,
    load_config,
    short_of_warmup,
    to_dict,
    validate,
)
from training.log_window import LogWindow
from training.optim import build_optimizer, fit_schedule
from training.run import Run
from training.run_folder import (
    RunFolderLock,
    best_in_folder,
    check_run_folder,
    checkpoint_path,
    clear_run_folder,
    find_latest_checkpoint,
    lock_run_folder,
    point_last_at,
    prepare_run_folder,
    prune_checkpoints,
    unlock_run_folder,
    write_config,
)
from training.run_log import RunLog
from training.setup import Setup, loader_workers_of, model_and_frames, open_datasets, training_precision
from training.state import TrainState
from training.time_budget import TIMED_STEPS, UNTIMED_STEPS, Pace, Plan, StepClock, end_planned_again, steps_that_fit
from training.weight_average import WeightAverage
from utils import cli
from utils.distributed import (
    DistEnv,
    broadcast_buffers,
    broadcast_object,
    cleanup_distributed,
    read_env,
    setup_distributed,
)
from utils.precision import autocast
from utils.preemption import StopRequested, StopSignal
from utils.rng import restore_rng_state


class TrainingDiverged(RuntimeError):
    pass


def main() -> None:
    stop = StopSignal()  # first: a signal while starting up (the label scan can take minutes) ends it at once
    try:
        config = read_config()
        check_run_folder(config)
        if read_env()[0] == 0:
            prepare_run_folder(config.train.out_dir)
        env = setup_distributed(config.device_ids, config.train.threads)
        try:
            train(config, env, stop)
        finally:
            cleanup_distributed()
    finally:
        stop.restore()


def train(config: Config, env: DistEnv, stop: StopSignal) -> None:
    log = RunLog(config.train.out_dir if env.is_main else None)
    lock = take_run_folder(config, env, log)
    try:
        resume_from = find_resume_checkpoint(config, env, log)  # read before train.overwrite clears the folder
        log.info(f"config:\n{yaml.safe_dump(to_dict(config), sort_keys=False)}")
        setup = build_setup(config, env, log.info, resume_from[1].get("precision") if resume_from else None)
        state = TrainState(window=LogWindow(env.device), end=config.train.max_steps)
        run = Run(config=config, env=env, setup=setup, state=state)
        if resume_from:
            resume(run, log, *resume_from)
        elif config.train.init_from:
            log.info(load_initial_weights(setup.model, config.train.init_from, setup.codec.alphabet, config))
        if not config.train.overwrite:
            keep_best_of_folder(run, log)
        start_run_folder(config, env, log, resume_from)  # the first write: everything that can fail has run
        val_loaders = build_val_loaders(run, log)
        model = wrap_for_training(setup.model, env, config.train.compile)
        describe_run(run, log)
        if resume_from:  # last: model building and data loading above draw random numbers too
            restore_random_state(resume_from[1]["rng"], env, log)
        stop.defer(env.cpu_group)
        try:
            train_loop(run, model, val_loaders, log, stop)
        finally:
            log.close()  # flushes TensorBoard, also when stopped by a signal
    finally:
        if lock is not None:
            unlock_run_folder(lock)
    best = f"{run.state.best_accuracy:.4f}" if run.state.best_accuracy >= 0 else "none yet"
    log.info(
        f"done: step {run.state.step}, best val accuracy {best} on data.val {config.data.val}; checkpoints in "
        f"{config.train.out_dir}"
    )


def take_run_folder(config: Config, env: DistEnv, log: RunLog) -> RunFolderLock | None:
    """Rank 0 locks the run folder (training.run_folder.lock_run_folder); every rank stops alike when another
    run holds it. Returns the lock to hold while the run lives (None on other ranks)."""
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
    return lock


def train_loop(run: Run, model: nn.Module, val_loaders: list[DataLoader], log: RunLog, stop: StopSignal) -> None:
    """Steps until train.max_steps, or the step train.max_minutes plans: log, validate and save on their
    schedules; stop at a signal."""
    train, setup, state = run.config.train, run.setup, run.state
    model.train()
    log.start_progress(total=state.end, initial=state.step)
    setup.sampler.set_steps(state.step, state.end)  # the batches depend on the step alone
    clock = StepClock(state.step) if plans_its_end(run) else None
    for batch in state.window.timed(setup.loader):
        loss, infinite, taken = train_step(
            model,
            batch,
            inputs=setup.device_transform,
            optimizer=setup.optimizer,
            scaler=setup.scaler,
            grad_clip=run.config.optim.grad_clip,
            device=run.env.device,
            precision=setup.precision,
            memory_format=setup.memory_format,
            average=setup.average,
        )
        setup.scheduler.step()
        state.step += 1
        state.window.add(loss if taken else None, infinite, batch.num_dropped, len(batch.labels))
        check_skipped(run, taken, log)
        if clock is not None:
            clock.tick(state.step)
            if state.step == clock.plan_at:
                plan_the_end(run, clock, log)
            elif state.plan is not None and clock.plans_again(state.step, state.end):
                plan_the_end_again(run, clock, log)
        last = state.step == state.end
        if state.step % train.log_every == 0 or last:
            log_training(run, log)
        else:
            log.advance()
        if state.step % train.eval_every == 0 or last:
            validation_started = time.perf_counter()
            validate_and_keep_best(run, val_loaders, log)
            state.window.restart_clock()
            if clock is not None:
                clock.validated(time.perf_counter() - validation_started)
        signum = stop.agreed()  # every rank, every step: a signal to one rank stops them all here
        if signum or state.step % train.save_every == 0 or last:
            saved = save_training_checkpoint(run)
            state.window.restart_clock()
            if signum:
                raise StopRequested(signum, state.step, str(saved))
        if last:  # the sampler may hold more batches: train.max_minutes planned fewer steps
            break


def plans_its_end(run: Run) -> bool:
    """Whether this run times its steps to plan its end: train.max_minutes set, no plan kept from a
    checkpoint, and more steps to go than the timing takes."""
    state = run.state
    return (
        run.config.train.max_minutes is not None
        and state.plan is None
        and state.end - state.step > UNTIMED_STEPS + TIMED_STEPS
    )


def plan_the_end(run: Run, clock: StepClock, log: RunLog) -> None:
    """train.max_minutes: the step this run ends at, from the pace of the steps `clock` timed, with the
    schedule refitted to it (training/time_budget.py). Rank 0's plan is every rank's."""
    config, setup, state = run.config, run.setup, run.state
    validation_images = sum(len(dataset) for dataset in setup.val_sets)
    pace = Pace.measured(clock.seconds_per_step(), config.train.batch_size, validation_images, config.train.eval_every)
    clock.expect_validation(pace.seconds_per_validation)
    end = steps_that_fit(pace, clock.seconds_left(config.train.max_minutes), state.step, config.train.max_steps)
    end = broadcast_object(end, group=run.env.cpu_group)
    end_the_run_at(run, end, log)
    steps = config.train.max_steps - state.step
    verdict = (
        f"they fit: the run ends at step {end}"
        if end == config.train.max_steps
        else f"the run ends at step {end} instead, its learning-rate schedule fitted to end there"
    )
    log.info(
        f"train.max_minutes={config.train.max_minutes:g}: {pace.seconds_per_step:.3f} s a step here, so the "
        f"{steps} steps to train.max_steps={config.train.max_steps} would take ~{pace.seconds_for(steps) / 60:.1f} "
        f"more minutes; {verdict}"
    )


def plan_the_end_again(run: Run, clock: StepClock, log: RunLog) -> None:
    """train.max_minutes, every REPLAN_EVERY steps: the plan made again from every step timed so far and
    the last validation's own time, where the machine's pace has drifted from the first steps'."""
    config, state = run.config, run.state
    minutes, pace = config.train.max_minutes, clock.pace_so_far(config.train.eval_every)
    end = end_planned_again(pace, clock.seconds_left(minutes), state.step, state.end, config.train.max_steps, minutes)
    end = broadcast_object(end, group=run.env.cpu_group)
    if end != state.end:
        log.info(
            f"train.max_minutes={config.train.max_minutes:g}: {pace.seconds_per_step:.3f} s a step since step "
            f"{clock.timed_from} and {pace.seconds_per_validation:.1f} s a validation; the run ends at step {end} "
            f"instead of {state.end}, its learning-rate schedule fitted to end there"
        )
        end_the_run_at(run, end, log)


def end_the_run_at(run: Run, end: int, log: RunLog) -> None:
    """The plan's end: kept in the checkpoints, the schedule refitted to it, the progress bar's total."""
    config, state = run.config, run.state
    state.plan, state.end = Plan(config.train.max_minutes, config.train.max_steps, end), end
    fit_schedule(run.setup.scheduler, config.optim, end)
    log.set_total(end)
    warning = short_of_warmup(
        config.optim, end, f"the {end} steps that fit train.max_minutes={config.train.max_minutes:g}"
    )
    if warning:
        log.info(f"warning: {warning}; raise train.max_minutes or lower optim.warmup_steps")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action=ConfigFileOption, help="YAML file, or a bare name looked up in configs/")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. optim.lr=3e-4")
    # Intermixed: overrides may stand on both sides of --config. An unknown option (`--optim.lr=3e-4`) is
    # named with how to write it, where argparse's "unrecognized arguments" would not say.
    args, unknown = parser.parse_known_intermixed_args()
    if unknown:
        option = unknown[0]
        raise ConfigError(
            f"unknown option {option}; overrides are written without dashes, as key=value: "
            f"{option.lstrip('-')}" + ("" if "=" in option else "=VALUE")
        )
    return args


def read_config() -> Config:
    args = parse_args()
    return load_run_config(args.config, args.overrides)


def load_run_config(config_file: str | None, overrides: list[str]) -> Config:
    """The config validated, and its global batches checked against the number of processes torchrun
    started: the checks of every command that runs the training step (tools/benchmark.py too)."""
    config = load_config(config_file, overrides)
    validate(config)
    world_size = read_env()[2]
    # Checked before any process group exists, so every rank stops with this message instead of hanging.
    if config.train.batch_size % world_size or config.train.eval_batch_size % world_size:
        raise ConfigError(
            f"train.batch_size={config.train.batch_size} and train.eval_batch_size="
            f"{config.train.eval_batch_size} must divide by the {world_size} processes"
        )
    return config


def train_step(
    model: nn.Module,
    batch: Batch,
    *,
    inputs: DeviceTransform,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    grad_clip: float,
    device: torch.device,
    precision: str,
    memory_format: torch.memory_format,
    average: WeightAverage | None = None,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """One optimizer step on a training batch (its uint8 pixels made the model's input on the device by
    `inputs`), and the weight average's when there is one. Returns the loss and the count of infinite
    losses (left on the device), and whether the step was taken: one with a NaN or infinite gradient
    norm is skipped, and leaves the whole model as it was, buffers included."""
    on_device = [tensor.to(device, non_blocking=True) for tensor in (batch.images, batch.widths, batch.seeds)]
    images = inputs(*on_device).contiguous(memory_format=memory_format)
    # The forward pass updates BatchNorm's running statistics before anyone knows whether the step is
    # good: one NaN image would make them NaN for every later evaluation and checkpoint. A copy of
    # the buffers (a few thousand numbers) is what a skipped step restores.
    buffers = list(model.buffers())
    saved_buffers = [buffer.clone() for buffer in buffers]
    with autocast(device, precision):
        logits = model(images)  # [B, T, C]
    losses, infinite = ctc_losses(logits, batch.targets, batch.target_lengths)
    loss = losses.sum() / max(len(losses), 1)  # not mean(): a batch emptied by undecodable images gives 0
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # clip and check the true gradients, not the fp16-scaled ones
    if grad_clip > 0:
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    else:
        grad_norm = nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    # A NaN or infinite loss on any rank makes its gradients NaN, and DDP's all-reduce hands them to
    # every rank: the norm is then the same everywhere and every rank skips the same steps with no
    # extra collective. Reading it is the loop's one host sync per step (GradScaler's fp16 check is another).
    taken = bool(torch.isfinite(grad_norm))
    if taken:
        scaler.step(optimizer)
        if average is not None:
            average.update(model)
    else:
        torch._foreach_copy_(buffers, saved_buffers)
    scaler.update()  # fp16: lowers the loss scale after an overflow; otherwise nothing
    return loss, infinite, taken


def build_setup(
    config: Config, env: DistEnv, log: Callable[[str], None] = print, recorded_precision: str | None = None
) -> Setup:
    """Everything the run trains with. `recorded_precision`: the one a resumed run measured at its start,
    kept under `auto` so that the run goes on as it began."""
    torch.manual_seed(config.train.seed)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)
    data = config.data
    codec = CTCCodec(load_alphabet(data.alphabet), fold_case=data.fold_case)
    model, frames = model_and_frames(config, codec, env)
    preprocessing = Preprocessing.from_config(config)  # the datasets' and every checkpoint's: one record
    train_sets, val_sets = open_datasets(config, preprocessing, codec, frames)
    workers = loader_workers_of(config, env, log)  # data.num_workers `auto`: resolved for this machine
    loader, sampler = build_train_loader(
        train_sets, codec, config.train.batch_size, data.train_ratios or None, config.train.seed, workers, env
    )
    memory_format = torch.channels_last if config.train.channels_last else torch.contiguous_format
    model.to(env.device, memory_format=memory_format)
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


def find_resume_checkpoint(config: Config, env: DistEnv, log: RunLog) -> tuple[str, dict[str, Any]] | None:
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


def start_run_folder(config: Config, env: DistEnv, log: RunLog, resume_from: tuple[str, dict[str, Any]] | None) -> None:
    """Only now, with the data read and the model built, does the run write to its folder: a start that
    fails leaves nothing there to bind the folder to a config."""
    if not env.is_main:
        return
    out_dir = Path(config.train.out_dir)  # made by take_run_folder's lock
    if config.train.overwrite:
        clear_run_folder(out_dir)
    write_config(out_dir, config)
    resumed_step = resume_from[1]["step"] if resume_from else 0
    log.drop_records_after(resumed_step)
    if config.train.tensorboard:
        log.start_tensorboard(first_step=resumed_step + 1 if resume_from else 0)


def build_val_loaders(run: Run, log: RunLog) -> list[DataLoader]:
    config, env, setup = run.config, run.env, run.setup
    for dataset in setup.train_sets + setup.val_sets:
        log.info(f"{dataset.report.summary()}\n  sample index: {dataset.report.source}")
    loaders = [
        build_eval_loader(
            dataset, setup.codec, config.train.eval_batch_size // env.world_size, setup.loader_workers, env
        )
        for dataset in setup.val_sets
    ]
    # Their persistent workers are forked now, while no other thread runs: a fork at the first
    # validation, with DDP's threads busy, can deadlock the child on CPython < 3.12 (cpython#112275).
    for loader in loaders:
        iter(loader)
    return loaders


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
        state.best_accuracy = TrainState.best_accuracy
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


def restore_random_state(states: list[dict[str, Any]], env: DistEnv, log: RunLog) -> None:
    if len(states) == env.world_size:
        restore_rng_state(states[env.rank], env.device)
    else:
        log.info(
            f"warning: the checkpoint holds RNG states of {len(states)} processes, this run has "
            f"{env.world_size}: random streams restart (the data order is still exact)"
        )


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
    if run.state.plan is not None:
        log.info(f"train.max_minutes={config.train.max_minutes:g}: the run ends at step {run.state.end}, as planned")
    elif plans_its_end(run):
        log.info(
            f"train.max_minutes={config.train.max_minutes:g}: the steps that fit are planned from the pace of "
            f"{TIMED_STEPS} steps, after the first {UNTIMED_STEPS}"
        )
    for warning in config_warnings(config, env.device.type):
        log.info(f"warning: {warning}")


def check_skipped(run: Run, taken: bool, log: RunLog) -> None:
    """Count a step skipped for a non-finite gradient; stop when too many come in a row."""
    config, state = run.config, run.state
    state.skipped_in_a_row = 0 if taken else state.skipped_in_a_row + 1
    if taken:
        return
    log.info(f"step {state.step}: non-finite loss or gradient; step skipped ({state.skipped_in_a_row} in a row)")
    if state.skipped_in_a_row >= config.train.max_nonfinite_steps:
        raise TrainingDiverged(
            f"{state.skipped_in_a_row} steps in a row up to step {state.step} had a NaN or infinite loss or gradient "
            f"(the limit is train.max_nonfinite_steps); stopping rather than training on garbage. Lower "
            f"optim.lr, keep optim.grad_clip on, or use fp32/bf16 instead of fp16; earlier checkpoints "
            f"are in {config.train.out_dir}"
        )


def log_training(run: Run, log: RunLog) -> None:
    """The log line of the steps since the last one (a collective: every rank sums its numbers in)."""
    config, env, setup, state = run.config, run.env, run.setup, run.state
    log_every, step = config.train.log_every, state.step
    window_steps = range((step - 1) // log_every * log_every, step)
    drawn = setup.sampler.drawn_per_dataset(window_steps)  # from the step alone: exact after a resume too
    record = {
        "step": step,
        "epoch": step // setup.sampler.batches_per_epoch,
        "lr": setup.optimizer.param_groups[0]["lr"],  # the next step's, refitted schedules included
        **state.window.record(env.world_size),
        "drawn": dict(zip(config.data.train, drawn)),
    }
    log.metrics(record)
    figures = {"loss": f"{record['loss']:.3f}", "img/s": f"{record['images_per_s']:.0f}"}
    log.advance({**figures, "data wait": f"{record['data_wait_share']:.0%}"})


def validate_and_keep_best(run: Run, val_loaders: list[DataLoader], log: RunLog) -> None:
    """Evaluate on every data.val set, log the results, and write best.pt when the accuracy improved."""
    config, env, setup, state = run.config, run.env, run.setup, run.state
    model = setup.evaluated_model
    broadcast_buffers(model)  # evaluate, on every rank, the model rank 0 saves
    results = {}
    for dataset, loader in zip(setup.val_sets, val_loaders):
        counts = evaluate(model, loader, setup.codec, env, setup.precision, config.train.channels_last)
        results[dataset.root] = {**summarize(counts), "undecodable_images": counts["dropped"]}
    total = sum(r["scored"] for r in results.values())
    accuracy = sum(r["accuracy"] * r["scored"] for r in results.values()) / max(total, 1)
    for root, result in results.items():
        log.info(
            f"step {state.step} val {root}: "
            + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items())
        )
        log.metrics({"step": state.step, "val": root, **result})
    if log.takes_images and setup.val_sets:
        log.image(
            "val/samples", state.step, caption_grid(decode_samples(model, setup.val_sets[0], setup.codec, env.device))
        )
    if accuracy > state.best_accuracy and env.is_main:
        save_checkpoint(Path(config.train.out_dir) / "best.pt", run.weights(accuracy))
    state.best_accuracy = max(state.best_accuracy, accuracy)


def save_training_checkpoint(run: Run) -> Path:
    """Everything an exact resume needs (a collective: every rank adds its RNG state and log sums)."""
    checkpoint = run.state_dict()
    path = checkpoint_path(run.config.train.out_dir, run.state.step)
    if run.env.is_main:
        save_checkpoint(path, checkpoint)
        point_last_at(path)
        prune_checkpoints(run.config.train.out_dir, run.config.train.keep_checkpoints)
    return path


if __name__ == "__main__":
    cli.run(main, expected=(TrainingDiverged,))
