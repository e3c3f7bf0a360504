"""CRNN (Shi, Bai & Yao, 2015): a VGG-style CNN, two bidirectional LSTMs, a per-frame classifier.
`lstm_layers=0` leaves the BiLSTMs out: each frame is classified from its own column of CNN features
(Rosetta's CNN + CTC); `cnn_shortcut=True` adds that classifier beside the BiLSTMs'. `pool_before_norm`
and `strided_stem` reorder the backbone's blocks for speed (vgg_backbone). Its parts shared with other
architectures (the VGG table, the BiLSTM) are in models/layers.py."""

from __future__ import annotations

from torch import Tensor, nn

from models.layers import VGG_CHANNELS, VGG_LAYERS, BidirectionalLSTM
from models.registry import register_model


def max_pool(pool: tuple[int, int]) -> nn.MaxPool2d:
    """VGG_LAYERS' poolings: (2, 2) halves the height and the width, (2, 1) the height only."""
    if pool == (2, 2):
        return nn.MaxPool2d(2, 2)
    return nn.MaxPool2d((2, 2), stride=(2, 1), padding=(0, 1))


def vgg_backbone(
    in_channels: int,
    channels: tuple[int, ...] = VGG_CHANNELS,
    pool_before_norm: bool = False,
    strided_stem: bool = False,
) -> nn.Sequential:
    """The VGG_LAYERS convolutions at `channels` widths, each followed by BatchNorm and ReLU.

    `pool_before_norm` max-pools straight after a convolution, before its BatchNorm and ReLU, which
    then run on a half or a quarter of the pixels (ReLU and max-pooling commute; BatchNorm's statistics
    are taken over the pooled maps). `strided_stem` makes the first convolution stride 2 in place of
    its 2 x 2 pooling. Both change the state dict's module numbers, so a checkpoint loads only into
    the layout it was trained in."""
    if len(channels) != len(VGG_LAYERS):
        raise ValueError(
            f"model.channels: the VGG backbone has {len(VGG_LAYERS)} convolutions, got "
            f"{len(channels)} widths: {list(channels)}"
        )
    for position, width in enumerate(channels):
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"model.channels[{position}]={width}: must be at least 1 (an integer)")
    layers: list[nn.Module] = []
    for position, (out_channels, (kernel, padding, pool)) in enumerate(zip(channels, VGG_LAYERS)):
        stride = 1
        if strided_stem and position == 0:  # VGG_LAYERS' first pooling is 2 x 2: the stride takes its place
            stride, pool = 2, None
        # Every convolution is followed by BatchNorm (the paper has it on two): it shortens CTC's
        # all-blank plateau at the start of training. The BN shift makes a conv bias redundant.
        block: list[nn.Module] = [
            nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=padding, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        ]
        if pool is not None:
            block.insert(1 if pool_before_norm else len(block), max_pool(pool))
        layers += block
        in_channels = out_channels
    return nn.Sequential(*layers)


@register_model("crnn")
class CRNN(nn.Module):
    """Text-line images `[B, C, 32, W]` -> per-frame class logits `[B, T, num_classes]`.

    The output is batch-first on purpose: this module is what DistributedDataParallel (or
    DataParallel) wraps, and wrappers split and concatenate along dim 0. The time-first layout the
    LSTM and the CTC loss want is made inside `forward` and after the wrapper, never across it.
    """

    def __init__(
        self,
        num_classes: int,
        in_channels: int = 1,
        hidden_size: int = 256,
        channels: tuple[int, ...] = VGG_CHANNELS,
        lstm_layers: int = 2,
        cnn_shortcut: bool = False,
        pool_before_norm: bool = False,
        strided_stem: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(lstm_layers, bool) or not isinstance(lstm_layers, int) or lstm_layers < 0:
            raise ValueError(f"model.lstm_layers={lstm_layers}: must be at least 0 (an integer; the paper has 2)")
        flags = {"cnn_shortcut": cnn_shortcut, "pool_before_norm": pool_before_norm, "strided_stem": strided_stem}
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise ValueError(f"model.{name}={value!r}: must be true or false")
        if cnn_shortcut and lstm_layers == 0:
            raise ValueError(
                "model.cnn_shortcut=true adds a classifier of the backbone's features beside the BiLSTMs', and "
                "model.lstm_layers=0 has no BiLSTM: that classifier is already the whole head; drop one of the two"
            )
        self.backbone = vgg_backbone(in_channels, tuple(channels), pool_before_norm, strided_stem)
        if lstm_layers == 0:  # the classifier alone, where the BiLSTMs would be
            self.sequence = nn.Sequential(nn.Linear(channels[-1], num_classes))
        else:
            sizes = [channels[-1]] + [hidden_size] * (lstm_layers - 1) + [num_classes]
            self.sequence = nn.Sequential(
                *(BidirectionalLSTM(inputs, hidden_size, outputs) for inputs, outputs in zip(sizes, sizes[1:]))
            )
        # Each frame's classes from its own column of backbone features, added to the BiLSTMs': the
        # convolutions then learn characters from the first steps, through a path the LSTM's slow start
        # does not block, and CTC leaves its all-blank plateau hundreds of steps sooner
        # (docs/real-text.md#why-the-recipe-is-what-it-is).
        self.shortcut = nn.Linear(channels[-1], num_classes) if cnn_shortcut else None

    def forward(self, images: Tensor) -> Tensor:
        # The backbone pools 32 rows down to one, and needs 4 columns to leave one frame.
        if images.shape[2] != 32 or images.shape[3] < 4:
            raise ValueError(
                f"CRNN reads images 32 pixels high and at least 4 wide, got {images.shape[2]} x " f"{images.shape[3]}"
            )
        features = self.backbone(images)  # [B, channels[-1], 1, T]
        features = features.squeeze(2).permute(2, 0, 1)  # [T, B, channels[-1]]
        logits = self.sequence(features)  # [T, B, num_classes]
        if self.shortcut is not None:
            logits = logits + self.shortcut(features)
        return logits.transpose(0, 1)  # [B, T, num_classes]
