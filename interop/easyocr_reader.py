"""EasyOCR's own recognizer, run offline beside this project's reading of the same images.

EasyOCR (`pip install easyocr`) is optional: only tools/compare_easyocr.py and
`scripts/export.py --format easyocr` use it, to show that a converted model reads what EasyOCR reads.
Both sides get the same 8-bit grey pixels (decoded here once), so what differs is what each does
after: its resize (the same as data.interpolation: opencv_linear, but for words narrower than high),
its padding, and float arithmetic.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from data.codec import CTCCodec
from data.transforms import ImageTransform
from evaluation.evaluate import read_images

# EasyOCR's default for `recognize`: a reading less confident than this is read again from a
# contrast-stretched copy, and the more confident of the two is kept.
EASYOCR_CONTRAST_THRESHOLD = 0.1


def require_easyocr() -> None:
    if importlib.util.find_spec("easyocr") is None:
        raise ValueError(
            "EasyOCR is not installed here: pip install easyocr (it brings opencv-python-headless and "
            "scikit-image; keep the torch this project uses)"
        )


def easyocr_reader(weights: Path | None = None, export_dir: Path | None = None, quantize: bool = False) -> Any:
    """An EasyOCR Reader with the recognizer only, downloads disabled: either one of EasyOCR's own models
    from its weights file (`english_g2.pth`: the model is named after the file), or a folder written by
    `export.py --format easyocr` (`model/NAME.pth`, `user_network/NAME.py` and `NAME.yaml`).

    `quantize`: EasyOCR's CPU default (int8 dynamic quantization of the LSTMs and linear layers); off,
    the recognizer computes in float32 as the source model does.
    """
    require_easyocr()
    import easyocr
    import yaml

    if export_dir is not None:
        [config] = sorted((export_dir / "user_network").glob("*.yaml"))
        languages = yaml.safe_load(config.read_text(encoding="utf-8"))["lang_list"]
        return easyocr.Reader(
            languages,
            gpu=False,
            model_storage_directory=str(export_dir / "model"),
            user_network_directory=str(export_dir / "user_network"),
            recog_network=config.stem,
            detector=False,
            download_enabled=False,
            quantize=quantize,
            verbose=False,
        )
    if weights is None or not weights.is_file():
        raise FileNotFoundError(f"EasyOCR weights {weights} do not exist")
    # EasyOCR creates a user-network folder even for its own models (in the home folder by default) and
    # needs it only while it starts.
    with tempfile.TemporaryDirectory(prefix="easyocr-user-network-") as networks:
        return easyocr.Reader(
            ["en"],
            gpu=False,
            model_storage_directory=str(weights.parent),
            user_network_directory=networks,
            recog_network=weights.stem,
            detector=False,
            download_enabled=False,
            quantize=quantize,
            verbose=False,
        )


@torch.inference_mode()
def compare_readings(
    reader: Any,
    model: nn.Module,
    codec: CTCCodec,
    transform: ImageTransform,
    images: list[tuple[str, bytes]],
    contrast_pass: bool = False,
) -> list[dict[str, Any]]:
    """One record per decodable image: its name, this project's text and confidence, EasyOCR's.

    EasyOCR reads each image alone (its CPU behaviour); `contrast_pass` keeps its second reading of
    unconfident images, which is not part of the network.
    """
    if transform.mode != "L":
        raise ValueError(f"EasyOCR reads grey images; this model reads {transform.mode}")
    records = []
    for name, image_bytes in images:
        image = transform.decode(image_bytes)  # 8-bit grey: the same pixels for both
        pixels = np.asarray(image)
        [ours] = read_images(model, [transform.to_tensor(image)], torch.device("cpu"), codec.decode)
        found = reader.recognize(
            pixels,
            decoder="greedy",
            batch_size=1,
            detail=1,
            contrast_ths=EASYOCR_CONTRAST_THRESHOLD if contrast_pass else 0.0,
        )
        theirs, their_confidence = (found[0][1], float(found[0][2])) if found else ("", 0.0)
        records.append(
            {
                "image": name,
                "ours": ours.text,
                "our_confidence": ours.confidence,
                "easyocr": theirs,
                "easyocr_confidence": their_confidence,
            }
        )
    return records


def agreement_lines(records: list[dict[str, Any]], shown: int = 20) -> list[str]:
    """The share of identical texts, then the differing ones."""
    differing = [record for record in records if record["ours"] != record["easyocr"]]
    same = len(records) - len(differing)
    lines = [f"texts identical to EasyOCR's: {same} of {len(records)} ({100 * same / max(len(records), 1):.2f} %)"]
    lines += [
        f"  differs: {r['image']}: ours {r['ours']!r} ({r['our_confidence']:.3f}), EasyOCR {r['easyocr']!r}"
        f" ({r['easyocr_confidence']:.3f})"
        for r in differing[:shown]
    ]
    if len(differing) > shown:
        lines.append(f"  ... and {len(differing) - shown} more")
    return lines
