"""deep-text-recognition-benchmark's None-VGG-BiLSTM-CTC (Baek et al., 2019), the network of EasyOCR's
"generation 2" recognizers (english_g2 and the other *_g2 models).

The layers and their order are the source's, so a converted state dict loads without reshaping
(interop/peer_weights.py maps the names). Unlike this project's CRNN, the last pooling keeps the
height and the frames average over what is left of it: the network reads 32-pixel images (DTRB) and
64-pixel ones (EasyOCR) alike.
"""

from __future__ import annotations

from torch import Tensor, nn

from models.layers import BidirectionalLSTM
from models.registry import register_model

DTRB_CHANNELS = 512  # DTRB's own output_channel; EasyOCR's generation 2 uses 256


def dtrb_vgg_backbone(in_channels: int, channels: int) -> nn.Sequential:
    """Seven convolutions whose widths are channels/8, /4, /2, /2, then channels four times; the three
    convolutions after the first two poolings halve only the height. Indices match DTRB's `ConvNet`."""
    if channels < 8 or channels % 8:
        raise ValueError(
            f"model.channels={channels}: the DTRB VGG extractor needs a multiple of 8 "
            "(its first stages are channels/8, /4 and /2 wide)"
        )
    c1, c2, c3, c4 = channels // 8, channels // 4, channels // 2, channels
    return nn.Sequential(
        nn.Conv2d(in_channels, c1, 3, 1, 1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(c1, c2, 3, 1, 1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(c2, c3, 3, 1, 1),
        nn.ReLU(inplace=True),
        nn.Conv2d(c3, c3, 3, 1, 1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d((2, 1), (2, 1)),
        nn.Conv2d(c3, c4, 3, 1, 1, bias=False),
        nn.BatchNorm2d(c4),
        nn.ReLU(inplace=True),
        nn.Conv2d(c4, c4, 3, 1, 1, bias=False),
        nn.BatchNorm2d(c4),
        nn.ReLU(inplace=True),
        nn.MaxPool2d((2, 1), (2, 1)),
        nn.Conv2d(c4, c4, 2, 1, 0),
        nn.ReLU(inplace=True),
    )


@register_model("dtrb_vgg")
class DTRBVGG(nn.Module):
    """Images `[B, C, H, W]` (H at least 32, W at least 8) -> logits `[B, T, num_classes]`,
    T = W / 4 - 1.

    `channels` is DTRB's `output_channel`: 512 in DTRB's own models, 256 in EasyOCR's. The classifier
    reads the second BiLSTM's projection, as in the source.
    """

    def __init__(
        self, num_classes: int, in_channels: int = 1, hidden_size: int = 256, channels: int = DTRB_CHANNELS
    ) -> None:
        super().__init__()
        self.backbone = dtrb_vgg_backbone(in_channels, channels)
        self.sequence = nn.Sequential(
            BidirectionalLSTM(channels, hidden_size, hidden_size),
            BidirectionalLSTM(hidden_size, hidden_size, hidden_size),
        )
        self.classifier = nn.Linear(hidden_size, num_classes)

    def forward(self, images: Tensor) -> Tensor:
        if images.shape[2] < 32 or images.shape[3] < 8:
            raise ValueError(
                f"dtrb_vgg reads images at least 32 pixels high and 8 wide, got {images.shape[2]} x "
                f"{images.shape[3]}"
            )
        features = self.backbone(images)  # [B, channels, H / 16 - 1, T]
        # The source's AdaptiveAvgPool2d((None, 1)). Contiguous: torch.export then traces one program for every
        # batch size (a permuted view of a single image is contiguous, of several not).
        features = features.mean(2).permute(2, 0, 1).contiguous()  # [T, B, channels]
        logits = self.classifier(self.sequence(features))  # [T, B, num_classes]
        return logits.transpose(0, 1)  # [B, T, num_classes]
