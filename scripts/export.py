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
import io
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram
from torch.export._patches import register_lstm_while_loop_decomposition

from data.codec import CTCCodec
from data.image_files import encoded_images
from data.lmdb_env import lmdb_for_scan, read_num_samples
from data.lmdb_keys import image_key, read_label
from data.transforms import ImageTransform, Preprocessing, build_transform, image_size
from evaluation.metrics import METRIC_MODES, compared_form
from interop.easyocr_reader import agreement_lines, compare_readings, easyocr_reader
from interop.peer_weights import easyocr_problems, write_easyocr_model
from models import output_frames
from synthetic.render import build_plan, render_sample
from training.checkpoint import load_model
from training.config import Config, ConfigFileOption, load_config
from utils import cli
from utils.atomic_write import write_bytes_atomically

SUFFIXES = {"onnx": ".onnx", "pt2": ".pt2", "easyocr": "_easyocr"}
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
# The lowest opset torch.onnx's torch.export-based exporter has implementations for: a lower one is
# reached only by converting its graph afterwards. onnxruntime reads it from 1.14 on.
ONNX_OPSET = 18
RENDERED_IMAGES = 6
# The exported width axis starts at 8 px (the CRNN's 3 frames), or wider where the model would emit a
# single frame there (dtrb_vgg: 12 px): a size-1 axis, here the CRNN's after its second pooling at 4 to 7
# px, is a case torch.export will not trace into the same program (a contiguity check treats it apart).
# Own-width check inputs are clamped to the same range.
MIN_WIDTH, MAX_WIDTH = 8, 1024
Runner = Callable[[Tensor], Tensor]  # images [B, C, H, W] -> logits [B, T, classes], on the CPU

INT8_MODES = ("dynamic", "static")
# What onnxruntime.quantization turns into int8, by op type. Both recipes quantize the LSTM
# (DynamicQuantizeLSTM) and the classifier (MatMulInteger) dynamically: the LSTM is most of a CRNN's
# time on a CPU. Convolutions only statically (QDQ, with ranges calibrated on images): onnxruntime's
# dynamic ConvInteger ran slower than the float convolutions (docs/prediction-and-export.md).
DYNAMIC_OP_TYPES = ["LSTM", "MatMul"]
STATIC_OP_TYPES = ["Conv"]
CALIBRATION_IMAGES = 256
# Images per run when the float and int8 models read the gate's images, and per calibration run.
INT8_BATCH = 64
SPEED_BATCHES = (1, 64)
# Many short rounds rather than a few long ones: a round's ratio compares runs a fraction of a second
# apart, which the other jobs of a shared machine hardly change.
SPEED_ROUNDS = 15
SPEED_SECONDS = 0.2  # each model's share of a round, set from its warm-up run


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
    """`out`, or the checkpoint's name with the format's suffix, with its folder made."""
    out = out or checkpoint.with_name(checkpoint.stem + SUFFIXES[export_format])
    if out.resolve() == checkpoint.resolve():
        raise ValueError(f"--out {out} is the checkpoint itself")
    out.parent.mkdir(parents=True, exist_ok=True)
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


def metadata(codec: CTCCodec, preprocessing: Preprocessing) -> dict[str, str]:
    """What a runtime needs besides the weights: the alphabet and how to make the input."""
    description = {
        "alphabet": codec.alphabet,
        "blank": 0,
        "fold_case": codec.fold_case,
        "preprocessing": preprocessing.to_dict(),
        "input": "images [B, C, H, W]: (pixels / 255 - mean) / std after the preprocessing's resize",
        "output": "logits [B, T, classes], T frames from W pixels (the CRNN's W / 4 + 1); greedy CTC" " decoding",
    }
    return {"crnn": json.dumps(description, ensure_ascii=False)}


def narrowest_width(model: nn.Module, preprocessing: Preprocessing) -> int:
    """The narrowest width, from MIN_WIDTH on, at which the model emits more than one frame."""
    width = MIN_WIDTH
    while output_frames(model, preprocessing.channels, preprocessing.height, width) < 2:
        width += 1
    return width


