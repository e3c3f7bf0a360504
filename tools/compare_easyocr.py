"""Read the same images with a checkpoint (as predict.py does) and with EasyOCR's own recognizer, and
compare the texts. Needs `pip install easyocr`; runs offline.

    python tools/compare_easyocr.py pretrained/english_g2.pt datasets/synth/test --limit 1000 \\
        --easyocr-weights easyocr_en_models/models/english_g2.pth          # an imported EasyOCR model
    python tools/compare_easyocr.py runs/ft/best.pt datasets/synth/test --easyocr-export runs/ft/best_easyocr

Images are image files, folders, quoted globs or LMDB folders (their first --limit samples). EasyOCR reads
each image alone with its defaults (greedy decoding), except two, which are options here: its int8
quantization on the CPU (--quantize) and its second reading of unconfident images from a
contrast-stretched copy (--contrast-pass). Without them EasyOCR runs the float32 network the checkpoint
was converted from. Prints the share of identical texts and the differences; --json writes every reading.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from data.image_files import encoded_images
from data.transforms import build_transform
from interop.easyocr_reader import agreement_lines, compare_readings, easyocr_reader
from training.checkpoint import load_model
from utils import cli


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="this project's checkpoint (import_weights.py's output, or a trained one)")
    parser.add_argument("inputs", nargs="+", metavar="IMAGE|FOLDER|GLOB|LMDB")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--easyocr-weights", type=Path, help="one of EasyOCR's own models: its .pth (english_g2.pth)")
    source.add_argument("--easyocr-export", type=Path, help="a folder written by export.py --format easyocr")
    parser.add_argument("--limit", type=int, default=1000, help="compare on at most this many images (default 1000)")
    parser.add_argument("--quantize", action="store_true", help="EasyOCR's int8 quantization (its CPU default)")
    parser.add_argument(
        "--contrast-pass",
        action="store_true",
        help="EasyOCR's second reading of images read with confidence < 0.1 (its default)",
    )
    parser.add_argument("--json", type=Path, help="write every image's two readings here")
    args = parser.parse_args()
    if args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    return args


def main() -> int:
    args = parse_args()
    torch.set_grad_enabled(False)
    model, codec, config, preprocessing = load_model(args.checkpoint, "cpu")
    transform = build_transform(config, preprocessing)
    images = encoded_images(args.inputs, args.limit)
    reader = easyocr_reader(args.easyocr_weights, args.easyocr_export, args.quantize)
    records = compare_readings(reader, model, codec, transform, images, args.contrast_pass)
    print(
        f"EasyOCR: quantize {'on' if args.quantize else 'off'}, "
        f"contrast pass {'on' if args.contrast_pass else 'off'}"
    )
    print("\n".join(agreement_lines(records)))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1, ensure_ascii=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    cli.run(main)
