"""Parts more than one architecture is built from: the CRNN paper's VGG table (this project's CRNN,
crnn.pytorch's, and interop/peer_weights.py, which checks an imported checkpoint's widths against it)
and the bidirectional LSTM of the CRNN and DTRB sequence stages. Module names are part of every
state dict key (`sequence.0.rnn.weight_ih_l0`): renaming one breaks saved and imported checkpoints."""

from __future__ import annotations

from torch import Tensor, nn

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


class BidirectionalLSTM(nn.Module):
    """A BiLSTM over time-first input followed by a linear projection of both directions."""

    def __init__(self, input_size: int, hidden_size: int, output_size: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(input_size, hidden_size, bidirectional=True)
        self.linear = nn.Linear(2 * hidden_size, output_size)

    def forward(self, features: Tensor) -> Tensor:  # [T, B, input_size] -> [T, B, output_size]
        hidden, _ = self.rnn(features)
        return self.linear(hidden)
