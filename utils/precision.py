"""Mixed precision: which dtype the forward pass runs in, decided once per run.

On a GPU `auto` is bf16 where it is supported, else fp16. On a CPU it is measured: the same model's
step is timed in fp32 and in bf16 and the faster one is used, because a CPU flag does not tell. With
`avx512_bf16` an AMD EPYC trained 1.86x faster in bf16, an Intel Xeon (family 6, model 207) 1.46x
slower. The figures are cached per machine, torch version and step shape (`choice_cache`), so only
the first start on a machine pays the few seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

from utils.atomic_write import write_text_atomically
from utils.cache_home import cache_home

# x86 instructions that compute in bf16. oneDNN also "supports" bf16 on plain AVX-512 (and torch's
# _is_mkldnn_bf16_supported says so), but emulates it there: 3.3x slower than fp32 on an Ice Lake Xeon.
# Having them is no promise either (see the docstring): `auto` measures; the flags only say what a CPU is.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# What train.precision and the commands' --precision take: `auto` chooses among the others (resolve_precision).
PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def cpu_info() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cpu_flags() -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (what `lscpu` shows); empty where unknown."""
    return {
        flag
        for line in cpu_info().splitlines()
        if line.startswith(("flags", "Features"))
        for flag in line.partition(":")[2].split()
    }


def cpu_has_native_bf16() -> bool:
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return False
    if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
        return bool(cpu_flags() & set(NATIVE_BF16_FLAGS))
    return True  # other architectures: oneDNN's own check (e.g. Arm's bf16 extension)


def candidate_precisions(device: torch.device) -> tuple[str, ...]:
    """The precisions `auto` chooses from: one on a GPU; on a CPU fp32, and bf16 where oneDNN computes it
    at all (natively or emulated: the measurement tells which pays)."""
    if device.type == "cuda":
        # Emulated bf16 (before Ampere: a V100, a T4) runs several times slower than fp16: native only.
        return ("bf16",) if torch.cuda.is_bf16_supported(including_emulation=False) else ("fp16",)
    bf16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return ("fp32", "bf16") if bf16 else ("fp32",)


def resolve_precision(
    precision: str,
    device: torch.device,
    time_step: Callable[[str], float] | None = None,
    shape: str = "",
    log: Callable[[str], None] = print,
    option: str = "train.precision",
) -> str:
    """The precision to run in. `auto` with one candidate is that one; with several, the fastest by
    `time_step(precision) -> seconds` (one step of the work to be done; called a few times each,
    interleaved), cached under `shape` (what the step is: model, batch, input size). `option` is
    what the user set it with, for the error."""
    if precision == "fp16" and device.type != "cuda":
        raise ValueError(f"{option}=fp16 needs a CUDA device; use bf16 or fp32 on the CPU")
    if precision != "auto":
        return precision
    candidates = candidate_precisions(device)
    if len(candidates) == 1:
        [choice] = candidates
        if device.type != "cuda":
            reason = "oneDNN computes no bf16 on this CPU"
        else:
            reason = "this GPU computes bf16" if choice == "bf16" else "this GPU has no bf16"
        log(f"precision auto: {choice} (the one candidate: {reason})")
        return choice
    if time_step is None:
        raise ValueError(f"precision auto on {device.type} chooses by timing a step: give time_step")
    cache, key = choice_cache(), cache_key(device, shape)
    cached = read_choices(cache).get(key)
    if cached is not None and cached.get("precision") in candidates:
        log(
            f"precision auto: {cached['precision']} ({describe(cached['seconds'])}, measured before on this "
            f"machine; {cache})"
        )
        return cached["precision"]
    seconds = measure(candidates, time_step)
    choice = min(seconds, key=seconds.get)
    log(f"precision auto: {choice} ({describe(seconds)}, measured now; cached in {cache})")
    with contextlib.suppress(OSError):  # a read-only home only costs the next start the measurement
        write_text_atomically(
            cache, json.dumps({**read_choices(cache), key: {"precision": choice, "seconds": seconds}}, indent=1) + "\n"
        )
    return choice


def measure(candidates: tuple[str, ...], time_step: Callable[[str], float], rounds: int = 5) -> dict[str, float]:
    """Each candidate's fastest step, in seconds. Interleaved rounds, so a clock that drifts (another
    process, turbo) weighs on every candidate alike; the minimum, the least disturbed run. A candidate
    is dropped as soon as it is clearly behind, its figure then the slowest it showed: 10x the fastest
    on the first (warm-up) step, 2x after the first round. Emulated bf16 on an AVX-512 CPU without
    native bf16 took 25x fp32's time (44 s a step of the paper's network): it is timed once."""
    # The first step includes oneDNN choosing and caching its kernels for the precision.
    best = {precision: time_step(precision) for precision in candidates}
    contenders = [precision for precision in candidates if best[precision] < 10 * min(best.values())]
    for round_index in range(rounds):
        for precision in contenders:
            best[precision] = time_step(precision) if round_index == 0 else min(best[precision], time_step(precision))
        if round_index == 0:
            fastest = min(best[precision] for precision in contenders)
            contenders = [precision for precision in contenders if best[precision] < 2 * fastest]
    return best


def timed(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def describe(seconds: dict[str, float]) -> str:
    return ", ".join(f"{precision} {1000 * value:.1f} ms a step" for precision, value in seconds.items())


def choice_cache() -> Path:
    return cache_home() / "precision.json"


def read_choices(path: Path) -> dict[str, dict]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or unreadable: measure again and write a new one
        return {}


def cache_key(device: torch.device, shape: str) -> str:
    """What makes a measurement valid: the CPU (model name, family and model, flags), the kernels torch runs
    on it, torch, the threads, the step. The family counts: two generations of AMD EPYC both call themselves
    "AMD EPYC" and may list the same flags (a cache folder shared by the nodes of a cluster sees both). The
    kernels count because they can be capped below the CPU's own (`ATEN_CPU_CAPABILITY=avx2`,
    `ONEDNN_MAX_CPU_ISA=AVX2`, as a CPU without AVX-512 runs): the same CPU then times otherwise."""
    fields = {}
    for line in cpu_info().splitlines():
        field, _, value = line.partition(":")
        fields.setdefault(field.strip(), value.strip())
    name = fields.get("model name") or platform.processor()
    cpu = f"{name} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
    flags = hashlib.sha1(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:12]
    kernels = f"{torch.backends.cpu.get_cpu_capability()} onednn {os.environ.get('ONEDNN_MAX_CPU_ISA', 'all')}"
    threads = torch.get_num_threads()
    key = f"{device.type} | {cpu} | flags {flags} | kernels {kernels} | torch {torch.__version__}"
    return f"{key} | threads {threads} | {shape}"


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The forward pass's autocast context; the CTC loss is computed outside it, in fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)
