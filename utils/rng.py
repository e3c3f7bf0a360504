"""Random-number-generator state as plain values, so a checkpoint restores it with weights-only loading."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng_state(device: torch.device) -> dict[str, Any]:
    """Python's, NumPy's and torch's (CPU, and this process's GPU) generator states."""
    version, internal, gauss = random.getstate()
    kind, keys, position, has_gauss, cached_gauss = np.random.get_state()
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), position, has_gauss, cached_gauss],
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state: dict[str, Any], device: torch.device) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, position, has_gauss, cached_gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached_gauss))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
