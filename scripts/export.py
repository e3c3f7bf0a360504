"""Export a checkpoint to ONNX or a torch.export program with a dynamic batch and width, then check it
against PyTorch; or hand a dtrb_vgg model to EasyOCR as a custom recognizer, checked with EasyOCR.

    python scripts/export.py runs/crnn/best.pt --format onnx                  # -> runs/crnn/best.onnx
    python scripts/export.py runs/crnn/best.pt --format pt2                   # -> runs/crnn/best.pt2
    python scripts/export.py runs/crnn/best.pt --format onnx --out crnn.onnx --check datasets/synth/val 'scans/*.png'
    python scripts/export.py runs/ft/best.pt --format easyocr                 # -> runs/ft/best_easyocr/

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
import re
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram
from torch.export._patches import register_lstm_while_loop_decomposition

from data.codec import CTCCodec
from data.image_files import encoded_images
from data.synthetic.render import build_plan, render_sample
from data.transforms import ImageTransform, Preprocessing
from evaluation.easyocr_reader import agreement_lines, compare_readings, easyocr_reader
from models import output_frames
from training.checkpoint import load_model
from training.peer_weights import easyocr_problems, write_easyocr_model
from utils import cli
from utils.config import Config, load_config

SUFFIXES = {"onnx": ".onnx", "pt2": ".pt2", "easyocr": "_easyocr"}
# EasyOCR's own recognizer names (easyocr/config.py): a custom model with one of them is not read.
EASYOCR_BUILT_IN = {"standard", "latin_g1", "zh_tra_g1", "zh_sim_g1", "japanese_g1", "korean_g1", "thai_g1",
                    "devanagari_g1", "cyrillic_g1", "arabic_g1", "tamil_g1", "bengali_g1", "english_g2", "latin_g2",
                    "zh_sim_g2", "japanese_g2", "korean_g2", "telugu_g2", "kannada_g2", "cyrillic_g2"}
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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint of train.py, or a bare state dict with --config")
    # Checked below rather than by `choices`, so that the old "torchscript" can be told what replaced it.
    parser.add_argument("--format", required=True, metavar="{" + ",".join(sorted(SUFFIXES)) + "}")
    parser.add_argument("--out", type=Path, help="output file, or folder for easyocr (default: the checkpoint's name "
                                                 "with .onnx / .pt2 / _easyocr)")
    parser.add_argument("--name", help="easyocr: the model's name, recog_network=NAME (default: the checkpoint's)")
    parser.add_argument("--lang", nargs="+", default=["en"], help="easyocr: its lang_list (default: en)")
    parser.add_argument("--check", nargs="+", metavar="IMAGE|FOLDER|GLOB|LMDB",
                        help="images to compare on (default: rendered by scripts/make_synthetic.py)")
    parser.add_argument("--check-limit", type=int, default=32, help="compare on at most this many images (default 32)")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="max abs logit difference allowed (default 1e-3)")
    parser.add_argument("--config", help="model and alphabet for a bare state dict (YAML, or a name in configs/)")
    args = parser.parse_args()
    if args.format == "torchscript":  # torch deprecated TorchScript
        raise ValueError("--format torchscript was replaced by --format pt2: a torch.export program, loaded with"
                         " torch.export.load")
    if args.format not in SUFFIXES:
        parser.error(f"argument --format: invalid choice: {args.format!r} (choose from {', '.join(sorted(SUFFIXES))})")
    if args.check_limit < 1:
        parser.error(f"--check-limit must be >= 1, got {args.check_limit}")
    if args.tolerance < 0:
        parser.error(f"--tolerance must be >= 0, got {args.tolerance}")
    return args


def metadata(codec: CTCCodec, preprocessing: Preprocessing) -> dict[str, str]:
    """What a runtime needs besides the weights: the alphabet and how to make the input."""
    description = {"alphabet": codec.alphabet, "blank": 0, "fold_case": codec.fold_case,
                   "preprocessing": preprocessing.to_dict(),
                   "input": "images [B, C, H, W]: (pixels / 255 - mean) / std after the preprocessing's resize",
                   "output": "logits [B, T, classes], T frames from W pixels (the CRNN's W / 4 + 1); greedy CTC"
                             " decoding"}
    return {"crnn": json.dumps(description, ensure_ascii=False)}


def narrowest_width(model: nn.Module, preprocessing: Preprocessing) -> int:
    """The narrowest width, from MIN_WIDTH on, at which the model emits more than one frame."""
    width = MIN_WIDTH
    while output_frames(model, preprocessing.channels, preprocessing.height, width) < 2:
        width += 1
    return width


def export(model: nn.Module, example: Tensor, export_format: str, out: Path, extra: dict[str, str],
           min_width: int) -> None:
    """Write `model` to `out` as `export_format`, traced on `example` [B, C, H, W] with B and W left free."""
    # torch.export keeps nn.LSTM as one aten.lstm op (ONNX: an LSTM node), but works out its output
    # shape by unrolling it over the example's frames, which would freeze T at 26. torch's while_loop
    # version of that shape rule keeps T symbolic: private, but what torch.onnx itself turns on for
    # dynamic shapes. torch.onnx does so only while capturing, not while it decomposes the program
    # again (there T froze in a Reshape; pytorch/pytorch#193192), so it is held across both steps here.
    with register_lstm_while_loop_decomposition():
        program = torch.export.export(model, (example,),
                                      dynamic_shapes=({0: Dim("batch"), 3: Dim("width", min=min_width)},))
        if export_format == "onnx":
            export_onnx(program, out, extra)
        else:
            torch.export.save(program, out, extra_files={"crnn.json": extra["crnn"]})


def export_onnx(program: ExportedProgram, out: Path, extra: dict[str, str]) -> None:
    import onnx  # optional: requirements-export.txt

    # The axis names only name the program's free axes in the file; verbose=False keeps torch.onnx's
    # progress lines out of the report on stdout.
    onnx_program = torch.onnx.export(program, dynamo=True, opset_version=ONNX_OPSET, input_names=["images"],
                                     output_names=["logits"], dynamic_shapes=({0: "batch", 3: "width"},),
                                     verbose=False)
    proto = onnx_program.model_proto
    onnx.checker.check_model(proto)
    onnx.helper.set_model_props(proto, extra)
    onnx.save(proto, out)


def onnx_runner(path: Path) -> Runner | None:
    """onnxruntime on the CPU, or None when it is not installed."""
    try:
        import onnxruntime
    except ImportError:
        return None
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
        images = [(f"rendered-{index}", render_sample(plan, 0, "export-check", index).image)
                  for index in range(min(RENDERED_IMAGES, limit))]
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


def check_batches(images: list[tuple[str, bytes]], preprocessing: Preprocessing, min_width: int = MIN_WIDTH,
                  single: bool = True) -> list[tuple[list[str], Tensor]]:
    """(names, images [B, C, H, W]) to compare on: every image as one batch at the checkpoint's width and
    at twice it, then each alone at its own width (its aspect ratio at the model's height), or twice
    over when the program reads no single images (`single` false)."""
    height, width = preprocessing.height, preprocessing.width
    batched = {width: [], 2 * width: []}
    alone = []
    for name, image_bytes in images:
        try:
            with Image.open(io.BytesIO(image_bytes)) as image:
                own_width = round(image.width * height / max(image.height, 1))
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


@torch.inference_mode()
def compare(model: nn.Module, exported: Runner, codec: CTCCodec, batches: list[tuple[list[str], Tensor]],
            tolerance: float) -> list[str]:
    """Report lines; the last starts with "check passed" or "check FAILED"."""
    max_difference, texts, differing = 0.0, 0, []
    for names, images in batches:
        expected = model(images)  # [B, T, classes]
        try:
            actual = exported(images)  # [B, T, classes]
        except Exception as error:  # a runtime's error on a shape the export did not generalise to
            return [f"check FAILED: the exported model failed on images {tuple(images.shape)}: {error}"]
        if actual.shape != expected.shape:
            return [f"check FAILED: images {tuple(images.shape)} gave logits {tuple(actual.shape)},"
                    f" PyTorch {tuple(expected.shape)}"]
        max_difference = max(max_difference, (actual - expected).abs().max().item())
        for name, (want, _), (got, _) in zip(names, codec.decode(expected), codec.decode(actual)):
            texts += 1
            if got != want:
                differing.append(f"{name} at width {images.shape[3]}: {got!r}, PyTorch {want!r}")
    widths = sorted({images.shape[3] for _, images in batches})
    sizes = sorted({images.shape[0] for _, images in batches})
    used = len({name for names, _ in batches for name in names})
    lines = [f"{used} images, {len(batches)} runs: batch sizes {', '.join(map(str, sizes))};"
             f" widths {widths[0]} to {widths[-1]}",
             f"max abs logit difference: {max_difference:.2e} (tolerance {tolerance:g})",
             f"decoded texts identical: {texts - len(differing)} of {texts}"]
    lines += [f"  differs: {line}" for line in differing[:10]]
    problems = (["texts differ"] if differing else []) + (["logits differ"] if max_difference > tolerance else [])
    lines.append(f"check FAILED: {' and '.join(problems)}" if problems else "check passed")
    return lines


def export_easyocr(model: nn.Module, codec: CTCCodec, config: Config, preprocessing: Preprocessing, out: Path,
                   name: str, languages: list[str], images: list[tuple[str, bytes]], origin: str) -> int:
    """Write the EasyOCR folder; read the check images with EasyOCR and with `model` when EasyOCR is here."""
    problems = easyocr_problems(config.model, preprocessing)
    if problems:
        raise ValueError("EasyOCR cannot run this model as it was trained: " + "; ".join(problems))
    if not name.isidentifier():  # EasyOCR imports user_network/NAME.py as a module
        suggestion = re.sub(r"\W", "_", name).lstrip("0123456789") or "my_model"
        raise ValueError(f"--name {name!r}: EasyOCR imports the network as a Python module, so the name must be an"
                         f" identifier (letters, digits, _), e.g. --name {suggestion}")
    if name in EASYOCR_BUILT_IN:
        raise ValueError(f"--name {name}: EasyOCR would load its own {name} instead; pick another, e.g. --name "
                         f"{name}_custom")
    write_easyocr_model(out, name, model.state_dict(), codec.alphabet, config.model, preprocessing, languages)
    print(f"exported easyocr to {out}: model/{name}.pth, user_network/{name}.py and {name}.yaml (imgH "
          f"{preprocessing.height}, {len(codec.alphabet)} characters); read with easyocr.Reader({languages},"
          f" recog_network={name!r}, model_storage_directory='{out / 'model'}', user_network_directory="
          f"'{out / 'user_network'}')")
    if preprocessing.interpolation != "opencv_linear":
        print(f"note: the model was trained with {preprocessing.interpolation} resizing; EasyOCR resizes with cv2's "
              "bilinear (data.interpolation: opencv_linear), so some readings may differ")
    if importlib.util.find_spec("easyocr") is None:
        print("EasyOCR is not installed: the export was not read back with it (pip install easyocr)")
        return 0
    print(f"checking with EasyOCR on {origin}")
    reader = easyocr_reader(export_dir=out)
    # EasyOCR reads a word at its own width, however wide: so does the model here, up to 32:1 (what the
    # checkpoint's data.img_width caps in training and eval.sh, EasyOCR does not).
    uncapped = replace(preprocessing, width=max(preprocessing.width, 32 * preprocessing.height))
    records = compare_readings(reader, model, codec, ImageTransform(uncapped, config.data.eval_width_step), images)
    lines = agreement_lines(records)
    same = sum(record["ours"] == record["easyocr"] for record in records)
    passed = same >= EASYOCR_AGREEMENT * len(records)
    print("\n".join(lines + ["check passed" if passed else f"check FAILED: under {EASYOCR_AGREEMENT:.0%} identical"]))
    return 0 if passed else 1


def main() -> int:
    args = parse_args()
    config = load_config(args.config, []) if args.config else None
    model, codec, config, preprocessing = load_model(args.checkpoint, "cpu", config)
    checkpoint = Path(args.checkpoint)
    out = args.out or checkpoint.with_name(checkpoint.stem + SUFFIXES[args.format])
    if out.resolve() == checkpoint.resolve():
        raise ValueError(f"--out {out} is the checkpoint itself")
    out.parent.mkdir(parents=True, exist_ok=True)
    images, origin = check_images(args.check, codec.alphabet, args.check_limit)  # before exporting: fail early
    if args.format == "easyocr":
        return export_easyocr(model, codec, config, preprocessing, out, args.name or checkpoint.stem, args.lang,
                              images, origin)
    if args.format == "onnx":
        missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
        if missing:
            raise ValueError(f"--format onnx needs {' and '.join(missing)}: pip install -r requirements-export.txt")

    start = time.perf_counter()
    # Batch 2: torch.export would specialise a batch axis traced at size 1.
    example = torch.zeros(2, *ImageTransform(preprocessing).output_shape)
    min_width = narrowest_width(model, preprocessing)
    export(model, example, args.format, out, metadata(codec, preprocessing), min_width)
    exported = onnx_runner(out) if args.format == "onnx" else pt2_runner(out)
    print(f"exported {args.format} to {out} ({out.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - start:.1f} s:"
          f" images [batch, {preprocessing.channels}, {preprocessing.height}, width] -> logits [batch, frames,"
          f" {codec.num_classes}]")
    if exported is None:
        print(f"onnxruntime is not installed: {out} was not run, and not compared with PyTorch"
              " (pip install -r requirements-export.txt)")
        return 0

    single = reads_single_images(exported, preprocessing, min_width)
    if not single:
        print(f"note: {out} reads batches of two or more images, not one (torch.export specialises a batch of one for"
              f" {config.model.arch}): give a single image twice")
    print(f"checking against PyTorch on {origin}")
    lines = compare(model, exported, codec, check_batches(images, preprocessing, min_width, single), args.tolerance)
    print("\n".join(lines))
    return 1 if lines[-1].startswith("check FAILED") else 0


if __name__ == "__main__":
    cli.run(main)