def export(
    model: nn.Module, example: Tensor, export_format: str, out: Path, extra: dict[str, str], min_width: int
) -> None:
    """Write `model` to `out` as `export_format`, traced on `example` [B, C, H, W] with B and W left free."""
    # torch.export keeps nn.LSTM as one aten.lstm op (ONNX: an LSTM node), but works out its output
    # shape by unrolling it over the example's frames, which would freeze T at 26. torch's while_loop
    # version of that shape rule keeps T symbolic: private, but what torch.onnx itself turns on for
    # dynamic shapes. torch.onnx does so only while capturing, not while it decomposes the program
    # again (there T froze in a Reshape; pytorch/pytorch#193192), so it is held across both steps here.
    with register_lstm_while_loop_decomposition():
        program = torch.export.export(
            model, (example,), dynamic_shapes=({0: Dim("batch"), 3: Dim("width", min=min_width)},)
        )
        serialized = io.BytesIO()
        if export_format == "onnx":
            export_onnx(program, serialized, extra)
        else:
            torch.export.save(program, serialized, extra_files={"crnn.json": extra["crnn"]})
    # Serialized in memory, then written whole: torch.export.save's own writer turns a failed write (a
    # full disk) into "unexpected pos 64 vs 0", without a file name, and aborts the interpreter at exit.
    write_bytes_atomically(out, serialized.getvalue())


def export_onnx(program: ExportedProgram, out: io.BytesIO, extra: dict[str, str]) -> None:
    import onnx  # optional: requirements-export.txt

    # The axis names only name the program's free axes in the file; verbose=False keeps torch.onnx's
    # progress lines out of the report on stdout.
    onnx_program = torch.onnx.export(
        program,
        dynamo=True,
        opset_version=ONNX_OPSET,
        input_names=["images"],
        output_names=["logits"],
        dynamic_shapes=({0: "batch", 3: "width"},),
        verbose=False,
    )
    proto = onnx_program.model_proto
    onnx.checker.check_model(proto)
    onnx.helper.set_model_props(proto, extra)
    onnx.save(proto, out)


def onnx_runner(path: Path) -> Runner | None:
    """onnxruntime on the CPU, or None when it is not installed."""
    # Asked of the installation, not inferred from an ImportError: an onnxruntime that is installed but
    # fails to import (or a Ctrl-C while it imports, which its C extension reraises as an ImportError)
    # must not pass for "not installed".
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # respect OMP_NUM_THREADS, like torch
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda images: torch.from_numpy(session.run(["logits"], {"images": images.numpy()})[0])


def pt2_runner(path: Path) -> Runner:
    return torch.export.load(path).module()


def check_images(sources: list[str] | None, alphabet: str, limit: int) -> tuple[list[tuple[str, bytes]], str]:
    """Up to `limit` (name, encoded image) pairs to check on, and where they come from."""
    if not sources:
        plan, _ = build_plan(alphabet, max_length=10)
        images = [
            (f"rendered-{index}", render_sample(plan, 0, "export-check", index).image)
            for index in range(min(RENDERED_IMAGES, limit))
        ]
        return images, "images rendered by scripts/make_synthetic.py"
    images = encoded_images(sources, limit)
    return images, f"images from {', '.join(sources)}"


def reads_single_images(exported: Runner, preprocessing: Preprocessing, min_width: int) -> bool:
    """Whether the exported program takes a batch of one image. torch.export's LSTM decomposition
    specialises a batch of one when the frame count is not the CRNN's W / 4 + 1 (dtrb_vgg's is W / 4 - 1);
    such a program then refuses one image and reads two or more."""
    try:
        exported(torch.zeros(1, preprocessing.channels, preprocessing.height, 2 * min_width))
    except Exception:  # the runtime's guard error
        return False
    return True


