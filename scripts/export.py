"""Export a checkpoint to ONNX or a torch.export program with a dynamic batch and width, then check it
against PyTorch; quantize the ONNX model to int8 for CPUs, gated on the accuracy it costs; or hand a
dtrb_vgg model to EasyOCR as a custom recognizer, checked with EasyOCR.

    python scripts/export.py runs/crnn/best.pt --format onnx                  # -> runs/crnn/best.onnx
    python scripts/export.py runs/crnn/best.pt --format pt2                   # -> runs/crnn/best.pt2
    python scripts/export.py runs/crnn/best.pt --format onnx --out crnn.onnx --check datasets/synth/val 'scans/*.png'
    python scripts/export.py runs/ft/best.pt --format easyocr                 # -> runs/ft/best_easyocr/
    python scripts/export.py runs/crnn/best.pt --format onnx --int8 dynamic --check datasets/synth/test
                                                                  # -> runs/crnn/best.onnx and best.int8.onnx
    python scripts/export.py runs/crnn/best.pt --format onnx --int8 static --calibrate datasets/synth/train \
        --check datasets/synth/test --max-accuracy-drop 0.5 --speed

The exported model takes `images` [B, C, H, W], float32, as data.transforms.ImageTransform makes them
from the checkpoint's preprocessing record (H is its height; B and W >= 8 are free), and returns `logits`
[B, T, classes] with T = W/4 + 1 frames (26 for W = 100); greedy CTC decoding (data.codec.CTCCodec.decode)
turns them into text: class 0 is the blank, class i the alphabet's i-th character. The alphabet and the
preprocessing travel inside the file as JSON (ONNX: metadata_props["crnn"]; .pt2: the extra file
"crnn.json", read by torch.export.load(path, extra_files={"crnn.json": ""})).

The check runs the exported model and the PyTorch model on the same images (`--check`: image files,
folders, globs or LMDB folders; by default a few images rendered by scripts/make_synthetic.py): all
of them as one batch at the checkpoint's width and at twice it, and each alone at its own width. It
prints the largest absolute difference of the logits and whether the decoded texts are identical, and
exits 1 when a text differs or the difference exceeds --tolerance. ONNX needs `onnx` and `onnxscript`
and, for the check, `onnxruntime` (pip install -r requirements-export.txt); without onnxruntime the
check is skipped with a message. The .pt2 format needs only torch.

--int8 dynamic|static (ONNX only, with onnxruntime) also writes NAME.int8.onnx beside the ONNX file,
made by onnxruntime.quantization from the float file once it has passed its check. Both quantize the
LSTM and the classifier dynamically (int8 weights; activations quantized as they come); static also
quantizes the convolutions, with activation ranges calibrated on the --calibrate images. The int8
model then reads the --check images (up to --int8-check-limit, default 1000; by default rendered
ones) at the checkpoint's width beside the float model: the report gives the share of decoded texts
they agree on and, on labelled images (LMDB samples, rendered images), both word accuracies under
--metric-mode. The int8 file is moved into place only when its accuracy is at most
--max-accuracy-drop points (default 1.0) below float's; with no labelled image, only when at most
that percentage of the texts differ (a bound on the accuracy it can cost). Otherwise the script exits
1 and leaves no int8 file. --speed times the ONNX model (and the int8 one, taking turns) at batch
sizes 1 and 64 and prints images/s and the file sizes.

--format easyocr writes EasyOCR's custom-model layout into a folder: model/NAME.pth (the weights under
EasyOCR's names, `module.` included, as EasyOCR expects), user_network/NAME.py (EasyOCR's own
generation-2 network) and user_network/NAME.yaml (network_params, imgH, lang_list, character_list).
Only a dtrb_vgg model fed grey, aspect-kept, 0.5/0.5-normalised images can be handed over. Read it with

    easyocr.Reader(["en"], recog_network=NAME, model_storage_directory=FOLDER/model,
                   user_network_directory=FOLDER/user_network)

When EasyOCR is installed, the check reads the check images with that Reader (float32, no contrast
pass) and with the checkpoint, and exits 1 when fewer than 99 % of the texts are identical.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from pathlib import Path

from data.image_files import encoded_images
from evaluation.metrics import METRIC_MODES
from interop.easyocr_export import hand_back
from interop.export import check_images, export_and_check
from interop.int8 import CALIBRATION_IMAGES, INT8_MODES, export_int8, int8_path, labelled_images, speed_lines
from training.checkpoint import load_model
from training.config import ConfigFileOption, load_config
from utils import cli
from utils.atomic_write import check_writable

SUFFIXES = {"onnx": ".onnx", "pt2": ".pt2", "easyocr": "_easyocr"}


def finite_float(text: str) -> float:
    """A number a difference is compared with: nan would make every comparison false, so every check pass."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def parse_args() -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args()
    check_options(parser, args)
    return args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint of train.py, or a bare state dict with --config")
    # --help lists the options in the order they are added.
    add_output_options(parser)
    add_check_options(parser)
    parser.add_argument(
        "--config",
        action=ConfigFileOption,
        help="model and alphabet for a bare state dict (YAML, or a name in configs/)",
    )
    add_int8_options(parser)
    parser.add_argument(
        "--speed",
        action="store_true",
        help="onnx: time the ONNX model (and the int8 one) at batch sizes 1 and 64 and print images/s",
    )
    return parser


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """What is written, and where; EasyOCR's name and languages for it."""
    # Checked by check_options rather than by `choices`, so that the old "torchscript" can be told what replaced it.
    parser.add_argument("--format", required=True, metavar="{" + ",".join(sorted(SUFFIXES)) + "}")
    parser.add_argument(
        "--out",
        type=Path,
        help="output file, or folder for easyocr (default: the checkpoint's name with .onnx / .pt2 / _easyocr)",
    )
    parser.add_argument("--name", help="easyocr: the model's name, recog_network=NAME (default: the checkpoint's)")
    parser.add_argument("--lang", nargs="+", help="easyocr: its lang_list (default: en)")


