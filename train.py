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
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from data.lmdb_dataset import Batch
from data.transforms import DeviceTransform
from evaluation.evaluate import decode_samples, evaluate
from evaluation.metrics import summarize
from evaluation.visualize import caption_grid
from models.losses import ctc_losses
from training.calibration import calibrate_best
from training.checkpoint import check_savable, save_checkpoint
from training.config import Config, ConfigError, ConfigFileOption, load_config, validate
from training.forgetting import backbone_frozen, start_against_best
from training.overfit import overfit_check
from training.run import Run
from training.run_folder import check_run_folder, checkpoint_path, point_last_at, prepare_run_folder, prune_checkpoints
from training.run_log import RunLog
from training.setup import holding_run_folder, start_run
from training.time_limit import TimeLimit
from training.weight_average import WeightAverage
from utils import cli
from utils.distributed import (
    DistEnv,
    answered,
    broadcast_buffers,
    cleanup_distributed,
    read_env,
    setup_distributed,
)
from utils.precision import autocast
from utils.preemption import StopRequested, StopSignal


class TrainingDiverged(RuntimeError):
    pass


def main() -> int:
    stop = StopSignal()  # first: a signal while starting up (the label scan can take minutes) ends it at once
    try:
        config = read_config()
        check_run_folder(config)
        if read_env()[0] == 0:
            prepare_run_folder(config.train.out_dir)
        env = setup_distributed(config.device_ids, config.train.threads)
        try:
            return train(config, env, stop)
        finally:
            cleanup_distributed()
    finally:
        stop.restore()


def read_config() -> Config:
    args = parse_args()
    return load_run_config(args.config, args.overrides)


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


def train(config: Config, env: DistEnv, stop: StopSignal) -> int:
    """The run; its exit code (train.overfit_batches: the check's, 1 when it failed)."""
    log = RunLog(config.train.out_dir if env.is_main else None)
    with holding_run_folder(config, env, log):
        run, model, val_loaders = start_run(config, env, log)
        stop.defer(env.cpu_group)
        try:
            if config.train.overfit_batches:  # the sanity check instead of the run
                return overfit_check(run, model, log, stop, train_on)
            train_loop(run, model, val_loaders, log, stop)
            if config.train.calibrate:
                calibrate_best(run, val_loaders, log)
        finally:
            log.close()  # flushes TensorBoard, also when stopped by a signal
    report = start_against_best(run.state, config.data, config.train.init_from)
    if report:
        log.info(report)
        log.metrics({"step": run.state.step, "start": run.state.start_readings, "best": run.state.best_readings})
    best = f"{run.state.best_accuracy:.4f}" if run.state.best_accuracy >= 0 else "none yet"
    log.info(
        f"done: step {run.state.step}, best val accuracy {best} on data.val {config.data.val}; checkpoints in "
        f"{config.train.out_dir}"
    )
    return 0


def train_loop(run: Run, model: nn.Module, val_loaders: list[DataLoader], log: RunLog, stop: StopSignal) -> None:
    """Steps until train.max_steps, or the step train.max_minutes plans: log, validate and save on their
    schedules; stop at a signal."""
    train, setup, state = run.config.train, run.setup, run.state
    time_limit = TimeLimit(run, log)  # train.max_minutes: counted from here
    validate = time_limit.timing(validate_and_keep_best)
    model.train()
    log.start_progress(total=state.end, initial=state.step)
    setup.sampler.set_steps(state.step, state.end)  # the batches depend on the step alone
    if train.init_from and state.step == 0:  # a fine-tune whose steps only do harm must not end worse
        start, _ = validate(run, val_loaders, log)
        log.info(
            f"the start (train.init_from {train.init_from}) reads data.val at {start:.4f} before the first step: "
            f"best.pt is the start until a step reads data.val better"
        )
        state.window.restart_clock()
    with answered("a training step's gradient all-reduce"):  # the loop's own collectives name themselves
        for batch in state.window.timed(setup.loader):
            train_on(batch, run, model, log)
            time_limit.after_step()  # may move state.end
            last = state.step == state.end
            if state.step % train.log_every == 0 or last:
                log_training(run, log)
            else:
                log.advance()
            if state.step % train.eval_every == 0 or last:
                validate(run, val_loaders, log)
                state.window.restart_clock()
            signum = stop.agreed()  # every rank, every step: a signal to one rank stops them all here
            if signum or state.step % train.save_every == 0 or last:
                saved = save_training_checkpoint(run)
                state.window.restart_clock()
                if signum:
                    raise StopRequested(signum, state.step, str(saved))
            if last:  # the sampler may hold more batches: train.max_minutes planned fewer steps
                break