def check_batches(
    images: list[tuple[str, bytes]], preprocessing: Preprocessing, min_width: int = MIN_WIDTH, single: bool = True
) -> list[tuple[list[str], Tensor]]:
    """(names, images [B, C, H, W]) to compare on: every image as one batch at the checkpoint's width and
    at twice it, then each alone at its own width (its aspect ratio at the model's height), or twice
    over when the program reads no single images (`single` false)."""
    height, width = preprocessing.height, preprocessing.width
    batched = {width: [], 2 * width: []}
    alone = []
    for name, image_bytes in images:
        try:
            image_width, image_height = image_size(image_bytes)  # upright, as the transform reads it
            own_width = round(image_width * height / max(image_height, 1))
            own_width = min(MAX_WIDTH, max(min_width, own_width))
            for batch_width, batch in batched.items():
                batch.append(ImageTransform(replace(preprocessing, width=batch_width))(image_bytes))
            own = ImageTransform(replace(preprocessing, width=own_width, keep_aspect=False))(image_bytes)[None]
            alone.append(([name], own) if single else ([name, name], torch.cat([own, own])))
        except Exception as error:  # Pillow raises many types on bad files
            print(f"{name}: cannot decode ({error}); not used in the check", file=sys.stderr)
    if not alone:
        raise ValueError("none of the check images could be decoded")
    names = [names[0] for names, _ in alone]
    if len(names) == 1:  # batches must hold more than one image, or the batch axis goes untested
        names, batched = names * 2, {width: batch * 2 for width, batch in batched.items()}
    return [(names, torch.stack(batch)) for batch in batched.values()] + alone


def decoded_texts(codec: CTCCodec, logits: Tensor) -> list[str]:
    """The greedy CTC readings of logits [B, T, classes], as text."""
    return [reading.text for reading in codec.decode(logits)]


@torch.inference_mode()
def compare(
    model: nn.Module, exported: Runner, codec: CTCCodec, batches: list[tuple[list[str], Tensor]], tolerance: float
) -> list[str]:
    """Report lines; the last starts with "check passed" or "check FAILED"."""
    max_difference, texts, differing = 0.0, 0, []
    for names, images in batches:
        expected = model(images)  # [B, T, classes]
        try:
            actual = exported(images)  # [B, T, classes]
        except Exception as error:  # a runtime's error on a shape the export did not generalise to
            return [f"check FAILED: the exported model failed on images {tuple(images.shape)}: {error}"]
        if actual.shape != expected.shape:
            return [
                f"check FAILED: images {tuple(images.shape)} gave logits {tuple(actual.shape)},"
                f" PyTorch {tuple(expected.shape)}"
            ]
        max_difference = max(max_difference, (actual - expected).abs().max().item())
        for name, want, got in zip(names, decoded_texts(codec, expected), decoded_texts(codec, actual)):
            texts += 1
            if got != want:
                differing.append(f"{name} at width {images.shape[3]}: {got!r}, PyTorch {want!r}")
    widths = sorted({images.shape[3] for _, images in batches})
    sizes = sorted({images.shape[0] for _, images in batches})
    used = len({name for names, _ in batches for name in names})
    lines = [
        f"{used} images, {len(batches)} runs: batch sizes {', '.join(map(str, sizes))};"
        f" widths {widths[0]} to {widths[-1]}",
        f"max abs logit difference: {max_difference:.2e} (tolerance {tolerance:g})",
        f"decoded texts identical: {texts - len(differing)} of {texts}",
    ]
    lines += [f"  differs: {line}" for line in differing[:10]]
    problems = (["texts differ"] if differing else []) + (["logits differ"] if max_difference > tolerance else [])
    lines.append(f"check FAILED: {' and '.join(problems)}" if problems else "check passed")
    return lines


def int8_path(out: Path) -> Path:
    """Where the int8 model of the float ONNX `out` goes: best.onnx -> best.int8.onnx."""
    return out.with_name(out.name.removesuffix(".onnx") + ".int8.onnx")


def lmdb_samples(root: str, limit: int) -> list[tuple[str, bytes, str | None]]:
    """Up to `limit` (name, encoded image, label) triples of an LMDB, in index order, named `root#index`."""
    samples = []
    with lmdb_for_scan(root) as env, env.begin() as txn:
        for index in range(1, min(read_num_samples(txn, root), limit) + 1):
            image_bytes = txn.get(image_key(index))
            if image_bytes is not None:
                samples.append((f"{root}#{index}", bytes(image_bytes), read_label(txn, index)))
    return samples


