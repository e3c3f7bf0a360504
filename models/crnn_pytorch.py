"""crnn.pytorch's CRNN (github.com/meijieru/crnn.pytorch, the `crnn.pth` most tutorials load): the
paper's network with a bias on every convolution and BatchNorm after convolutions 2, 4 and 6 only.

This project's own CRNN (models/crnn.py) puts BatchNorm after every convolution, so the published
weights need this variant. Module names follow the source's (`conv0` ... `batchnorm6`), so a
converted state dict loads as it is once `cnn.`/`rnn.` are renamed (interop/peer_weights.py).
"""

from __future__ import annotations

from collections import OrderedDict

from torch import Tensor, nn

from models.layers import VGG_CHANNELS, VGG_LAYERS, BidirectionalLSTM
from models.registry import register_model

BATCHNORM_AFTER = (2, 4, 6)


def crnn_pytorch_backbone(in_channels: int) -> nn.Sequential:
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    pools = 0
    for index, (out_channels, (kernel, padding, pool)) in enumerate(zip(VGG_CHANNELS, VGG_LAYERS)):
        layers[f"conv{index}"] = nn.Conv2d(in_channels, out_channels, kernel, 1, padding)
        if index in BATCHNORM_AFTER:
            layers[f"batchnorm{index}"] = nn.BatchNorm2d(out_channels)
        layers[f"relu{index}"] = nn.ReLU(inplace=True)
        if pool is not None:
            layers[f"pooling{pools}"] = (
                nn.MaxPool2d(2, 2) if pool == (2, 2) else nn.MaxPool2d((2, 2), stride=(2, 1), padding=(0, 1))
            )
            pools += 1
        in_channels = out_channels
    return nn.Sequential(layers)


@register_model("crnn_pytorch")
class CRNNPyTorch(nn.Module):
    """Images `[B, C, 32, W]` -> logits `[B, T, num_classes]`, T = W / 4 + 1."""

    def __init__(self, num_classes: int, in_channels: int = 1, hidden_size: int = 256) -> None:
        super().__init__()
        self.backbone = crnn_pytorch_backbone(in_channels)
        self.sequence = nn.Sequential(
            BidirectionalLSTM(VGG_CHANNELS[-1], hidden_size, hidden_size),
            BidirectionalLSTM(hidden_size, hidden_size, num_classes),
        )

    def forward(self, images: Tensor) -> Tensor:
        if images.shape[2] != 32 or images.shape[3] < 4:
            raise ValueError(
                f"crnn_pytorch reads images 32 pixels high and at least 4 wide, got {images.shape[2]} x "
                f"{images.shape[3]}"
            )
        features = self.backbone(images).squeeze(2).permute(2, 0, 1)  # [T, B, 512]
        return self.sequence(features).transpose(0, 1)  # [B, T, num_classes]
