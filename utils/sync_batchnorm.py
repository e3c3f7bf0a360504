"""BatchNorm with statistics over the global batch, on GPUs and on the CPU.

Without it each DDP process normalises with its own slice's statistics, so a 2-process run is a
different computation from a 1-process run with the same global batch. `nn.SyncBatchNorm` does this
on CUDA only; `CpuSyncBatchNorm` does the same with two differentiable all-reduces, for gloo.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn


class _AllReduceSum(torch.autograd.Function):
    """A sum over processes whose gradient is the sum of the processes' gradients."""

    @staticmethod
    def forward(ctx: object, tensor: Tensor) -> Tensor:
        tensor = tensor.clone()
        dist.all_reduce(tensor)
        return tensor

    @staticmethod
    def backward(ctx: object, grad: Tensor) -> Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def all_reduce_sum(tensor: Tensor) -> Tensor:
    return _AllReduceSum.apply(tensor)


class CpuSyncBatchNorm(nn.BatchNorm2d):
    """`nn.BatchNorm2d` whose training statistics are summed over all processes.

    A subclass with the same parameters and buffers, so its state dict loads into a plain
    BatchNorm2d. Mean first, then the centred variance: one pass of sum-of-squares loses digits.
    """

    def forward(self, input: Tensor) -> Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return super().forward(input)
        dims = (0, 2, 3)
        # Statistics in at least fp32 under bf16/fp16 autocast, like BatchNorm's own kernel.
        values = input.to(torch.promote_types(input.dtype, torch.float32))
        count = all_reduce_sum(torch.tensor([values.numel() // values.shape[1]], dtype=values.dtype))
        mean = all_reduce_sum(values.sum(dims)) / count
        centred = values - mean[None, :, None, None]
        variance = all_reduce_sum(centred.square().sum(dims)) / count
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            unbiased = variance * count / (count - 1).clamp(min=1)
            self.running_mean.lerp_(mean.to(self.running_mean.dtype), self.momentum)
            self.running_var.lerp_(unbiased.to(self.running_var.dtype), self.momentum)
        scale = self.weight * torch.rsqrt(variance + self.eps)
        return (centred * scale[None, :, None, None] + self.bias[None, :, None, None]).to(input.dtype)


def convert_sync_batchnorm(model: nn.Module, device: torch.device) -> nn.Module:
    """Every BatchNorm2d of `model` made global-batch: torch's kernel on CUDA, ours elsewhere."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    for name, child in model.named_children():
        if type(child) is nn.BatchNorm2d:
            synced = CpuSyncBatchNorm(
                child.num_features,
                child.eps,
                child.momentum,
                child.affine,
                child.track_running_stats,
                device=child.weight.device,
                dtype=child.weight.dtype,
            )
            synced.load_state_dict(child.state_dict())
            setattr(model, name, synced)
        else:
            convert_sync_batchnorm(child, device)
    return model