def labelled_images(sources: list[str] | None, alphabet: str, limit: int) -> list[tuple[str, bytes, str | None]]:
    """Up to `limit` (name, encoded image, label) triples to weigh an int8 model on: LMDB samples with their
    labels, image files without (None), or by default images rendered by scripts/make_synthetic.py."""
    if not sources:
        plan, _ = build_plan(alphabet, max_length=10)
        samples = (render_sample(plan, 0, "export-check", index) for index in range(limit))
        return [(f"rendered-{index}", sample.image, sample.label) for index, sample in enumerate(samples)]
    images: list[tuple[str, bytes, str | None]] = []
    for source in sources:
        if (Path(source) / "data.mdb").is_file():
            images += lmdb_samples(source, limit - len(images))
        else:
            images += [(name, image, None) for name, image in encoded_images([source], limit - len(images))]
    return images[:limit]


def batches_at_width(
    images: list[tuple[str, bytes]], preprocessing: Preprocessing, batch_size: int, option: str = "--check"
) -> list[tuple[list[int], Tensor]]:
    """(positions in `images`, images [B, C, H, W]) at the checkpoint's width, as the model reads them in
    training and evaluation; an image that cannot be decoded is reported on stderr and left out, and
    `option` (where the images came from) named when none is left."""
    transform = ImageTransform(preprocessing)
    decoded = []
    for position, (name, image_bytes) in enumerate(images):
        try:
            decoded.append((position, transform(image_bytes)))
        except Exception as error:  # Pillow raises many types on bad files
            print(f"{name}: cannot decode ({error}); not used", file=sys.stderr)
    if not decoded:
        raise ValueError(f"none of the {option} images could be decoded: give images Pillow reads")
    chunks = [decoded[start : start + batch_size] for start in range(0, len(decoded), batch_size)]
    return [([position for position, _ in chunk], torch.stack([image for _, image in chunk])) for chunk in chunks]


class CalibrationImages:
    """onnxruntime.quantization's calibration data reader (get_next, None at the end) over image batches."""

    def __init__(self, batches: list[Tensor]) -> None:
        self.batches = iter(batches)

    def get_next(self) -> dict[str, object] | None:
        images = next(self.batches, None)  # [B, C, H, W]
        return None if images is None else {"images": images.numpy()}


