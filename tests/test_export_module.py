"""interop/'s export modules called directly, on real models and real files: the int8 ONNX model and its
accuracy gate (interop/int8.py) and the EasyOCR hand-back (interop/easyocr_export.py). tests/test_export.py
runs the same through scripts/export.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import yaml

from data.codec import CTCCodec
from data.image_files import encoded_images
from data.transforms import Preprocessing
from interop.easyocr_export import easyocr_verdict, hand_back
from interop.export import check_images, export_and_check, onnx_runner
from interop.int8 import compare_int8, export_int8, int8_path, labelled_images
from interop.peer_weights import EASYOCR_ENGLISH_G2, FORMATS, convert_state_dict, imported_config, model_settings
from models import model_from_config
from tests.conftest import ALPHABET
from tests.test_export import op_types
from tests.test_peer_weights import dtrb_state_dict
from training.checkpoint import load_checkpoint, load_model
from training.config import Config


@pytest.fixture(scope="module")
def float_onnx(checkpoint, tmp_path_factory) -> tuple[Path, CTCCodec, Preprocessing]:
    """The checkpoint's model as ONNX, written and checked against PyTorch by export_and_check, in a folder of its
    own; with the codec and preprocessing it reads by."""
    pytest.importorskip("onnxruntime")
    model, codec, config, preprocessing = load_model(checkpoint, "cpu")
    out = tmp_path_factory.mktemp("int8") / "crnn.onnx"
    images, origin = check_images(None, codec.alphabet, 2)
    lines: list[str] = []
    assert export_and_check(model, codec, config, preprocessing, "onnx", out, images, origin, 1e-3, report=lines.append)
    assert lines[-1] == "check passed"
    return out, codec, preprocessing


def run_gate(float_onnx, synth: Path, max_drop: float, mode: str = "dynamic") -> tuple[bool, list[str]]:
    """export_int8 on the val set's 33 labelled images (static: calibrated on the train set's 96); whether
    it wrote the int8 model, and its report."""
    out, codec, preprocessing = float_onnx
    calibration = encoded_images([str(synth / "train")], 256) if mode == "static" else []
    images = labelled_images([str(synth / "val")], codec.alphabet, 1000)
    lines: list[str] = []
    passed = export_int8(
        out,
        codec,
        preprocessing,
        images,
        calibration,
        mode=mode,
        metric_mode="benchmark",
        max_drop=max_drop,
        speed=False,
        report=lines.append,
    )
    return passed, lines


@pytest.mark.slow  # exports with torch.export and quantizes three times
def test_the_int8_gate_refuses_a_drop_above_its_bound_leaving_no_file_and_accepts_one_at_it(float_onnx, synth):
    out, codec, preprocessing = float_onnx
    target = int8_path(out)
    passed, lines = run_gate(float_onnx, synth, max_drop=100.0)
    assert passed and lines[-1] == f"int8 check passed: wrote {target} ({target.stat().st_size / 1e6:.1f} MB)"
    assert lines[0].startswith("quantized to int8 (dynamic) in ")
    assert lines[0].endswith("; comparing with the float model on 33 images")
    # Dynamic quantization: the LSTM and the classifier read int8 weights, the convolutions stay float.
    assert {"DynamicQuantizeLSTM", "MatMulInteger"} <= op_types(target)
    assert not {"LSTM", "MatMul", "ConvInteger"} & op_types(target)
    images = labelled_images([str(synth / "val")], codec.alphabet, 1000)
    comparison = compare_int8(onnx_runner(out), onnx_runner(target), codec, images, preprocessing, "benchmark")
    assert comparison.images == comparison.scored == 33
    drop = comparison.accuracy_drop  # the same file quantized again reads the same: the drop repeats
    target.unlink()

    passed, lines = run_gate(float_onnx, synth, max_drop=drop - 0.01)
    assert not passed
    assert lines[-1].startswith(f"int8 check FAILED: word accuracy fell {drop:.2f} points (float ")
    assert lines[-1].endswith(
        f"on 33 labelled images), more than --max-accuracy-drop {drop - 0.01:g}; no int8 file written (raise"
        " --max-accuracy-drop to accept it)"
    )
    assert [path.name for path in out.parent.iterdir()] == ["crnn.onnx"]  # no int8 file, no temporary folder

    passed, lines = run_gate(float_onnx, synth, max_drop=drop)
    assert passed and target.is_file()
    target.unlink()


@pytest.mark.slow  # exports with torch.export and calibrates
def test_static_int8_calibrates_the_convolutions_and_a_refusal_names_the_dynamic_fallback(float_onnx, synth):
    out, _, _ = float_onnx
    passed, lines = run_gate(float_onnx, synth, max_drop=100.0, mode="static")
    assert passed and lines[0].startswith("quantized to int8 (static, calibrated on 96 images) in ")
    assert {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLSTM", "MatMulInteger"} <= op_types(int8_path(out))
    int8_path(out).unlink()

    passed, lines = run_gate(float_onnx, synth, max_drop=-1.0, mode="static")
    assert not passed and lines[-1].endswith("(raise --max-accuracy-drop to accept it, or try --int8 dynamic)")
    assert [path.name for path in out.parent.iterdir()] == ["crnn.onnx"]


def test_calibration_images_come_from_an_lmdb_this_process_already_reads(synth):
    """An LMDB the process holds open (a loader's shared environment) is read through it: py-lmdb refuses a
    second opening of the file in one process ("already open"), which failed int8 calibration in the suite."""
    from data.lmdb_env import shared_lmdb

    shared_lmdb(synth / "train")
    images = encoded_images([str(synth / "train")], 5)
    assert [name for name, _ in images] == [f"{synth / 'train'}#{index}" for index in range(1, 6)]
    assert all(image.startswith(b"\xff\xd8") for _, image in images)  # the generator's JPEGs


@pytest.mark.slow  # exports with torch.export
def test_calibration_images_that_cannot_be_decoded_stop_int8_before_anything_is_written(float_onnx, tmp_path):
    out, codec, preprocessing = float_onnx
    (tmp_path / "broken.png").write_bytes(b"not a PNG")
    with pytest.raises(ValueError) as raised:
        export_int8(
            out,
            codec,
            preprocessing,
            labelled_images(None, codec.alphabet, 2),
            encoded_images([str(tmp_path / "broken.png")], 256),
            mode="static",
            metric_mode="benchmark",
            max_drop=1.0,
            speed=False,
            report=print,
        )
    assert str(raised.value) == "none of the --calibrate images could be decoded: give images Pillow reads"
    assert [path.name for path in out.parent.iterdir()] == ["crnn.onnx"]


def imported_g2(tmp_path: Path) -> tuple[dict[str, torch.Tensor], torch.nn.Module, CTCCodec, Config, Preprocessing]:
    """A small EasyOCR generation-2 checkpoint (EasyOCR's own key names, `module.` included, written out in
    tests/test_peer_weights.py) and the dtrb_vgg model, codec, config and preprocessing it imports as."""
    source = dtrb_state_dict(channels=64, hidden=16, classes=len(EASYOCR_ENGLISH_G2) + 1)
    torch.save(source, tmp_path / "g2.pth")
    peer = FORMATS["easyocr"]
    stripped = load_checkpoint(tmp_path / "g2.pth")["model"]  # `module.` stripped, as import_weights.py reads it
    config = imported_config(peer, model_settings(peer, stripped), EASYOCR_ENGLISH_G2, False)
    model = model_from_config(config.model, len(EASYOCR_ENGLISH_G2) + 1)
    model.load_state_dict(convert_state_dict(peer, stripped, model.state_dict())[0])
    return source, model, CTCCodec(EASYOCR_ENGLISH_G2), config, Preprocessing.from_config(config)


def test_the_easyocr_hand_back_writes_the_source_tensors_under_easyocrs_names_and_settings(tmp_path):
    source, model, codec, config, preprocessing = imported_g2(tmp_path)
    out = tmp_path / "handed"
    images, origin = check_images(None, ALPHABET, 2)
    lines: list[str] = []
    passed = hand_back(model, codec, config, preprocessing, out, "my_g2", ["en"], images, origin, report=lines.append)
    assert lines[0].startswith(f"exported easyocr to {out}: model/my_g2.pth, user_network/my_g2.py and my_g2.yaml")
    if importlib.util.find_spec("easyocr") is None:
        assert passed and lines[-1] == (
            "EasyOCR is not installed: the export was not read back with it (pip install easyocr)"
        )

    weights = torch.load(out / "model" / "my_g2.pth", weights_only=True)
    assert weights.keys() == source.keys()  # `module.` included: EasyOCR cuts 7 characters off every key
    for key, value in source.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=0)
    settings = yaml.safe_load((out / "user_network" / "my_g2.yaml").read_text(encoding="utf-8"))
    assert settings == {
        "network_params": {"input_channel": 1, "output_channel": 64, "hidden_size": 16},
        "imgH": 64,
        "lang_list": ["en"],
        "character_list": EASYOCR_ENGLISH_G2,
    }
    assert "from easyocr.model.vgg_model import Model" in (out / "user_network" / "my_g2.py").read_text()


@pytest.mark.parametrize(
    "name, message",
    [
        (
            "my-g2",
            "--name 'my-g2': EasyOCR imports the network as a Python module, so the name must be an identifier"
            " (letters, digits, _), e.g. --name my_g2",
        ),
        (
            "english_g2",
            "--name english_g2: EasyOCR would load its own english_g2 instead; pick another, e.g. --name"
            " english_g2_custom",
        ),
    ],
)
def test_the_easyocr_hand_back_refuses_a_name_easyocr_would_not_load_before_writing(name, message, tmp_path):
    _, model, codec, config, preprocessing = imported_g2(tmp_path)
    with pytest.raises(ValueError) as raised:
        hand_back(model, codec, config, preprocessing, tmp_path / "out", name, ["en"], [], "", report=print)
    assert str(raised.value) == message
    assert not (tmp_path / "out").exists()


def test_the_easyocr_hand_back_refuses_a_model_easyocr_cannot_run_as_trained(checkpoint, tmp_path):
    model, codec, config, preprocessing = load_model(checkpoint, "cpu")
    with pytest.raises(ValueError) as raised:
        hand_back(model, codec, config, preprocessing, tmp_path / "out", "mine", ["en"], [], "", report=print)
    assert str(raised.value).startswith(
        "EasyOCR cannot run this model as it was trained: the architecture is crnn; EasyOCR's custom networks"
    )
    assert "stretched up to 2x (data.max_stretch)" in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_the_easyocr_check_passes_at_99_percent_identical_texts_and_fails_below():
    def records(differing: int) -> list[dict]:
        return [
            {
                "image": f"word{index}",
                "ours": "word",
                "our_confidence": 0.9,
                "easyocr": "ward" if index < differing else "word",
                "easyocr_confidence": 0.8,
            }
            for index in range(100)
        ]

    assert easyocr_verdict(records(1))[0] == "texts identical to EasyOCR's: 99 of 100 (99.00 %)"
    assert easyocr_verdict(records(1))[-1] == "check passed"
    failed = easyocr_verdict(records(2))
    assert failed[1] == "  differs: word0: ours 'word' (0.900), EasyOCR 'ward' (0.800)"
    assert failed[-1] == "check FAILED: under 99% identical"
