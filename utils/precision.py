"""Mixed precision: which dtype the forward pass runs in, decided once per run."""
from __future__ import annotations

import contextlib

import torch


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto` becomes bf16 where the hardware runs it natively (recent GPUs, CPUs with AVX-512 BF16
    or AMX), fp32 elsewhere: emulated bf16 on an older CPU is slower than fp32."""
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("train.precision=fp16 needs a CUDA device; use bf16 or fp32 on the CPU")
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    native_bf16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return "bf16" if native_bf16 else "fp32"


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The forward pass's autocast context; the CTC loss is computed outside it, in fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)
