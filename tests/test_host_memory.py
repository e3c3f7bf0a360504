"""Freed tensor memory is kept for reuse in CPU processes (utils/host_memory.py), counted in page faults."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES_PER_TENSOR = 64 * 2**20 // 4096  # a 64 MB tensor: above glibc's own largest mmap threshold (32 MB)

# Allocates and frees a 64 MB tensor 30 times, as a training step does its activations, and prints the
# minor page faults of the last 10 (glibc settles its heap in the first few after the thresholds change).
ALLOCATE = """
import resource, sys, torch
from utils.distributed import setup_distributed
from utils.host_memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
elif sys.argv[1] == "setup":
    setup_distributed(device_ids=[])
counts = []
for _ in range(30):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    tensor = torch.ones(16 * 2**20)
    del tensor
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sum(counts[-10:]))
"""


def page_faults(mode: str) -> int:
    result = subprocess.run(
        [sys.executable, "-c", ALLOCATE, mode], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    return int(result.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")
@pytest.mark.parametrize("mode", ["keep", "setup"])
def test_freed_tensor_memory_is_reused_instead_of_faulted_in_again(mode: str) -> None:
    # Without the thresholds every 64 MB tensor is mapped afresh and each of its pages faulted in;
    # with them (set directly, or by setup_distributed on the CPU) the same memory is reused.
    assert page_faults("none") > 5 * PAGES_PER_TENSOR
    assert page_faults(mode) < PAGES_PER_TENSOR
