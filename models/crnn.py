"""CRNN (Shi, Bai & Yao, 2015): a VGG-style CNN, two bidirectional LSTMs, a per-frame classifier."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from models.registry import register_model

# (kernel, padding, pooling after the layer) of each convolution. The two (2, 1) poolings halve the
# height but keep the width, so a 32 x 100 image becomes 26 frames: enough for words of up to ~20
# characters.
VGG_LAYERS: list[tuple[int, int, tuple[int, int] | None]] = [
    (3, 1, (2, 2)),
    (3, 1, (2, 2)),
    (3, 1, None),
    (3, 1, (2, 1)),
    (3, 1, None),
    (3, 1, (2, 1)),
    (2, 0, None),
]
# The paper's widths. The convolutions are most of a training step's time, and their cost grows with
# the square of the width: configs/crnn.yaml trains a narrower network (model.channels).
VGG_CHANNELS = (64, 128, 256, 256, 512, 512, 512)


def vgg_backbone(in_channels: int, channels: tuple[int, ...] = VGG_CHANNELS) -> nn.Sequential:
    if len(channels) != len(VGG_LAYERS):
        raise ValueError(f"model.channels: the VGG backbone has {len(VGG_LAYERS)} convolutions, got "
                         f"{len(channels)} widths: {list(channels)}")
    for position, width in enumerate(channels):
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"model.channels[{position}]={width}: must be at least 1 (an integer)")
    layers: list[nn.Module] = []
    for out_channels, (kernel, padding, pool) in zip(channels, VGG_LAYERS):
        # Every convolution is followed by BatchNorm (the paper has it on two): it shortens CTC's
        # all-blank plateau at the start of training. The BN shift makes a conv bias redundant.
        layers += [
            nn.Conv2d(in_channels, out_channels, kernel, padding=padding, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        ]
        if pool == (2, 2):
            layers.append(nn.MaxPool2d(2, 2))
        elif pool == (2, 1):
            layers.append(nn.MaxPool2d((2, 2), stride=(2, 1), padding=(0, 1)))
        in_channels = out_channels
    return nn.Sequential(*layers)


class BidirectionalLSTM(nn.Module):
    """A BiLSTM over time-first input followed by a linear projection of both directions."""

    def __init__(self, input_size: int, hidden_size: int, output_size: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(input_size, hidden_size, bidirectional=True)
        self.linear = nn.Linear(2 * hidden_size, output_size)

    def forward(self, features: Tensor) -> Tensor:  # [T, B, input_size] -> [T, B, output_size]
        hidden, _ = self.rnn(features)
        return self.linear(hidden)


@register_model("crnn")
class CRNN(nn.Module):
    """Text-line images `[B, C, 32, W]` -> per-frame class logits `[B, T, num_classes]`.

    The output is batch-first on purpose: this module is what DistributedDataParallel (or
    DataParallel) wraps, and wrappers split and concatenate along dim 0. The time-first layout the
    LSTM and the CTC loss want is made inside `forward` and after the wrapper, never across it.
    """

    def __init__(self, num_classes: int, in_channels: int = 1, hidden_size: int = 256,
                 channels: tuple[int, ...] = VGG_CHANNELS, lstm_layers: int = 2) -> None:
        super().__init__()
        if isinstance(lstm_layers, bool) or not isinstance(lstm_layers, int) or lstm_layers < 1:
            raise ValueError(f"model.lstm_layers={lstm_layers}: must be at least 1 (an integer; the paper has 2)")
        self.backbone = vgg_backbone(in_channels, tuple(channels))
        sizes = [channels[-1]] + [hidden_size] * (lstm_layers - 1) + [num_classes]
        self.sequence = nn.Sequential(*(BidirectionalLSTM(inputs, hidden_size, outputs)
                                        for inputs, outputs in zip(sizes, sizes[1:])))

    def forward(self, images: Tensor) -> Tensor:
        # The backbone pools 32 rows down to one, and needs 4 columns to leave one frame.
        if images.shape[2] != 32 or images.shape[3] < 4:
            raise ValueError(f"CRNN reads images 32 pixels high and at least 4 wide, got {images.shape[2]} x "
                             f"{images.shape[3]}")
        features = self.backbone(images)  # [B, channels[-1], 1, T]
        features = features.squeeze(2).permute(2, 0, 1)  # [T, B, channels[-1]]
        logits = self.sequence(features)  # [T, B, num_classes]
        return logits.transpose(0, 1)  # [B, T, num_classes]


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
