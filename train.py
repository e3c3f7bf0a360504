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
import sys
import time
from pathlib import Path

import torch
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import ConcatDataset, DataLoader, DistributedSampler

from data.codec import CTCCodec
from data.alphabet import load_alphabet
from data.lmdb_dataset import Batch, CollateBatch, LmdbDataset
from data.transforms import ImageTransform
from models import build_model, count_parameters, output_frames
from utils.checkpoint import load_checkpoint, load_initial_weights, save_checkpoint
from utils.config import Config, ConfigError, load_config, to_dict, validate
from utils.distributed import (DistEnv, all_reduce_sum, broadcast_buffers, cleanup_distributed, read_env,
                               setup_distributed)
from utils.evaluate import build_eval_loader, evaluate
from utils.losses import ctc_losses
from utils.metrics import summarize
from utils.precision import autocast, resolve_precision
from utils.run_log import RunLog


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML file, or a bare name looked up in configs/")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. optim.lr=3e-4")
    return parser.parse_args()


def build_train_loader(config: Config, codec: CTCCodec, datasets: list[LmdbDataset], env: DistEnv
                       ) -> tuple[DataLoader, DistributedSampler]:
    dataset = ConcatDataset(datasets)
    per_process = config.train.batch_size // env.world_size
    # One process is a world of one: the same sampler shards nothing and shuffles per epoch alike.
    sampler = DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank, shuffle=True,
                                 seed=config.train.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=per_process, sampler=sampler, drop_last=True,
                        num_workers=config.data.num_workers, collate_fn=CollateBatch(codec, datasets[0].transform.output_shape),
                        pin_memory=env.device.type == "cuda", persistent_workers=config.data.num_workers > 0)
    if len(loader) == 0:
        raise ValueError(f"data.train has {len(dataset)} usable samples: fewer than one global batch of "
                         f"{config.train.batch_size}; add data or lower train.batch_size")
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
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step; returns the loss and the count of infinite losses, left on the device."""
    images = batch.images.to(device, non_blocking=True, memory_format=memory_format)
    with autocast(device, precision):
        logits = model(images)  # [B, T, C]
    losses, infinite = ctc_losses(logits, batch, device)
    loss = losses.sum() / max(len(losses), 1)  # not mean(): a batch emptied by undecodable images gives 0
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if grad_clip > 0:
        scaler.unscale_(optimizer)  # clip the true gradients, not the fp16-scaled ones
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    return loss, infinite


def main() -> None:
    args = parse_args()
    config = load_config(args.config, args.overrides)
    validate(config)
    _, _, world_size, _ = read_env()
    # Checked before any process group exists, so every rank stops with this message instead of hanging.
    if config.train.batch_size % world_size or config.train.eval_batch_size % world_size:
        raise ConfigError(f"train.batch_size={config.train.batch_size} and train.eval_batch_size="
                          f"{config.train.eval_batch_size} must divide by the {world_size} processes")
    env = setup_distributed(config.device_ids, config.train.threads)
    try:
        train(config, env)
    finally:
        cleanup_distributed()


def train(config: Config, env: DistEnv) -> None:
    out_dir = Path(config.train.out_dir)
    if env.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False), encoding="utf-8")
    log = RunLog(out_dir if env.is_main else None)
    log.info(f"config:\n{yaml.safe_dump(to_dict(config), sort_keys=False)}")
    torch.manual_seed(config.train.seed)  # same initial weights on every rank (DDP broadcasts rank 0's anyway)

    # --- model and data -------------------------------------------------------------------------
    codec = CTCCodec(load_alphabet(config.data.alphabet), fold_case=config.data.fold_case)
    model = build_model(config.model.arch, codec.num_classes, config.model.in_channels, config.model.hidden_size)
    frames = output_frames(model, config.model.in_channels, config.data.img_height, config.data.img_width)
    transform = ImageTransform(config.data.img_height, config.data.img_width, config.model.in_channels, config.data.keep_aspect)
    train_sets = [LmdbDataset(root, codec, frames, transform) for root in config.data.train]
    val_sets = [LmdbDataset(root, codec, frames, transform) for root in config.data.val]
    for dataset in train_sets + val_sets:
        log.info(dataset.report.summary())
    train_loader, sampler = build_train_loader(config, codec, train_sets, env)
    val_loaders = [build_eval_loader(dataset, codec, config.train.eval_batch_size // env.world_size,
                                     config.data.num_workers, env) for dataset in val_sets]

    # --- optimisation state -----------------------------------------------------------------------
    precision = resolve_precision(config.train.precision, env.device)
    memory_format = torch.channels_last if config.train.channels_last else torch.contiguous_format
    model.to(env.device, memory_format=memory_format)
    optimizer, scheduler = build_optimizer(config, model)
    # fp16 needs loss scaling to keep small gradients from flushing to zero; bf16 and fp32 do not.
    scaler = torch.amp.GradScaler(env.device.type, enabled=precision == "fp16")
    step, epoch, best_accuracy = 0, 0, -1.0
    if config.train.resume:
        checkpoint = load_checkpoint(config.train.resume, map_location=env.device)
        if checkpoint.get("alphabet") != codec.alphabet:
            raise ValueError(f"train.resume: {config.train.resume} was trained with another alphabet")
        model.load_state_dict(checkpoint["model"], strict=True)
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        if "scaler" in checkpoint:
            scaler.load_state_dict(checkpoint["scaler"])
        step, epoch, best_accuracy = checkpoint["step"], checkpoint["epoch"] + 1, checkpoint["best_accuracy"]
        log.info(f"resumed from {config.train.resume} at step {step}")
    elif config.train.init_from:
        log.info(load_initial_weights(model, config.train.init_from))
    unwrapped = model  # saved and evaluated: never the DDP wrapper, so checkpoints carry no `module.`
    if env.distributed:
        model = DistributedDataParallel(model, device_ids=[env.device] if env.device.type == "cuda" else None,
                                        gradient_as_bucket_view=True)

    per_process = config.train.batch_size // env.world_size
    log.info(f"{config.model.arch}: {count_parameters(unwrapped) / 1e6:.2f} M parameters, {frames} frames per image, "
             f"{codec.num_classes - 1} characters")
    log.info(f"{env.world_size} process(es) on {env.device.type} x {torch.get_num_threads()} thread(s), "
             f"global batch {config.train.batch_size} = {env.world_size} x {per_process}, lr {config.optim.lr}, "
             f"{config.train.max_steps} steps, precision {precision}, {len(train_loader)} steps per epoch")

    def save(names: list[str], accuracy: float | None) -> None:
        if not env.is_main:
            return
        checkpoint = {
            "model": unwrapped.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(), "step": step, "epoch": epoch, "best_accuracy": best_accuracy,
            "accuracy": accuracy, "config": to_dict(config), "alphabet": codec.alphabet,
            "world_size": env.world_size, "versions": {"torch": str(torch.__version__), "python": sys.version.split()[0]},
        }
        for name in names:
            save_checkpoint(out_dir / name, checkpoint)

    # --- the loop -----------------------------------------------------------------------------------
    model.train()
    log.start_progress(total=config.train.max_steps, initial=step)
    window_loss = torch.zeros((), device=env.device)  # summed on the device: no host sync per step
    window_infinite = torch.zeros((), dtype=torch.long, device=env.device)
    window_steps, window_samples, window_dropped, window_start = 0, 0, 0, time.perf_counter()
    while step < config.train.max_steps:
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for batch in train_loader:
            loss, infinite = train_step(model, batch, optimizer, scaler, config.optim.grad_clip, env.device,
                                        precision, memory_format)
            scheduler.step()
            step += 1
            window_steps += 1
            window_loss += loss.detach()
            window_infinite += infinite
            window_samples += len(batch.labels)
            window_dropped += batch.num_dropped

            if step % config.train.log_every == 0 or step == config.train.max_steps:
                totals = all_reduce_sum(torch.stack([window_loss.float().cpu(), window_infinite.float().cpu(),
                                                     torch.tensor(float(window_samples)), torch.tensor(float(window_dropped))]))
                record = {"step": step, "epoch": epoch, "loss": totals[0].item() / env.world_size / window_steps,
                          "lr": scheduler.get_last_lr()[0], "images_per_s": totals[2].item() / (time.perf_counter() - window_start),
                          "infinite_losses": int(totals[1]), "undecodable_images": int(totals[3])}
                log.metrics(record)
                log.advance({"loss": f"{record['loss']:.3f}", "img/s": f"{record['images_per_s']:.0f}"})
                window_loss.zero_()
                window_infinite.zero_()
                window_steps, window_samples, window_dropped, window_start = 0, 0, 0, time.perf_counter()
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
                is_best = accuracy > best_accuracy
                best_accuracy = max(best_accuracy, accuracy)
                save(["last.pt", "best.pt"] if is_best else ["last.pt"], accuracy)
                window_start = time.perf_counter()  # evaluation time is not training throughput
            if step >= config.train.max_steps:
                break
        epoch += 1
    log.close()
    log.info(f"done: step {step}, best val accuracy {best_accuracy:.4f}; checkpoints in {out_dir}")


if __name__ == "__main__":
    try:
        main()
    except (ConfigError, FileNotFoundError, ValueError) as error:
        # Bad input, not a bug: the message names the file, key or option; a traceback would bury it.
        sys.exit(f"error: {error}")
