"""Crops longer than the model's window (evaluation/long_crops.py): read in overlapping pieces whose
frames are stitched, by predict.py by default and by eval.py with --split-long."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from data.codec import CTCCodec
from data.lmdb_dataset import LmdbDataset
from data.lmdb_writer import write_lmdb
from data.transforms import ImageTransform, Preprocessing, pad_right
from evaluation.evaluate import read_images
from evaluation.long_crops import LongCropTransform, PiecewiseModel, piece_starts, split_long_samples, stitch
from models import build_model, model_from_config
from tests.conftest import REPO, run_command, run_env
from training.checkpoint import save_checkpoint, weights_checkpoint
from training.config import load_config

CPU = torch.device("cpu")
CODEC = CTCCodec("abcdefghij")
BACKGROUND = 255
# Pixels: a character is a bar 5 frames wide with a blank frame after it; the 3-frame margin puts some
# characters across the frames where pieces start (every 16th: half a width of 128 pixels).
BAR, GAP, MARGIN = 20, 4, 12


def grey(char: str) -> int:
    """The grey level a character's bar is drawn in: 0, 20, ..., 180, far from the white background."""
    return 20 * CODEC.alphabet.index(char)


def draw_bars(greys: list[int], bar: int = BAR, gap: int = GAP, margin: int = MARGIN) -> Image.Image:
    """A 32-pixel-high line of bars `bar` pixels wide in these greys, `gap` apart, on white."""
    image = Image.new("L", (2 * margin + len(greys) * (bar + gap) - gap, 32), BACKGROUND)
    for position, level in enumerate(greys):
        left = margin + position * (bar + gap)
        image.paste(level, (left, 0, left + bar, 32))
    return image


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


class ColumnReader(nn.Module):
    """A stand-in model whose reading follows the image's geometry exactly: frame t is the class whose
    grey is nearest to the mean of pixel columns 4t to 4t + 3 (white: the blank). With `blind_edges`,
    its two outermost frames on each side are blank, as a model without context there may read."""

    def __init__(self, blind_edges: bool = False) -> None:
        super().__init__()
        greys = [BACKGROUND] + [grey(char) for char in CODEC.alphabet]
        # Normalised as ImageTransform does (pixels / 127.5 - 1); a parameter, so output_frames finds its device.
        self.levels = nn.Parameter(torch.tensor(greys, dtype=torch.float32) / 127.5 - 1, requires_grad=False)
        self.blind_edges = blind_edges

    def forward(self, images: Tensor) -> Tensor:  # [B, 1, H, W] -> [B, W // 4, classes]
        columns = F.avg_pool2d(images, (images.shape[2], 4)).flatten(1)  # [B, W // 4]
        logits = -1000 * (columns[..., None] - self.levels) ** 2  # [B, T, classes]
        if self.blind_edges:
            blank = torch.zeros_like(self.levels)
            blank[1:] = -1000
            logits[:, :2] = logits[:, -2:] = blank
        return logits


def text_of(length: int, seed: int = 0) -> str:
    """`length` characters of CODEC's alphabet, some doubled (CTC needs the blank between those)."""
    rng = random.Random(seed)
    return "".join(rng.choice(CODEC.alphabet) * rng.choice((1, 1, 1, 2)) for _ in range(length))[:length]


@pytest.mark.parametrize("keep_aspect", [False, True])
def test_a_long_line_squashed_into_one_window_cannot_be_read_but_in_pieces_reads_exactly(keep_aspect):
    text = text_of(40)  # 980 pixels at 32 high: 7.7 model widths of 128
    transform = ImageTransform(Preprocessing(32, 128, keep_aspect=keep_aspect), width_step=8 if keep_aspect else 0)
    image_bytes = png(draw_bars([grey(char) for char in text]))
    model = ColumnReader(blind_edges=True)
    [squashed] = read_images(model, [transform(image_bytes)], CPU, CODEC.decode)
    [in_pieces] = read_images(
        PiecewiseModel(model, transform.preprocessing), [LongCropTransform(transform)(image_bytes)], CPU, CODEC.decode
    )
    assert len(squashed.text) < len(text)  # 32 frames for 40 characters: CTC cannot fit them
    assert in_pieces.text == text  # no character lost or doubled at the seams, nor at the blind edges


