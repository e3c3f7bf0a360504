"""`precision: auto`, measured: the model's own step timed in each candidate precision
(utils/precision.py chooses and caches), the same choice on every rank."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable

import torch
from torch import nn

from data.transforms import Preprocessing
from models.losses import ctc_losses
from utils.distributed import broadcast_object
from utils.precision import autocast, resolve_precision, timed
from utils.sync_batchnorm import CpuSyncBatchNorm


def model_signature(model: nn.Module) -> str:
    """Which network this is: its class and every parameter's name and shape, hashed."""
    shapes = str([(name, tuple(parameter.shape)) for name, parameter in model.named_parameters()])
    return f"{type(model).__name__} {hashlib.sha1(shapes.encode()).hexdigest()[:12]}"


def choose_precision(
    setting: str,
    device: torch.device,
    model: nn.Module,
    input_shape: tuple[int, int, int, int],
    *,
    training: bool,
    memory_format: torch.memory_format = torch.contiguous_format,
    log: Callable[[str], None] = print,
    is_main: bool = True,
    group: torch.distributed.ProcessGroup | None = None,
    option: str = "train.precision",
) -> str:
    """`setting` as a precision; for `auto`, the faster of the candidates for `model` on inputs of
    `input_shape` ([B, C, H, W], one process's batch): a training step (forward, fp32 CTC loss,
    backward) when `training`, a forward pass under inference_mode otherwise. Every rank times its
    own copy at once, as they will run; rank 0's choice is every rank's (`group`: a gloo group).
    `option` is what the user set it with (eval.sh and predict.py: --precision), for the error."""
    if setting != "auto":
        return resolve_precision(setting, device, option=option)
    time_step = (training_step_timer if training else forward_timer)(model, input_shape, device, memory_format)
    shape = (
        f"{'train' if training else 'infer'} {model_signature(model)} | {'x'.join(map(str, input_shape))}"
        f" | {'channels_last' if memory_format == torch.channels_last else 'contiguous'}"
    )
    choice = resolve_precision(setting, device, time_step, shape, log if is_main else lambda _: None)
    return broadcast_object(choice, group=group)


def inference_shape(preprocessing: Preprocessing, batch_size: int) -> tuple[int, int, int, int]:
    """The input evaluation and prediction time `auto` on: up to 64 images at the model's width, or, for
    a model that keeps the aspect ratio (and pads to its own width), at a word's 4:1."""
    width = min(preprocessing.width, 4 * preprocessing.height) if preprocessing.keep_aspect else preprocessing.width
    return min(batch_size, 64), preprocessing.channels, preprocessing.height, width


def synthetic_batch(
    input_shape: tuple[int, int, int, int], device: torch.device, memory_format: torch.memory_format
) -> torch.Tensor:
    # A generator of its own: timing must not move the run's random streams (exact resume depends on them).
    images = torch.rand(input_shape, generator=torch.Generator().manual_seed(0)) * 2 - 1
    return images.to(device, memory_format=memory_format)


def training_step_timer(
    model: nn.Module, input_shape: tuple[int, int, int, int], device: torch.device, memory_format: torch.memory_format
) -> Callable[[str], float]:
    """seconds(precision) of one forward + fp32 CTC loss + backward, on a copy of `model` (its BatchNorm
    statistics and gradients stay untouched). The optimizer step is left out: it runs in fp32 either way."""
    trial = copy.deepcopy(model).train()
    for module in trial.modules():
        if isinstance(module, CpuSyncBatchNorm):
            # Its all-reduces would pair each rank's timing steps with the others', and ranks may drop a
            # candidate at different moments: plain BatchNorm does the same arithmetic without them.
            module.__class__ = nn.BatchNorm2d
    images = synthetic_batch(input_shape, device, memory_format)
    with torch.no_grad():
        frames, classes = trial(images[:1]).shape[1:]
    length = max(1, frames // 4)  # a word of a typical length for the window
    targets = (torch.arange(input_shape[0] * length) % (classes - 1) + 1).to(device)
    target_lengths = torch.full((input_shape[0],), length, dtype=torch.long, device=device)

    def step(precision: str) -> float:
        def run() -> None:
            trial.zero_grad(set_to_none=True)
            with autocast(device, precision):
                logits = trial(images)  # [B, T, C]
            losses, _ = ctc_losses(logits, targets, target_lengths)
            losses.mean().backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        return timed(run)

    return step


def forward_timer(
    model: nn.Module,
    input_shape: tuple[int, int, int, int],
    device: torch.device,
    memory_format: torch.memory_format = torch.contiguous_format,
) -> Callable[[str], float]:
    """seconds(precision) of one inference forward pass of `model` (evaluation, prediction)."""
    images = synthetic_batch(input_shape, device, memory_format)

    def step(precision: str) -> float:
        @torch.inference_mode()
        def run() -> None:
            was_training = model.training
            model.eval()
            with autocast(device, precision):
                model(images)
            model.train(was_training)
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        return timed(run)

    return step
