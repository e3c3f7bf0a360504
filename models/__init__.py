"""Models: pure nn.Modules, `forward(images [B, C, H, W]) -> logits [B, T, num_classes]`. The registry and
what measures any model (registry.py), the parts several architectures share (layers.py), the CTC loss
(losses.py), and one module per architecture, which registers itself with `@register_model("name")` when
imported below: the CRNN (crnn.py), and the layouts of imported weights, deep-text-recognition-benchmark's
and EasyOCR's (dtrb.py) and crnn.pytorch's (crnn_pytorch.py).

Nothing but this file imports models/crnn.py: the rest of the project builds models by name
(`model.arch`), and the parts other code shares live in layers.py. So a fork that drops the CRNN
deletes crnn.py and its import line below, sets `model.arch`'s default (ModelConfig in
training/config.py) to another architecture, and points the configs that name `crnn`
(configs/crnn.yaml, configs/cjk.yaml) at it too.
"""

from models.crnn import CRNN as CRNN
from models.crnn_pytorch import CRNNPyTorch as CRNNPyTorch
from models.dtrb import DTRBVGG as DTRBVGG
from models.registry import (
    ARCHITECTURES,
    build_model,
    check_model_config,
    count_parameters,
    model_from_config,
    output_frames,
    register_model,
    setting_defaults,
)

__all__ = [
    "ARCHITECTURES",
    "build_model",
    "check_model_config",
    "count_parameters",
    "model_from_config",
    "output_frames",
    "register_model",
    "setting_defaults",
]