def quantize_int8(float_onnx: Path, int8_onnx: Path, mode: str, calibration: list[Tensor], work: Path) -> None:
    """Write the int8 version of `float_onnx` to `int8_onnx`; `calibration` (image batches [B, C, H, W]) sets
    the static ranges. `work` holds the intermediate files."""
    from onnxruntime.quantization import QuantFormat, QuantType, quant_pre_process, quantize_dynamic, quantize_static

    prepared = work / "prepared.onnx"
    # Shape inference and onnxruntime's graph optimisations: the exporter computes the LSTM's weights
    # from the checkpoint's with Slice and Concat nodes, and only weights folded into constants are quantized.
    quant_pre_process(float_onnx, prepared)
    if mode == "static":
        calibrated = work / "static.onnx"
        # QDQ, the format onnxruntime recommends, fuses into QLinearConv; per-channel weight scales keep
        # a convolution's small filters apart from its large ones. The calibrator holds every batch's
        # convolution inputs and outputs (about 200 MB for CALIBRATION_IMAGES at 32 x 128): its option
        # to merge them as it goes, CalibMaxIntermediateOutputs, drops them unmeasured instead
        # (microsoft/onnxruntime#18893, in 1.31.1).
        quantize_static(
            prepared,
            calibrated,
            CalibrationImages(calibration),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=STATIC_OP_TYPES,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
        prepared = calibrated
    quantize_dynamic(prepared, int8_onnx, op_types_to_quantize=DYNAMIC_OP_TYPES, weight_type=QuantType.QInt8)


@dataclass(frozen=True)
class Int8Comparison:
    """The int8 model's readings against the float model's and against the labels."""

    images: int
    identical: int  # decoded texts the two models agree on
    scored: int  # images whose label is not empty in the metric mode's form (plain image files have none)
    float_correct: int
    int8_correct: int

    @property
    def accuracy_drop(self) -> float:
        """Percentage points of word accuracy lost to int8 (negative: int8 read more right)."""
        return 100 * (self.float_correct - self.int8_correct) / self.scored

    @property
    def differing_percent(self) -> float:
        """The share of texts that differ: without labels, the most accuracy int8 can have cost."""
        return 100 * (self.images - self.identical) / self.images


@torch.inference_mode()
def compare_int8(
    float_model: Runner,
    int8_model: Runner,
    codec: CTCCodec,
    images: list[tuple[str, bytes, str | None]],
    preprocessing: Preprocessing,
    mode: str,
) -> Int8Comparison:
    """Read `images` with both models and count agreements, and right readings under metric `mode`."""
    counts = dict.fromkeys(("images", "identical", "scored", "float_correct", "int8_correct"), 0)
    for positions, batch in batches_at_width([(name, image) for name, image, _ in images], preprocessing, INT8_BATCH):
        labels = [images[position][2] for position in positions]
        for label, float_text, int8_text in zip(
            labels, decoded_texts(codec, float_model(batch)), decoded_texts(codec, int8_model(batch))
        ):
            counts["images"] += 1
            counts["identical"] += float_text == int8_text
            truth = "" if label is None else compared_form(codec.normalize(label), mode, codec.alphabet)
            if truth:  # a label of symbols only says nothing under `benchmark`
                counts["scored"] += 1
                counts["float_correct"] += compared_form(float_text, mode, codec.alphabet) == truth
                counts["int8_correct"] += compared_form(int8_text, mode, codec.alphabet) == truth
    return Int8Comparison(**counts)


def int8_report(comparison: Int8Comparison, mode: str, max_drop: float) -> tuple[list[str], str | None]:
    """Report lines, and why the int8 model is refused (None when it passes the gate)."""
    lines = [
        f"decoded texts identical to float's: {comparison.identical} of {comparison.images}"
        f" ({100 - comparison.differing_percent:.2f} %)"
    ]
    if comparison.scored:
        float_accuracy = 100 * comparison.float_correct / comparison.scored
        int8_accuracy = 100 * comparison.int8_correct / comparison.scored
        lines.append(
            f"word accuracy ({mode}) on {comparison.scored} labelled images: float {float_accuracy:.2f} %,"
            f" int8 {int8_accuracy:.2f} % ({int8_accuracy - float_accuracy:+.2f} points; --max-accuracy-drop"
            f" {max_drop:g})"
        )
        if comparison.accuracy_drop > max_drop:
            return lines, (
                f"word accuracy fell {comparison.accuracy_drop:.2f} points (float {float_accuracy:.2f} %,"
                f" int8 {int8_accuracy:.2f} % on {comparison.scored} labelled images), more than"
                f" --max-accuracy-drop {max_drop:g}"
            )
        return lines, None
    lines.append(
        "no labels among the images (give a labelled LMDB with --check to measure accuracy): the share of"
        " texts that differ stands in for the accuracy drop, as its upper bound"
    )
    if comparison.differing_percent > max_drop:
        return lines, (
            f"{comparison.differing_percent:.2f} % of the texts differ from float's (no labels to measure"
            f" accuracy), more than --max-accuracy-drop {max_drop:g}"
        )
    return lines, None


def images_per_second(models: dict[str, Runner], images: Tensor) -> dict[str, list[float]]:
    """Each model's images/s on `images` [B, C, H, W] in each of SPEED_ROUNDS rounds in which the models
    take turns, so that a change in the machine's load reaches all of them alike."""
    repeats = {}
    for name, model in models.items():
        model(images)  # untimed: onnxruntime plans its memory on the first run of a shape
        start = time.perf_counter()
        model(images)
        repeats[name] = max(1, math.ceil(SPEED_SECONDS / (time.perf_counter() - start)))
    rates: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(SPEED_ROUNDS):
        for name, model in models.items():
            start = time.perf_counter()
            for _ in range(repeats[name]):
                model(images)
            rates[name].append(repeats[name] * len(images) / (time.perf_counter() - start))
    return rates


@torch.inference_mode()
def speed_lines(files: dict[str, Path], images: list[tuple[str, bytes]], preprocessing: Preprocessing) -> list[str]:
    """images/s of each ONNX file under onnxruntime at SPEED_BATCHES, and the files' sizes."""
    models = {name: onnx_runner(path) for name, path in files.items()}
    _, batch = batches_at_width(images[: max(SPEED_BATCHES)], preprocessing, max(SPEED_BATCHES))[0]
    threads = torch.get_num_threads()  # onnx_runner's intra-op threads
    lines = [
        f"images/s under onnxruntime on the CPU ({threads} thread{'s' if threads > 1 else ''}, width"
        f" {preprocessing.width}; medians of {SPEED_ROUNDS} rounds, the models taking turns):"
    ]
    for size in SPEED_BATCHES:
        repeated = batch.repeat(math.ceil(size / len(batch)), 1, 1, 1)[:size]  # [size, C, H, W]
        rates = images_per_second(models, repeated)
        line = f"  batch {size}: " + ", ".join(f"{name} {statistics.median(rate):.0f}" for name, rate in rates.items())
        if "int8" in rates:  # each round's own ratio: the models ran under the same load
            line += f"; int8 {statistics.median(q / f for f, q in zip(rates['float'], rates['int8'])):.2f}x float"
        lines.append(line)
    sizes = [f"{name} {path.stat().st_size / 1e6:.1f} MB" for name, path in files.items()]
    lines.append("  file size: " + ", ".join(sizes))
    return lines


def export_int8(
    out: Path,
    codec: CTCCodec,
    preprocessing: Preprocessing,
    args: argparse.Namespace,
    images: list[tuple[str, bytes, str | None]],
    calibration: list[tuple[str, bytes]],
) -> int:
    """Quantize the float ONNX `out` as `args.int8` says, weigh it against the float model on `images`, and
    move it into place only when it passes the gate."""
    target, mode = int8_path(out), args.int8
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".int8-", dir=out.parent) as work:  # beside `out`: one file system
        int8_onnx = Path(work) / target.name
        calibration_batches = (
            [batch for _, batch in batches_at_width(calibration, preprocessing, INT8_BATCH, "--calibrate")]
            if calibration
            else []
        )
        quantize_int8(out, int8_onnx, mode, calibration_batches, Path(work))
        calibrated = f", calibrated on {len(calibration)} images" if calibration else ""
        print(
            f"quantized to int8 ({mode}{calibrated}) in {time.perf_counter() - start:.1f} s; comparing with the"
            f" float model on {len(images)} images"
        )
        comparison = compare_int8(
            onnx_runner(out), onnx_runner(int8_onnx), codec, images, preprocessing, args.metric_mode
        )
        lines, refusal = int8_report(comparison, args.metric_mode, args.max_accuracy_drop)
        print("\n".join(lines))
        if args.speed:
            print(
                "\n".join(
                    speed_lines(
                        {"float": out, "int8": int8_onnx}, [(name, image) for name, image, _ in images], preprocessing
                    )
                )
            )
        if refusal:
            # Dynamic keeps the convolutions in float: what to try when the static model fails the gate.
            fallback = ", or try --int8 dynamic" if mode == "static" else ""
            print(
                f"int8 check FAILED: {refusal}; no int8 file written (raise --max-accuracy-drop to accept it"
                f"{fallback})"
            )
            return 1
        os.replace(int8_onnx, target)
    print(f"int8 check passed: wrote {target} ({target.stat().st_size / 1e6:.1f} MB)")
    return 0


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