def test_each_frame_comes_from_the_nearest_piece_so_outer_quarters_never_reach_the_stitch():
    crop = torch.randn(2, 100, 5)  # [B, T, classes]: the frames the whole crop would give
    offsets = [0, 16, 32, 48, 64, 68]  # pieces of 32 frames, half a piece apart, the last flush with the end
    pieces = torch.stack([crop[:, offset : offset + 32] for offset in offsets], 1).clone()  # [B, P, 32, classes]
    pieces[:, 1:, :8] = pieces[:, :-1, 24:] = float("nan")  # every outer quarter but the crop's two ends
    assert torch.equal(stitch(pieces, offsets), crop)


def test_pieces_cover_the_crop_half_a_width_apart_and_the_last_is_flush_with_its_end():
    assert piece_starts(256, 128, 64) == [0, 64, 128]
    assert piece_starts(300, 128, 64) == [0, 64, 128, 172]
    assert piece_starts(129, 128, 64) == [0, 1]


@pytest.mark.parametrize("width", [257, 300, 650])
def test_a_model_reading_each_frame_from_its_own_pixels_gives_the_same_frames_whole_or_in_pieces(width):
    model = ColumnReader()
    images = torch.randn(2, 1, 32, width)
    stitched = PiecewiseModel(model, Preprocessing(32, 128))(images)
    # The pieces start on the model's 4-pixel frame grid: the crop is padded to the next multiple of 4.
    assert torch.equal(stitched, model(pad_right(images, -(-width // 4) * 4)))


@pytest.mark.parametrize("arch", ["crnn", "crnn_pytorch", "dtrb_vgg"])
def test_every_architecture_gives_as_many_stitched_frames_as_it_gives_for_the_whole_crop(arch):
    torch.manual_seed(0)
    model = build_model(arch, CODEC.num_classes, 1, 16).eval()
    pieces = PiecewiseModel(model, Preprocessing(32, 128))
    assert pieces.pitch == 4 and pieces.stride == 64
    with torch.inference_mode():
        for width in (260, 301, 517):
            images = torch.randn(1, 1, 32, width)
            assert pieces(images).shape == model(pad_right(images, -(-width // 4) * 4)).shape
        images = torch.randn(3, 1, 32, 120)
        assert torch.equal(pieces(images), model(images))  # no wider than the model's input: the model itself


def test_only_crops_more_than_one_and_a_half_model_widths_long_at_the_model_height_keep_their_aspect():
    for keep_aspect in (False, True):
        long_crops = LongCropTransform(ImageTransform(Preprocessing(32, 128, keep_aspect=keep_aspect)))
        assert long_crops.split_ratio == 6
        shapes = {
            size: tuple(long_crops(png(Image.new("L", size, BACKGROUND))).shape)
            for size in [(192, 32), (196, 32), (392, 64), (60, 32)]
        }
        assert shapes == {
            (192, 32): (1, 32, 128),
            (196, 32): (1, 32, 196),
            (392, 64): (1, 32, 196),
            (60, 32): (1, 32, 128),
        }  # stretched, or keeping its aspect padded to 128
    # A sliver is read at most 32 model widths long.
    assert long_crops(png(Image.new("L", (5000, 2), BACKGROUND))).shape == (1, 32, 32 * 128)


def test_an_lmdb_splits_into_the_samples_read_whole_and_the_long_ones_each_once(tmp_path):
    sizes = [(100, 32), (300, 32), (190, 32), (900, 48), (40, 32)]
    write_lmdb(
        tmp_path / "set", [(png(Image.new("L", size, BACKGROUND)), "ab") for size in sizes] + [(b"not an image", "ab")]
    )
    transform = ImageTransform(Preprocessing(32, 128))
    dataset = LmdbDataset(tmp_path / "set", CODEC, 33, transform)
    whole, long = split_long_samples(dataset, LongCropTransform(transform))
    assert whole.indices.tolist() == [1, 3, 5] and long.indices.tolist() == [2, 4, 6]
    assert [tuple(whole[i][0].shape) for i in range(3)] == [(1, 32, 128)] * 3
    assert [tuple(long[i][0].shape) for i in range(2)] == [(1, 32, 300), (1, 32, 600)] and long[2] is None


@pytest.fixture(scope="module")
def ink_reader(tmp_path_factory) -> Path:
    """A real checkpoint of a CRNN with one channel per layer and one LSTM unit, wired by hand: a frame
    reads "0" where its 12 pixel columns hold ink (darker than mid-grey), blank elsewhere, so the model
    reads one "0" per bar of ink the frames can tell apart."""
    config = load_config("crnn.yaml", ["model.hidden_size=1", "model.channels=[1,1,1,1,1,1,1]"])
    model = model_from_config(config.model, len(config.data.alphabet) + 1)
    with torch.no_grad():
        for layer in model.backbone:
            if isinstance(layer, nn.Conv2d):  # each passes its pixel on; the last (2 x 2, unpadded) adds its 2 rows
                layer.weight.zero_()
                if layer.padding[0]:
                    layer.weight[0, 0, 1, 1] = 1
                else:
                    layer.weight[0, 0, :, 0] = 1
            elif isinstance(layer, nn.BatchNorm2d):  # the identity
                layer.running_mean.zero_()
                layer.running_var.fill_(1 - layer.eps)
                layer.weight.fill_(1)
                layer.bias.zero_()
        model.backbone[1].weight.fill_(-1)  # the first BatchNorm: ink = 1 - pixel, which max-pooling keeps
        model.backbone[1].bias.fill_(1)
        for name, parameter in model.sequence[0].rnn.named_parameters():  # gates i, f, g, o, both directions
            parameter.zero_()
            if name.startswith("weight_ih"):
                parameter[2] = 10  # the cell's input: tanh(10 (ink - 1)), +1 on ink, -1 on paper
            elif name.startswith("bias_ih"):
                parameter.copy_(torch.tensor([10.0, -10.0, -10.0, 10.0]))  # input gate open, forget shut, output open
        classifier = model.sequence[0].linear
        classifier.weight.zero_()
        classifier.bias.fill_(-100)
        classifier.bias[:2] = 0
        classifier.weight[0], classifier.weight[1] = -5, 5  # blank on paper, "0" (class 1) on ink
    path = tmp_path_factory.mktemp("ink_reader") / "best.pt"
    save_checkpoint(
        path,
        weights_checkpoint(
            model, config, config.data.alphabet, Preprocessing.from_config(config), step=0, accuracy=None, world_size=1
        ),
    )
    return path


def ink_bars(count: int) -> bytes:
    """`count` black bars 12 pixels wide, 20 apart, on white, 32 pixels high (ink_reader reads "0" * count)."""
    return png(draw_bars([0] * count, bar=12, gap=20, margin=16))


@pytest.mark.slow
def test_predict_reads_long_crops_in_pieces_by_default_says_so_and_no_split_squashes_them(ink_reader, tmp_path):
    (tmp_path / "line.png").write_bytes(ink_bars(20))  # 652 pixels: 5 widths of 128
    (tmp_path / "word.png").write_bytes(ink_bars(3))  # 108 pixels

    def predict(*options: str) -> tuple[list[list[str]], str]:
        result = run_command(
            sys.executable,
            REPO / "scripts" / "predict.py",
            ink_reader,
            tmp_path,
            "--device",
            "cpu",
            "--precision",
            "fp32",
            *options,
            cwd=None,
            check=True,
        )
        return [line.split("\t")[:2] for line in result.stdout.splitlines()], result.stderr

    line, word = str(tmp_path / "line.png"), str(tmp_path / "word.png")
    note = "1 of 2 images were wider than 6:1 and were read in overlapping pieces; --no-split reads them squashed"
    in_pieces, stderr = predict()
    assert in_pieces == [[line, "0" * 20], [word, "000"]] and note in stderr
    squashed, stderr = predict("--no-split")
    assert squashed == [[line, "0"], [word, "000"]]  # 20 bars squashed into 128 pixels: one blot
    assert "pieces" not in stderr


@pytest.mark.slow
def test_eval_reads_long_crops_in_pieces_only_with_split_long(ink_reader, tmp_path):
    counts = [9, 3, 2, 4, 10]  # 9 and 10 bars: 300 and 332 pixels, more than 1.5 widths of 128
    write_lmdb(tmp_path / "bars", [(ink_bars(count), "0" * count) for count in counts])
    for mode, accuracy in (([], 0.6), (["--split-long"], 1.0)):
        results = tmp_path / "results.json"
        result = subprocess.run(
            [
                sys.executable,
                "scripts/eval.py",
                str(ink_reader),
                str(tmp_path / "bars"),
                "--workers",
                "0",
                "--precision",
                "fp32",
                "--json",
                str(results),
                *mode,
            ],
            cwd=REPO,
            env=run_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        note = "2 of 5 images were wider than 6:1 and were read in overlapping pieces (--split-long)"
        assert (note in result.stdout) == bool(mode), result.stdout
        row = json.loads(results.read_text())["sets"][0]
        assert (row["accuracy"], row["read_in_pieces"]) == (accuracy, 2 if mode else 0)
