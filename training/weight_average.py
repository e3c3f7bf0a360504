"""An exponential moving average of a model's weights (`optim.ema_decay`): what a run evaluates and
saves in place of the weights the optimizer steps, which keep moving with each batch's noise."""

from __future__ import annotations

import copy

import torch
from torch import nn


class WeightAverage:
    """`model` is the averaged copy: parameters and BatchNorm statistics, in eval mode, no gradients."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self.updates = 0

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average towards `model`'s current weights, after an optimizer step. `model` may be
        wrapped (DDP, torch.compile): its tensors are matched by position, not by name."""
        self.updates += 1
        # The first update copies (the average starts from the weights training starts from, also
        # after train.init_from); then the decay warms up as (1 + n) / (10 + n), TensorFlow's rule,
        # so early validations are not of a model that mostly remembers where it began.
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates)) if self.updates > 1 else 0.0
        averaged = [*self.model.parameters(), *self.model.buffers()]
        current = [*model.parameters(), *model.buffers()]
        floating = [index for index, tensor in enumerate(averaged) if tensor.is_floating_point()]
        torch._foreach_lerp_([averaged[i] for i in floating], [current[i].detach() for i in floating], 1 - decay)
        for average, tensor in zip(averaged, current):
            if not average.is_floating_point():  # BatchNorm's num_batches_tracked
                average.copy_(tensor)

    def load(self, weights: dict[str, torch.Tensor], updates: int) -> None:
        """Continue from a checkpoint's average (its `model`) after `updates` steps (`average_updates`)."""
        self.model.load_state_dict(weights, strict=True)
        self.updates = updates
