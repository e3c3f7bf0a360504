"""A dtrb_vgg model handed back to EasyOCR as a custom recognizer: refused before anything is written when
EasyOCR could not run it as trained or would not load it under its name, written in EasyOCR's
custom-model layout (interop/peer_weights.py), then read back with EasyOCR itself beside the model.
scripts/export.py --format easyocr."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from data.codec import CTCCodec
from data.transforms import Preprocessing, build_transform
from interop.easyocr_reader import agreement_lines, compare_readings, easyocr_reader
from interop.peer_weights import easyocr_problems, write_easyocr_model
from training.config import Config

# EasyOCR's own recognizer names (easyocr/config.py): a custom model with one of them is not read.
EASYOCR_BUILT_IN = {
    "standard",
    "latin_g1",
    "zh_tra_g1",
    "zh_sim_g1",
    "japanese_g1",
    "korean_g1",
    "thai_g1",
    "devanagari_g1",
    "cyrillic_g1",
    "arabic_g1",
    "tamil_g1",
    "bengali_g1",
    "english_g2",
    "latin_g2",
    "zh_sim_g2",
    "japanese_g2",
    "korean_g2",
    "telugu_g2",
    "kannada_g2",
    "cyrillic_g2",
}
# Not 100 %: EasyOCR resizes a word narrower than high by another rule (docs/pretrained.md).
EASYOCR_AGREEMENT = 0.99


def check_easyocr_export(config: Config, preprocessing: Preprocessing, name: str) -> None:
    """Refuse, before anything is written, a model EasyOCR cannot run as trained or a name it would not load."""
    problems = easyocr_problems(config.model, preprocessing)
    if problems:
        raise ValueError("EasyOCR cannot run this model as it was trained: " + "; ".join(problems))
    if not name.isidentifier():  # EasyOCR imports user_network/NAME.py as a module
        suggestion = re.sub(r"\W", "_", name).lstrip("0123456789") or "my_model"
        raise ValueError(
            f"--name {name!r}: EasyOCR imports the network as a Python module, so the name must be an"
            f" identifier (letters, digits, _), e.g. --name {suggestion}"
        )
    if name in EASYOCR_BUILT_IN:
        raise ValueError(
            f"--name {name}: EasyOCR would load its own {name} instead; pick another, e.g. --name {name}_custom"
        )


def easyocr_verdict(records: list[dict[str, Any]]) -> list[str]:
    """compare_readings' `records` as report lines; the last is "check passed" or "check FAILED: ..."."""
    same = sum(record["ours"] == record["easyocr"] for record in records)
    passed = same >= EASYOCR_AGREEMENT * len(records)
    return agreement_lines(records) + [
        "check passed" if passed else f"check FAILED: under {EASYOCR_AGREEMENT:.0%} identical"
    ]


def hand_back(
    model: nn.Module,
    codec: CTCCodec,
    config: Config,
    preprocessing: Preprocessing,
    out: Path,
    name: str,
    languages: list[str],
    images: list[tuple[str, bytes]],
    origin: str,
    *,
    report: Callable[[str], None],
) -> bool:
    """Write the folder `out` in EasyOCR's custom-model layout under recog_network `name` (refused first by
    check_easyocr_export); when EasyOCR is here, read `images` (from `origin`) with it and with `model`.
    Each line of the report goes to `report` as it comes; False when the two read too few alike."""
    check_easyocr_export(config, preprocessing, name)
    write_easyocr_model(out, name, model.state_dict(), codec.alphabet, config.model, preprocessing, languages)
    report(
        f"exported easyocr to {out}: model/{name}.pth, user_network/{name}.py and {name}.yaml (imgH "
        f"{preprocessing.height}, {len(codec.alphabet)} characters); read with easyocr.Reader({languages},"
        f" recog_network={name!r}, model_storage_directory='{out / 'model'}', user_network_directory="
        f"'{out / 'user_network'}')"
    )
    if preprocessing.interpolation != "opencv_linear":
        report(
            f"note: the model was trained with {preprocessing.interpolation} resizing; EasyOCR resizes with cv2's "
            "bilinear (data.interpolation: opencv_linear), so some readings may differ"
        )
    if importlib.util.find_spec("easyocr") is None:
        report("EasyOCR is not installed: the export was not read back with it (pip install easyocr)")
        return True
    report(f"checking with EasyOCR on {origin}")
    reader = easyocr_reader(export_dir=out)
    # EasyOCR reads a word at its own width, however wide: so does the model here, up to 32:1 (what the
    # checkpoint's data.img_width caps in training and eval.sh, EasyOCR does not).
    uncapped = replace(preprocessing, width=max(preprocessing.width, 32 * preprocessing.height))
    lines = easyocr_verdict(compare_readings(reader, model, codec, build_transform(config, uncapped), images))
    for line in lines:
        report(line)
    return lines[-1] == "check passed"