def add_check_options(parser: argparse.ArgumentParser) -> None:
    """The images the export is compared with PyTorch on, and the difference it may show."""
    parser.add_argument(
        "--check",
        nargs="+",
        metavar="IMAGE|FOLDER|GLOB|LMDB",
        help="images to compare on (default: rendered by scripts/make_synthetic.py)",
    )
    parser.add_argument("--check-limit", type=int, default=32, help="compare on at most this many images (default 32)")
    parser.add_argument(
        "--tolerance", type=finite_float, default=1e-3, help="max abs logit difference allowed (default 1e-3)"
    )


def add_int8_options(parser: argparse.ArgumentParser) -> None:
    """The int8 ONNX model: how it is quantized, and the accuracy gate it must pass to be written."""
    parser.add_argument(
        "--int8",
        choices=INT8_MODES,
        help="onnx: also write an int8 model for CPUs beside --out (NAME.int8.onnx), if it passes the accuracy gate",
    )
    parser.add_argument(
        "--calibrate",
        nargs="+",
        metavar="IMAGE|FOLDER|GLOB|LMDB",
        help=f"--int8 static: images like those the model will read (at most {CALIBRATION_IMAGES}),"
        " to set the activations' int8 ranges; keep them apart from --check",
    )
    parser.add_argument(
        "--max-accuracy-drop",
        type=finite_float,
        default=1.0,
        metavar="POINTS",
        help="--int8: refuse the int8 model when its word accuracy on --check's labelled images is"
        " lower than the float model's by more than this (default 1.0 percentage point)",
    )
    parser.add_argument(
        "--int8-check-limit",
        type=int,
        default=1000,
        help="--int8: compare int8 with float on at most this many images (default 1000)",
    )
    parser.add_argument(
        "--metric-mode",
        default="benchmark",
        choices=METRIC_MODES,
        help="--int8: how a reading is compared with its label (evaluation/metrics.py; default"
        " benchmark, for [0-9a-z] models; ignore_case_symbols for larger alphabets)",
    )


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What `parser` alone does not refuse: out-of-range values, and options that need, or exclude, others."""
    if args.format == "torchscript":  # torch deprecated TorchScript
        raise ValueError(
            "--format torchscript was replaced by --format pt2: a torch.export program, loaded with"
            " torch.export.load"
        )
    if args.format not in SUFFIXES:
        parser.error(f"argument --format: invalid choice: {args.format!r} (choose from {', '.join(sorted(SUFFIXES))})")
    check_out_suffix(args.format, args.out)
    if args.check_limit < 1:
        parser.error(f"--check-limit must be >= 1, got {args.check_limit}")
    if args.tolerance < 0:
        parser.error(f"--tolerance must be >= 0, got {args.tolerance}")
    if args.format != "easyocr" and (args.name or args.lang):
        raise ValueError(
            f"--{'name' if args.name else 'lang'} is for --format easyocr; --format {args.format} has no"
            " name or language list"
        )
    if (args.int8 or args.speed) and args.format != "onnx":
        parser.error(
            f"--{'int8' if args.int8 else 'speed'} needs --format onnx: int8 models and the timing run under"
            " onnxruntime"
        )
    if args.int8 == "static" and not args.calibrate:
        parser.error(
            "--int8 static needs --calibrate IMAGE|FOLDER|GLOB|LMDB: images like those the model will read"
            " (e.g. its training LMDB), to set the int8 ranges of the convolutions' inputs"
        )
    if args.calibrate and args.int8 != "static":
        parser.error("--calibrate is for --int8 static; --int8 dynamic needs no calibration images")
    if args.int8_check_limit < 1:
        parser.error(f"--int8-check-limit must be >= 1, got {args.int8_check_limit}")


def check_out_suffix(export_format: str, out: Path | None) -> None:
    """--out is named like what --format writes, so that no tool (nor person) takes the file for another
    format's: an ONNX file ends in .onnx, a torch.export program in .pt2, the EasyOCR folder in neither."""
    if out is None:
        return
    suffix = out.suffix.lower()
    format_of_suffix = {wanted: name for name, wanted in SUFFIXES.items() if wanted.startswith(".")}
    other = f", or --format {format_of_suffix[suffix]}" if suffix in format_of_suffix else ""
    if export_format == "easyocr" and suffix in format_of_suffix:
        raise ValueError(
            f"--format easyocr and --out {out} disagree: easyocr writes a folder, not a {suffix} file; "
            f"give a folder, e.g. --out {out.with_suffix('')}_easyocr"
            f"{other}"
        )
    if export_format != "easyocr" and suffix != SUFFIXES[export_format]:
        raise ValueError(
            f"--format {export_format} and --out {out} disagree: the {export_format} file's name must end "
            f"in {SUFFIXES[export_format]}; give e.g. --out {out.with_suffix(SUFFIXES[export_format])}"
            f"{other}"
        )