def export_easyocr(
    model: nn.Module,
    codec: CTCCodec,
    config: Config,
    preprocessing: Preprocessing,
    out: Path,
    name: str,
    languages: list[str],
    images: list[tuple[str, bytes]],
    origin: str,
) -> int:
    """Write the EasyOCR folder; read the check images with EasyOCR and with `model` when EasyOCR is here."""
    check_easyocr_export(config, preprocessing, name)
    write_easyocr_model(out, name, model.state_dict(), codec.alphabet, config.model, preprocessing, languages)
    print(
        f"exported easyocr to {out}: model/{name}.pth, user_network/{name}.py and {name}.yaml (imgH "
        f"{preprocessing.height}, {len(codec.alphabet)} characters); read with easyocr.Reader({languages},"
        f" recog_network={name!r}, model_storage_directory='{out / 'model'}', user_network_directory="
        f"'{out / 'user_network'}')"
    )
    if preprocessing.interpolation != "opencv_linear":
        print(
            f"note: the model was trained with {preprocessing.interpolation} resizing; EasyOCR resizes with cv2's "
            "bilinear (data.interpolation: opencv_linear), so some readings may differ"
        )
    if importlib.util.find_spec("easyocr") is None:
        print("EasyOCR is not installed: the export was not read back with it (pip install easyocr)")
        return 0
    print(f"checking with EasyOCR on {origin}")
    reader = easyocr_reader(export_dir=out)
    # EasyOCR reads a word at its own width, however wide: so does the model here, up to 32:1 (what the
    # checkpoint's data.img_width caps in training and eval.sh, EasyOCR does not).
    uncapped = replace(preprocessing, width=max(preprocessing.width, 32 * preprocessing.height))
    records = compare_readings(reader, model, codec, build_transform(config, uncapped), images)
    lines = agreement_lines(records)
    same = sum(record["ours"] == record["easyocr"] for record in records)
    passed = same >= EASYOCR_AGREEMENT * len(records)
    print("\n".join(lines + ["check passed" if passed else f"check FAILED: under {EASYOCR_AGREEMENT:.0%} identical"]))
    return 0 if passed else 1


