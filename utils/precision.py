"""Mixed precision: which dtype the forward pass runs in, decided once per run."""
from __future__ import annotations

import contextlib
import platform
from pathlib import Path

import torch

# x86 instructions that compute in bf16. oneDNN also "supports" bf16 on plain AVX-512 (and torch's
# _is_mkldnn_bf16_supported says so), but emulates it there: 3.3x slower than fp32 on an Ice Lake Xeon.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags() -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (what `lscpu` shows); empty where unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith(("flags", "Features"))
            for flag in line.partition(":")[2].split()}


def cpu_has_native_bf16() -> bool:
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return False
    if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
        return bool(cpu_flags() & set(NATIVE_BF16_FLAGS))
    return True  # other architectures: oneDNN's own check (e.g. Arm's bf16 extension)


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto` becomes bf16 where the hardware runs it natively (recent GPUs, CPUs with AVX-512 BF16
    or AMX), fp32 elsewhere: emulated bf16 on an older CPU is slower than fp32."""
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("train.precision=fp16 needs a CUDA device; use bf16 or fp32 on the CPU")
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_has_native_bf16() else "fp32"


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The forward pass's autocast context; the CTC loss is computed outside it, in fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)