def output_path(checkpoint: Path, export_format: str, out: Path | None) -> Path:
    """`out`, or the checkpoint's name with the format's suffix, with its folder made and found writable
    (now, not after the export)."""
    out = out or checkpoint.with_name(checkpoint.stem + SUFFIXES[export_format])
    if out.resolve() == checkpoint.resolve():
        raise ValueError(f"--out {out} is the checkpoint itself")
    out.parent.mkdir(parents=True, exist_ok=True)
    check_writable(out / "model" if export_format == "easyocr" else out, f"--out {out}")  # easyocr: a folder
    return out


def check_onnx_packages(args: argparse.Namespace) -> None:
    """--format onnx's packages are installed, and onnxruntime where --int8 or --speed runs the model."""
    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(f"--format onnx needs {' and '.join(missing)}: pip install -r requirements-export.txt")
    if (args.int8 or args.speed) and importlib.util.find_spec("onnxruntime") is None:
        raise ValueError(
            f"--{'int8' if args.int8 else 'speed'} needs onnxruntime: pip install -r" " requirements-export.txt"
        )


def main() -> int:
    args = parse_args()
    config = load_config(args.config, []) if args.config else None
    model, codec, config, preprocessing = load_model(args.checkpoint, "cpu", config)
    checkpoint = Path(args.checkpoint)
    out = output_path(checkpoint, args.format, args.out)
    # The images are read before exporting: a bad path fails in a second, not after the export.
    images, origin = check_images(args.check, codec.alphabet, args.check_limit)
    if args.int8:
        int8_images = labelled_images(args.check, codec.alphabet, args.int8_check_limit)
        calibration = encoded_images(args.calibrate, CALIBRATION_IMAGES) if args.calibrate else []
    if args.format == "easyocr":
        name, languages = args.name or checkpoint.stem, args.lang or ["en"]
        passed = hand_back(model, codec, config, preprocessing, out, name, languages, images, origin, report=print)
        return 0 if passed else 1
    if args.format == "onnx":
        check_onnx_packages(args)
        if args.int8:  # a stale int8 file of an earlier export must not pass for this model's
            int8_path(out).unlink(missing_ok=True)
    if not export_and_check(
        model, codec, config, preprocessing, args.format, out, images, origin, args.tolerance, report=print
    ):
        return 1  # no int8 model is made from a float model that failed
    if args.int8:
        passed = export_int8(
            out,
            codec,
            preprocessing,
            int8_images,
            calibration,
            mode=args.int8,
            metric_mode=args.metric_mode,
            max_drop=args.max_accuracy_drop,
            speed=args.speed,
            report=print,
        )
        return 0 if passed else 1
    if args.speed:
        print("\n".join(speed_lines({"float": out}, images, preprocessing)))
    return 0


if __name__ == "__main__":
    cli.run(main)