def export_and_load(
    model: nn.Module, codec: CTCCodec, config: Config, preprocessing: Preprocessing, export_format: str, out: Path
) -> tuple[Runner | None, int]:
    """Export `model` to `out` as onnx or pt2 and say what was written; return the written file loaded for
    running (None: onnxruntime is not installed) and the narrowest width it reads."""
    start = time.perf_counter()
    # Batch 2: torch.export would specialise a batch axis traced at size 1.
    example = torch.zeros(2, *build_transform(config, preprocessing).output_shape)
    min_width = narrowest_width(model, preprocessing)
    export(model, example, export_format, out, metadata(codec, preprocessing), min_width)
    exported = onnx_runner(out) if export_format == "onnx" else pt2_runner(out)
    print(
        f"exported {export_format} to {out} ({out.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - start:.1f}"
        f" s: images [batch, {preprocessing.channels}, {preprocessing.height}, width] -> logits [batch, frames,"
        f" {codec.num_classes}]"
    )
    return exported, min_width


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
        return export_easyocr(
            model, codec, config, preprocessing, out, args.name or checkpoint.stem, args.lang or ["en"], images, origin
        )
    if args.format == "onnx":
        check_onnx_packages(args)
        if args.int8:  # a stale int8 file of an earlier export must not pass for this model's
            int8_path(out).unlink(missing_ok=True)

    exported, min_width = export_and_load(model, codec, config, preprocessing, args.format, out)
    if exported is None:
        print(
            f"onnxruntime is not installed: {out} was not run, and not compared with PyTorch"
            " (pip install -r requirements-export.txt)"
        )
        return 0

    single = reads_single_images(exported, preprocessing, min_width)
    if not single:
        print(
            f"note: {out} reads batches of two or more images, not one (torch.export specialises a batch of one for"
            f" {config.model.arch}): give a single image twice"
        )
    print(f"checking against PyTorch on {origin}")
    lines = compare(model, exported, codec, check_batches(images, preprocessing, min_width, single), args.tolerance)
    print("\n".join(lines))
    if lines[-1].startswith("check FAILED"):  # no int8 model is made from a float model that failed
        return 1
    if args.int8:
        return export_int8(out, codec, preprocessing, args, int8_images, calibration)
    if args.speed:
        print("\n".join(speed_lines({"float": out}, images, preprocessing)))
    return 0


if __name__ == "__main__":
    cli.run(main)