def train_on(batch: Batch, run: Run, model: nn.Module, log: RunLog) -> None:
    """train_step with the run's optimizer, precision and transforms, and what each step counts: the
    schedule, the step, the next log line's numbers, the steps skipped in a row."""
    setup, state = run.setup, run.state
    frozen = backbone_frozen(setup.model, run.config.train.freeze_backbone_steps, state.step)
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
        frozen=frozen,
    )
    setup.scheduler.step()
    state.step += 1
    state.window.add(loss if taken else None, infinite, batch.num_dropped, len(batch.labels))
    check_skipped(run, taken, log)


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
    frozen: list[nn.Parameter] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """One optimizer step on a training batch (its uint8 pixels made the model's input on the device by
    `inputs`), and the weight average's when there is one; the `frozen` parameters are left as they are.
    Returns the loss and the count of infinite losses (left on the device), and whether the step was taken:
    one with a NaN or infinite gradient norm is skipped, and leaves the whole model as it was, buffers
    included."""
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
    taken = compute_gradients(model, loss, optimizer, scaler, grad_clip, frozen or [])
    if taken:
        scaler.step(optimizer)
        if average is not None:
            average.update(model)
    else:
        torch._foreach_copy_(buffers, saved_buffers)
    scaler.update()  # fp16: lowers the loss scale after an overflow; otherwise nothing
    return loss, infinite, taken


def compute_gradients(
    model: nn.Module,
    loss: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    grad_clip: float,
    frozen: list[nn.Parameter],
) -> bool:
    """The gradients of `loss`, clipped to norm `grad_clip` (0: not clipped), none for the `frozen`
    parameters. Returns whether their norm is finite: whether the step may be taken."""
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    for parameter in frozen:  # DDP has all-reduced them already; without a gradient, the optimizer skips them
        parameter.grad = None
    scaler.unscale_(optimizer)  # clip and check the true gradients, not the fp16-scaled ones
    if grad_clip > 0:
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    else:
        grad_norm = nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    # A NaN or infinite loss on any rank makes its gradients NaN, and DDP's all-reduce hands them to
    # every rank: the norm is then the same everywhere and every rank skips the same steps with no
    # extra collective. Reading it is the loop's one host sync per step (GradScaler's fp16 check is another).
    return bool(torch.isfinite(grad_norm))


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


def validate_and_keep_best(run: Run, val_loaders: list[DataLoader], log: RunLog) -> tuple[float, dict[str, float]]:
    """Evaluate on every data.val and data.retain set, log the results, and write best.pt when the accuracy
    over data.val improved; return that accuracy, and each set's."""
    config, env, setup, state = run.config, run.env, run.setup, run.state
    model = setup.evaluated_model
    broadcast_buffers(model)  # evaluate, on every rank, the model rank 0 saves
    results = {}
    for dataset, loader in zip(setup.validated_sets, val_loaders):
        counts = evaluate(model, loader, setup.codec, env, setup.precision, config.train.channels_last)
        results[dataset.root] = {**summarize(counts), "undecodable_images": counts["dropped"]}
    validated = [results[dataset.root] for dataset in setup.val_sets]
    total = sum(r["scored"] for r in validated)
    accuracy = sum(r["accuracy"] * r["scored"] for r in validated) / max(total, 1)
    retained = {dataset.root for dataset in setup.retain_sets}
    for root, result in results.items():
        kind = "retain" if root in retained else "val"
        log.info(
            f"step {state.step} {kind} {root}: "
            + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items())
        )
        log.metrics({"step": state.step, kind: root, **result})
    if log.takes_images and setup.val_sets:
        log.image(
            "val/samples", state.step, caption_grid(decode_samples(model, setup.val_sets[0], setup.codec, env.device))
        )
    readings = {root: result["accuracy"] for root, result in results.items()}
    if config.train.init_from and state.step == 0:  # the start, which every later checkpoint records
        state.start_readings = readings
    if accuracy > state.best_accuracy:
        state.best_readings = readings
        if env.is_main:
            save_checkpoint(Path(config.train.out_dir) / "best.pt", {**run.weights(accuracy), "readings": readings})
    state.best_accuracy = max(state.best_accuracy, accuracy)
    return accuracy, readings


def save_training_checkpoint(run: Run) -> Path:
    """Everything an exact resume needs (a collective: every rank adds its RNG state and log sums)."""
    checkpoint = run.state_dict()
    path = checkpoint_path(run.config.train.out_dir, run.state.step)
    if run.env.is_main:
        save_checkpoint(path, checkpoint)
        point_last_at(path)
        prune_checkpoints(run.config.train.out_dir, run.config.train.keep_checkpoints)
    else:  # the weights are the same on every rank: each stops with rank 0's error, none waits for it
        check_savable(checkpoint, path)
    return path


if __name__ == "__main__":
    cli.run(main, expected=(TrainingDiverged,))
