"""Train a CRNN text recognizer (CNN + BiLSTM + CTC) on LMDB datasets.

    python train.py --config crnn.yaml                                      # one process: GPU 0 or the CPU
    torchrun --standalone --nproc_per_node=4 train.py --config crnn.yaml    # 4 GPUs on one machine
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d \\
        --rdzv_endpoint=HOST:29500 train.py --config crnn.yaml               # 2 machines x 8 GPUs
    python train.py --config crnn.yaml train.max_steps=20 train.batch_size=8 # CPU smoke run

Options after the config file are dotted overrides: optim.lr=3e-4 data.train=[datasets/a,datasets/b].
`train.batch_size` is the global batch: each of the N processes takes batch_size / N.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from data.codec import CTCCodec
from data.alphabet import load_alphabet
from data.augment import Augmentation
from data.lmdb_dataset import Batch, CollateBatch, LmdbDataset, SeededSamples
from data.sampler import GlobalBatchSampler
from data.transforms import ImageTransform, Preprocessing
from models import build_model, count_parameters, output_frames
from utils import cli
from utils.checkpoint import load_checkpoint, load_initial_weights, save_checkpoint
from utils.config import Config, ConfigError, load_config, to_dict, validate
from utils.distributed import (DistEnv, broadcast_buffers, broadcast_object, cleanup_distributed, gather_objects,
                               read_env, setup_distributed)
from utils.evaluate import build_eval_loader, decode_samples, evaluate
from utils.losses import ctc_losses
from utils.metrics import summarize
from utils.precision import autocast, resolve_precision
from utils.preemption import StopRequested, StopSignal, ignore_stop_signals
from utils.rng import capture_rng_state, restore_rng_state
from utils.run_folder import (check_run_folder, checkpoint_path, clear_run_folder, find_latest_checkpoint,
                              point_last_at, prepare_run_folder, prune_checkpoints, write_config)
from utils.run_log import LogWindow, RunLog
from utils.sync_batchnorm import convert_sync_batchnorm
from utils.visualize import caption_grid


class TrainingDiverged(RuntimeError):
    pass


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML file, or a bare name looked up in configs/")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. optim.lr=3e-4")
    return parser.parse_args()


def build_train_loader(config: Config, codec: CTCCodec, datasets: list[LmdbDataset], env: DistEnv
                       ) -> tuple[DataLoader, GlobalBatchSampler]:
    dataset = SeededSamples(datasets)
    sampler = GlobalBatchSampler([len(d) for d in datasets], config.train.batch_size, env.rank, env.world_size,
                                 config.train.seed, config.data.train_ratios or None)
    if sampler.batches_per_epoch == 0:
        raise ValueError(f"data.train has {len(dataset)} usable samples: fewer than one global batch of "
                         f"{config.train.batch_size}; add data or lower train.batch_size")
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=config.data.num_workers,
                        collate_fn=CollateBatch(codec, datasets[0].transform.output_shape),
                        pin_memory=env.device.type == "cuda", persistent_workers=config.data.num_workers > 0,
                        worker_init_fn=ignore_stop_signals,
                        # Its own generator: worker seeds then neither draw from nor depend on the global RNG
                        # (augmentation draws from each sample's own seed, not from the workers').
                        generator=torch.Generator().manual_seed(config.train.seed + env.rank))
    return loader, sampler


def build_optimizer(config: Config, model: nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    optim = config.optim
    if optim.name == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay)
    else:  # Adadelta with rho 0.95, the deep-text-recognition-benchmark recipe (use lr=1.0)
        optimizer = torch.optim.Adadelta(model.parameters(), lr=optim.lr, rho=0.95, eps=1e-8, weight_decay=optim.weight_decay)

    def lr_factor(step: int) -> float:
        # Linear warm-up: large early steps push a CTC model into predicting blanks everywhere.
        if step < optim.warmup_steps:
            return (step + 1) / optim.warmup_steps
        if optim.schedule == "constant":
            return 1.0
        progress = (step - optim.warmup_steps) / max(1, config.train.max_steps - optim.warmup_steps)
        return optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)


def train_step(model: nn.Module, batch: Batch, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
               grad_clip: float, device: torch.device, precision: str, memory_format: torch.memory_format
               ) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """One optimizer step. Returns the loss and the count of infinite losses (left on the device), and
    whether the step was taken: one with a NaN or infinite gradient norm is skipped, and leaves the
    whole model as it was, buffers included."""
    images = batch.images.to(device, non_blocking=True, memory_format=memory_format)
    # The forward pass updates BatchNorm's running statistics before anyone knows whether the step is
    # good: one NaN image would make them NaN for every later evaluation and checkpoint. A copy of
    # the buffers (a few thousand numbers) is what a skipped step restores.
    buffers = list(model.buffers())
    saved_buffers = [buffer.clone() for buffer in buffers]
    with autocast(device, precision):
        logits = model(images)  # [B, T, C]
    losses, infinite = ctc_losses(logits, batch, device)
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
    else:
        torch._foreach_copy_(buffers, saved_buffers)
    scaler.update()  # fp16: lowers the loss scale after an overflow; otherwise nothing
    return loss, infinite, taken


@dataclass
class Setup:
    """What a run trains with, built from its config: shared by train() and scripts/benchmark.py."""

    codec: CTCCodec
    preprocessing: Preprocessing  # what turns an image into the model's input; stored in every checkpoint
    model: nn.Module  # on the device, not wrapped
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


def build_setup(config: Config, env: DistEnv) -> Setup:
    torch.manual_seed(config.train.seed)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)
    codec = CTCCodec(load_alphabet(config.data.alphabet), fold_case=config.data.fold_case)
    model = build_model(config.model.arch, codec.num_classes, config.model.in_channels, config.model.hidden_size,
                        channels=tuple(config.model.channels))
    try:
        frames = output_frames(model, config.model.in_channels, config.data.img_height, config.data.img_width)
    except ValueError as error:
        raise ConfigError(f"data.img_height={config.data.img_height}, data.img_width={config.data.img_width}: "
                          f"{error}") from None
    if config.model.sync_bn and env.distributed:
        model = convert_sync_batchnorm(model, env.device)
    data = config.data
    preprocessing = Preprocessing.from_config(config)
    augmentation = Augmentation.from_config(data.augment, asdict(config.augment))
    train_sets = [LmdbDataset(root, codec, frames, ImageTransform(preprocessing, augmentation=augmentation))
                  for root in data.train]
    val_transform = ImageTransform(preprocessing, data.eval_width_step)
    val_sets = [LmdbDataset(root, codec, frames, val_transform) for root in data.val]
    loader, sampler = build_train_loader(config, codec, train_sets, env)
    precision = resolve_precision(config.train.precision, env.device)
    memory_format = torch.channels_last if config.train.channels_last else torch.contiguous_format
    model.to(env.device, memory_format=memory_format)
    optimizer, scheduler = build_optimizer(config, model)
    # fp16 needs loss scaling to keep small gradients from flushing to zero; bf16 and fp32 do not.
    scaler = torch.amp.GradScaler(env.device.type, enabled=precision == "fp16")
    return Setup(codec, preprocessing, model, frames, train_sets, val_sets, loader, sampler, precision, memory_format, optimizer,
                 scheduler, scaler)


def wrap_for_training(model: nn.Module, env: DistEnv, compile: bool) -> nn.Module:
    """What the training step calls: `model` in DDP when distributed, then compiled if asked.
    Parameters are shared, so `model` itself stays the one to save and evaluate."""
    if env.distributed:
        # Bucket views: gradients live in DDP's all-reduce buffers, no copy in or out. (static_graph=True
        # measured no gain here: README, Performance.)
        model = DistributedDataParallel(model, device_ids=[env.device] if env.device.type == "cuda" else None,
                                        gradient_as_bucket_view=True)
    # Compiled around DDP, as PyTorch recommends: the compiler then splits graphs at bucket boundaries
    # so gradient all-reduces still overlap the backward pass.
    return torch.compile(model) if compile else model


def main() -> None:
    stop = StopSignal()  # first: a signal while starting up (the label scan can take minutes) ends it at once
    try:
        args = parse_args()
        config = load_config(args.config, args.overrides)
        validate(config)
        rank, _, world_size, _ = read_env()
        # Checked before any process group exists, so every rank stops with this message instead of hanging.
        if config.train.batch_size % world_size or config.train.eval_batch_size % world_size:
            raise ConfigError(f"train.batch_size={config.train.batch_size} and train.eval_batch_size="
                              f"{config.train.eval_batch_size} must divide by the {world_size} processes")
        check_run_folder(config)
        if rank == 0:
            prepare_run_folder(config.train.out_dir)
        env = setup_distributed(config.device_ids, config.train.threads)
        try:
            train(config, env, stop)
        finally:
            cleanup_distributed()
    except StopRequested as stopped:
        print(stopped, file=sys.stderr)
        sys.exit(stopped.exit_code)
    finally:
        stop.restore()


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


def train(config: Config, env: DistEnv, stop: StopSignal) -> None:
    out_dir = Path(config.train.out_dir)
    log = RunLog(out_dir if env.is_main else None)
    resume_from = find_resume_checkpoint(config, env, log)  # read before train.overwrite clears the folder
    log.info(f"config:\n{yaml.safe_dump(to_dict(config), sort_keys=False)}")
    setup = build_setup(config, env)
    # Only now, with the data read and the model built, does the run write to its folder: a start that
    # fails leaves nothing there to bind the folder to a config.
    if env.is_main:
        if config.train.overwrite:
            clear_run_folder(out_dir)
        write_config(out_dir, config)
        log.drop_records_after(resume_from[1]["step"] if resume_from else 0)
        if config.train.tensorboard:
            log.start_tensorboard(first_step=resume_from[1]["step"] + 1 if resume_from else 0)
    codec, model, sampler, optimizer, scheduler, scaler = (setup.codec, setup.model, setup.sampler, setup.optimizer,
                                                           setup.scheduler, setup.scaler)
    val_sets, precision, memory_format = setup.val_sets, setup.precision, setup.memory_format
    for dataset in setup.train_sets + val_sets:
        log.info(dataset.report.summary())
    val_loaders = [build_eval_loader(dataset, codec, config.train.eval_batch_size // env.world_size,
                                     config.data.num_workers, env) for dataset in val_sets]
    # Their persistent workers are forked now, while no other thread runs: a fork at the first
    # validation, with DDP's threads busy, can deadlock the child on CPython < 3.12 (cpython#112275).
    for loader in val_loaders:
        iter(loader)

    # --- where to start ---------------------------------------------------------------------------
    window = LogWindow(env.device)
    step, best_accuracy = 0, -1.0
    if resume_from:
        path, checkpoint = resume_from
        if "optimizer" not in checkpoint:
            raise ValueError(f"train.resume: {path} holds weights only (best.pt?); resume from a ckpt-*.pt or "
                             f"last.pt, or start from these weights with train.init_from")
        if checkpoint.get("alphabet") != codec.alphabet:
            raise ValueError(f"train.resume: {path} was trained with another alphabet ({len(checkpoint.get('alphabet') or '')}"
                             f" characters; data.alphabet has {len(codec.alphabet)}, or another order). To train on "
                             f"these characters, start a new run from its weights: train.init_from={path}")
        model.load_state_dict(checkpoint["model"], strict=True)
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        scaler.load_state_dict(checkpoint["scaler"])
        step, best_accuracy = checkpoint["step"], checkpoint["best_accuracy"]
        if checkpoint["data_sizes"] != sampler.sizes:
            log.info(f"warning: data.train now has {sampler.sizes} usable samples, not {checkpoint['data_sizes']}: "
                     f"the batches from here on are not those the run would have seen (not an exact resume)")
        window.load_state_dict(checkpoint["log_window"], env.is_main)
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        log.info(f"resumed from {path} at step {step} (epoch {step // sampler.batches_per_epoch}); "
                 f"torchrun restart {restart}")
    elif config.train.init_from:
        log.info(load_initial_weights(model, config.train.init_from, codec.alphabet))
    unwrapped = model  # saved and evaluated: never a wrapper, so checkpoints carry no `module.` or `_orig_mod.`
    model = wrap_for_training(model, env, config.train.compile)

    per_process = config.train.batch_size // env.world_size
    log.info(f"{config.model.arch}: {count_parameters(unwrapped) / 1e6:.2f} M parameters, {setup.frames} frames per image, "
             f"{codec.num_classes - 1} characters")
    log.info(f"{env.world_size} process(es) on {env.device.type} x {torch.get_num_threads()} thread(s), "
             f"global batch {config.train.batch_size} = {env.world_size} x {per_process}, lr {config.optim.lr}, "
             f"{config.train.max_steps} steps, precision {precision}, {sampler.batches_per_epoch} steps per epoch")

    def model_only(accuracy: float | None) -> dict[str, Any]:
        return {"model": unwrapped.state_dict(), "step": step, "accuracy": accuracy, "config": to_dict(config),
                "alphabet": codec.alphabet, "preprocessing": setup.preprocessing.to_dict(), "world_size": env.world_size,
                "versions": {"torch": str(torch.__version__), "python": sys.version.split()[0]}}

    def save_training_state() -> Path:
        """Everything an exact resume needs (a collective: every rank adds its RNG state and log sums)."""
        log_window = window.state_dict()
        rng = gather_objects(capture_rng_state(env.device), group=env.cpu_group)
        path = checkpoint_path(out_dir, step)
        if env.is_main:
            save_checkpoint(path, {
                **model_only(None), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(), "best_accuracy": best_accuracy, "log_window": log_window, "rng": rng,
                "data_sizes": sampler.sizes,
            })
            point_last_at(path)
            prune_checkpoints(out_dir, config.train.keep_checkpoints)
        return path

    if resume_from:  # last: model building and data loading above draw random numbers too
        states = resume_from[1]["rng"]
        if len(states) == env.world_size:
            restore_rng_state(states[env.rank], env.device)
        else:
            log.info(f"warning: the checkpoint holds RNG states of {len(states)} processes, this run has "
                     f"{env.world_size}: random streams restart (the data order is still exact)")

    # --- the loop -----------------------------------------------------------------------------------
    stop.defer(env.cpu_group)
    model.train()
    log.start_progress(total=config.train.max_steps, initial=step)
    skipped_in_a_row = 0
    sampler.set_steps(step, config.train.max_steps)  # the batches depend on the step alone
    try:
        for batch in setup.loader:
            loss, infinite, taken = train_step(model, batch, optimizer, scaler, config.optim.grad_clip, env.device,
                                               precision, memory_format)
            scheduler.step()
            step += 1
            window.add(loss if taken else None, infinite, batch.num_dropped, len(batch.labels))
            skipped_in_a_row = 0 if taken else skipped_in_a_row + 1
            if not taken:
                log.info(f"step {step}: non-finite loss or gradient; step skipped ({skipped_in_a_row} in a row)")
                if skipped_in_a_row >= config.train.max_nonfinite_steps:
                    raise TrainingDiverged(
                        f"{skipped_in_a_row} steps in a row up to step {step} had a NaN or infinite loss or gradient "
                        f"(the limit is train.max_nonfinite_steps); stopping rather than training on garbage. Lower "
                        f"optim.lr, keep optim.grad_clip on, or use fp32/bf16 instead of fp16; earlier checkpoints "
                        f"are in {out_dir}")

            if step % config.train.log_every == 0 or step == config.train.max_steps:
                window_steps = range((step - 1) // config.train.log_every * config.train.log_every, step)
                drawn = sampler.drawn_per_dataset(window_steps)  # from the step alone: exact after a resume too
                record = {"step": step, "epoch": step // sampler.batches_per_epoch, "lr": scheduler.get_last_lr()[0],
                          **window.record(env.world_size), "drawn": dict(zip(config.data.train, drawn))}
                log.metrics(record)
                log.advance({"loss": f"{record['loss']:.3f}", "img/s": f"{record['images_per_s']:.0f}"})
            else:
                log.advance()

            if step % config.train.eval_every == 0 or step == config.train.max_steps:
                broadcast_buffers(unwrapped)  # evaluate, on every rank, the model rank 0 saves
                results = {}
                for dataset, loader in zip(val_sets, val_loaders):
                    counts = evaluate(unwrapped, loader, codec, env, precision, config.train.channels_last)
                    results[dataset.root] = {**summarize(counts), "undecodable_images": counts["dropped"]}
                total = sum(r["samples"] for r in results.values())
                accuracy = sum(r["accuracy"] * r["samples"] for r in results.values()) / max(total, 1)
                for root, result in results.items():
                    log.info(f"step {step} val {root}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                                                     for k, v in result.items()))
                    log.metrics({"step": step, "val": root, **result})
                if log.board is not None and val_sets:
                    log.image("val/samples", step, caption_grid(decode_samples(unwrapped, val_sets[0], codec, env.device)))
                if accuracy > best_accuracy and env.is_main:
                    save_checkpoint(out_dir / "best.pt", model_only(accuracy))
                best_accuracy = max(best_accuracy, accuracy)
                window.restart_clock()

            signum = stop.agreed()  # every rank, every step: a signal to one rank stops them all here
            if signum or step % config.train.save_every == 0 or step == config.train.max_steps:
                saved = save_training_state()
                window.restart_clock()
                if signum:
                    raise StopRequested(signum, step, str(saved))
    finally:
        log.close()  # flushes TensorBoard, also when stopped by a signal
    log.info(f"done: step {step}, best val accuracy {best_accuracy:.4f}; checkpoints in {out_dir}")


if __name__ == "__main__":
    cli.run(main, expected=(TrainingDiverged,))
