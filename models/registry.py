"""The architectures a config can name, how a config's `model` section becomes a model, and what
any model is measured by (count_parameters, output_frames).

    @register_model("mynet")          # in models/mynet.py, imported in models/__init__.py
    class MyNet(nn.Module):
        def __init__(self, num_classes, in_channels, hidden_size, depth=4): ...

selects it with `model.arch: mynet`, and `model.depth: 6` in the config reaches the constructor.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

ARCHITECTURES: dict[str, type[nn.Module]] = {}
BUILT_IN_SETTINGS = ("num_classes", "in_channels", "hidden_size")  # every architecture takes these


def register_model(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator: `model.arch: name` builds this class. Its `forward(images [B, C, H, W])` must
    return logits `[B, T, num_classes]`, batch-first (what DistributedDataParallel splits)."""

    def register(cls: type[nn.Module]) -> type[nn.Module]:
        if name in ARCHITECTURES and ARCHITECTURES[name] is not cls:
            raise ValueError(
                f"model architecture {name!r} is registered twice ({ARCHITECTURES[name].__name__}, " f"{cls.__name__})"
            )
        ARCHITECTURES[name] = cls
        return cls

    return register


def build_model(arch: str, num_classes: int, in_channels: int, hidden_size: int, **settings: Any) -> nn.Module:
    """A fresh model whose `forward(images [B, C, H, W]) -> logits [B, T, num_classes]`; `settings` are
    the architecture's own (the CRNN's `channels`)."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"model.arch: unknown architecture {arch!r}; choose one of {sorted(ARCHITECTURES)}")
    cls = ARCHITECTURES[arch]
    accepted = [name for name in inspect.signature(cls).parameters if name not in BUILT_IN_SETTINGS]
    for name in settings:
        if name not in accepted:
            raise ValueError(
                f"model.{name}: the {arch} architecture has no such setting; it takes "
                f"{', '.join(accepted) or 'none'}"
            )
    return cls(num_classes=num_classes, in_channels=in_channels, hidden_size=hidden_size, **settings)


def setting_defaults(arch: str) -> dict[str, Any]:
    """The architecture's own settings that have a default, as a config writes them (tuples as lists): what
    a config that leaves one out builds. {} for an architecture not registered."""
    if arch not in ARCHITECTURES:
        return {}
    return {
        name: list(parameter.default) if isinstance(parameter.default, tuple) else parameter.default
        for name, parameter in inspect.signature(ARCHITECTURES[arch]).parameters.items()
        if name not in BUILT_IN_SETTINGS and parameter.default is not inspect.Parameter.empty
    }


def model_from_config(model_config: Any, num_classes: int) -> nn.Module:
    """The model the config's `model` section describes (training.config.ModelConfig)."""
    return build_model(
        model_config.arch, num_classes, model_config.in_channels, model_config.hidden_size, **model_config.settings
    )


def check_model_config(model_config: Any) -> None:
    """Build the model on the meta device (no memory, no time): an unknown architecture or setting,
    or a value its constructor refuses, is then an error before anything starts."""
    with torch.device("meta"):
        model_from_config(model_config, num_classes=2)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def output_frames(model: nn.Module, in_channels: int, height: int, width: int) -> int:
    """Frames T the model emits for a `height x width` image: the longest label CTC can align is T.
    A size the model cannot read raises ValueError, with the model's reason."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        frames = model(torch.zeros(1, in_channels, height, width, device=device)).shape[1]
    except RuntimeError as error:  # a fork's model without a check of its own: PyTorch's shape error
        raise ValueError(f"the model cannot read {height} x {width} images: {str(error).splitlines()[0]}") from None
    finally:
        model.train(was_training)
    return frames
