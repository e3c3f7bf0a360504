"""`train.overfit_batches=N`: the first check of a recipe that does not learn (Karpathy's "overfit one batch").

Instead of the run, the model trains on the first N batches the sampler gives, drawn once and never augmented,
over and over, until it reads every sample of them or train.max_steps is reached; then one line says which, and
the command exits 0 or 1. A recipe that cannot fit a few samples it sees hundreds of times has a bug (the
labels, the alphabet, the learning rate, the preprocessing) that no amount of data or steps will fix. Nothing
is validated or saved and train.max_minutes does not apply: the check is the whole run.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import torch
from torch import nn

from data.lmdb_dataset import Batch
from data.transforms import DeviceTransform
from training.run import Run
from training.run_log import RunLog
from utils.cli import Stopped
from utils.distributed import all_reduce_sum, answered, broadcast_buffers
from utils.precision import autocast
from utils.preemption import StopSignal

# Steps between readings of the batches: a reading is a forward pass over them, a fraction of this many steps.
CHECK_EVERY = 10

TrainOn = Callable[[Batch, Run, nn.Module, RunLog], None]  # train.py's train_on: one step, counted


def overfit_check(run: Run, model: nn.Module, log: RunLog, stop: StopSignal, train_on: TrainOn) -> int:
    """Train `model` (run.setup.model, wrapped as the loop's) on the fixed batches with `train_on` until every
    rank's samples read correctly or train.max_steps; say which in one line. Returns the exit code (0: passed,
    1: failed), the same on every rank: the counts are summed over the ranks before anything is decided."""
    config, state = run.config, run.state
    count = config.train.overfit_batches
    batches = first_batches(run, count)
    unaugmented = DeviceTransform(run.setup.device_transform.transform, augmentation=None)
    run = dataclasses.replace(run, setup=dataclasses.replace(run.setup, device_transform=unaugmented))
    first_step = state.step
    log.start_progress(total=config.train.max_steps, initial=first_step)
    with answered("a training step's gradient all-reduce"):
        for batch in itertools.cycle(batches):
            train_on(batch, run, model, log)
            steps, last = state.step - first_step, state.step >= config.train.max_steps
            if steps % CHECK_EVERY and not last:
                log.advance()
                continue
            correct, total = read_correctly(run, batches)
            log.advance({"read": f"{correct}/{total}"})
            signum = stop.agreed()  # every rank at the same step, as in the loop
            if signum:
                raise Stopped(signum)  # nothing to save: the check starts again from the beginning
            if correct == total or last:
                break
    batches_named = f"{count} batch{'es' * (count != 1)}"
    if correct == total:
        log.info(f"overfit check passed: the {batches_named} ({total} samples) read correctly after {steps} steps")
        return 0
    log.info(
        f"overfit check failed: after {steps} steps {correct} of {total} samples of the {batches_named} read "
        f"correctly; the recipe cannot fit even these: check the labels, the alphabet, the learning rate, the "
        f"preprocessing"
    )
    return 1


def first_batches(run: Run, count: int) -> list[Batch]:
    """This rank's slices of the run's first `count` global batches (steps 0 .. count - 1), loaded once."""
    run.setup.sampler.set_steps(0, count)
    return list(run.setup.loader)


@torch.inference_mode()
def read_correctly(run: Run, batches: list[Batch]) -> tuple[int, int]:
    """How many samples of `batches` the model reads exactly (greedy decoding, in eval mode), and how many there
    are, summed over the ranks. Each rank reads with rank 0's BatchNorm statistics, as validation does."""
    setup, device = run.setup, run.env.device
    model = setup.model
    broadcast_buffers(model)
    model.eval()
    correct = total = 0
    for batch in batches:
        on_device = [tensor.to(device) for tensor in (batch.images, batch.widths, batch.seeds)]
        images = setup.device_transform(*on_device).contiguous(memory_format=setup.memory_format)
        with autocast(device, setup.precision):
            readings = setup.codec.decode(model(images))
        correct += sum(reading.text == setup.codec.normalize(label) for reading, label in zip(readings, batch.labels))
        total += len(batch.labels)
    model.train()
    counts = all_reduce_sum(torch.tensor([correct, total]))
    return int(counts[0]), int(counts[1])
