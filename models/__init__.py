"""Model registry: the one place a fork swaps the backbone or adds an architecture."""
from __future__ import annotations

from typing import Any

from torch import nn

from models.crnn import CRNN, count_parameters, output_frames

ARCHITECTURES = {"crnn": CRNN}


def build_model(arch: str, num_classes: int, in_channels: int, hidden_size: int, **settings: Any) -> nn.Module:
    """A fresh model whose `forward(images [B, C, H, W]) -> logits [B, T, num_classes]`; `settings` are
    the architecture's own (the CRNN's `channels`)."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"model.arch: unknown architecture {arch!r}; choose one of {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[arch](num_classes=num_classes, in_channels=in_channels, hidden_size=hidden_size, **settings)


__all__ = ["ARCHITECTURES", "CRNN", "build_model", "count_parameters", "output_frames"]
