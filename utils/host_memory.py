"""Keep freed tensor memory in the process for the next step, where the C library allows it.

A CPU training step allocates and frees the same few-megabyte tensors every step. glibc hands blocks
above its mmap threshold back to the kernel when they are freed (and trims the heap's free top), so the
next step faults every page in again, zeroed: ~6,000 page faults a step for the README's model in
fp32. Raising both thresholds keeps that memory for reuse; the process's resident memory stays at its
peak, which a training step reaches every time anyway. What it buys is measured in docs/performance.md
(levers): a few per cent of an fp32 step.
"""

from __future__ import annotations

import ctypes

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Blocks below this come from the heap and are reused (a GPU-sized batch on the CPU: tens of megabytes).
MMAP_THRESHOLD_BYTES = 256 * 2**20
# Free memory at the heap's top is returned to the kernel only beyond this.
TRIM_THRESHOLD_BYTES = 2**30


def keep_freed_memory() -> bool:
    """Set glibc's thresholds for this process (and the workers it forks later); whether they were set.
    False where the C library has no mallopt (musl, macOS, Windows) or refuses the values."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # TypeError: Windows, where CDLL needs a library's name
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
