"""This project's models in the formats other runtimes read: an ONNX file or a torch.export program (.pt2)
with a free batch and width and the alphabet and preprocessing inside, and the check that the written
file reads as the PyTorch model does (scripts/export.py's float export). The int8 ONNX model is
interop/int8.py's job, the EasyOCR folder interop/easyocr_export.py's."""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram
from torch.export._patches import register_lstm_while_loop_decomposition

from data.codec import CTCCodec
from data.image_files import encoded_images
from data.transforms import ImageTransform, Preprocessing, build_transform, image_size
from models import output_frames
from synthetic.render import build_plan, render_sample
from training.config import Config
from utils.atomic_write import write_bytes_atomically

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
) -> list[str]:
    """Write `model` to `out` as `export_format`, traced on `example` [B, C, H, W] with B and W left free.
    Returns the warnings PyTorch gave meanwhile, each once (pytorch_warnings)."""
    # torch.export keeps nn.LSTM as one aten.lstm op (ONNX: an LSTM node), but works out its output
    # shape by unrolling it over the example's frames, which would freeze T at 26. torch's while_loop
    # version of that shape rule keeps T symbolic: private, but what torch.onnx itself turns on for
    # dynamic shapes. torch.onnx does so only while capturing, not while it decomposes the program
    # again (there T froze in a Reshape; pytorch/pytorch#193192), so it is held across both steps here.
    with register_lstm_while_loop_decomposition(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # counted here, shown once each below, not once per traced graph
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
    return pytorch_warnings(caught)


def pytorch_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """One line per distinct warning, with how often it came: torch.export and torch.onnx repeat theirs for
    every graph they trace (20 of one FutureWarning for the CRNN), which buried the export's result."""
    counts = Counter(f"{item.category.__name__}: {str(item.message).splitlines()[0].strip()}" for item in caught)
    return [f"{text[:160]}{'...' if len(text) > 160 else ''} (x{count})" for text, count in counts.items()]


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
    # torch.export.load logs a warning for each size symbol that the loaded graph does not use ("Symbol u0
    # did not appear"): the check below is what says whether the program reads as the model does.
    serde_log = logging.getLogger("torch._export.serde.serialize")
    level = serde_log.level
    serde_log.setLevel(logging.ERROR)
    try:
        return torch.export.load(path).module()
    finally:
        serde_log.setLevel(level)


def export_and_load(
    model: nn.Module, codec: CTCCodec, config: Config, preprocessing: Preprocessing, export_format: str, out: Path
) -> tuple[Runner | None, int, list[str]]:
    """Export `model` to `out` as onnx or pt2; return the written file loaded for running (None: onnxruntime
    is not installed), the narrowest width it reads and PyTorch's warnings meanwhile."""
    # Batch 2: torch.export would specialise a batch axis traced at size 1.
    example = torch.zeros(2, *build_transform(config, preprocessing).output_shape)
    min_width = narrowest_width(model, preprocessing)
    caught = export(model, example, export_format, out, metadata(codec, preprocessing), min_width)
    return (onnx_runner(out) if export_format == "onnx" else pt2_runner(out)), min_width, caught


def rendered_images(alphabet: str, count: int) -> list[tuple[str, bytes, str]]:
    """`count` (name, encoded image, label) triples rendered as scripts/make_synthetic.py renders: what an
    export is checked on when the user gives no images. The same seed every time, so that two exports
    of one checkpoint are checked on the same images."""
    plan, _ = build_plan(alphabet, max_length=10)
    samples = (render_sample(plan, 0, "export-check", index) for index in range(count))
    return [(f"rendered-{index}", sample.image, sample.label) for index, sample in enumerate(samples)]


def check_images(sources: list[str] | None, alphabet: str, limit: int) -> tuple[list[tuple[str, bytes]], str]:
    """Up to `limit` (name, encoded image) pairs to check on, and where they come from."""
    if not sources:
        images = [(name, image) for name, image, _ in rendered_images(alphabet, min(RENDERED_IMAGES, limit))]
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


def export_and_check(
    model: nn.Module,
    codec: CTCCodec,
    config: Config,
    preprocessing: Preprocessing,
    export_format: str,
    out: Path,
    images: list[tuple[str, bytes]],
    origin: str,
    tolerance: float,
    *,
    report: Callable[[str], None],
) -> bool:
    """Export `model` to `out` as onnx or pt2, then compare the written file with `model` on `images` (from
    `origin`) at `tolerance` (compare). Each line of the report goes to `report` as it comes; False when the
    check failed. True also when onnxruntime is missing and the ONNX file could not be run."""
    start = time.perf_counter()
    exported, min_width, caught = export_and_load(model, codec, config, preprocessing, export_format, out)
    report(
        f"exported {export_format} to {out} ({out.stat().st_size / 1e6:.1f} MB) in"
        f" {time.perf_counter() - start:.1f} s: images [batch, {preprocessing.channels}, {preprocessing.height},"
        f" width] -> logits [batch, frames, {codec.num_classes}]"
    )
    for line in caught:
        report(f"PyTorch warned while exporting: {line}")
    if exported is None:
        report(
            f"onnxruntime is not installed: {out} was not run, and not compared with PyTorch"
            " (pip install -r requirements-export.txt)"
        )
        return True
    single = reads_single_images(exported, preprocessing, min_width)
    if not single:
        report(
            f"note: {out} reads batches of two or more images, not one (torch.export specialises a batch of one for"
            f" {config.model.arch}): give a single image twice"
        )
    report(f"checking against PyTorch on {origin}")
    lines = compare(model, exported, codec, check_batches(images, preprocessing, min_width, single), tolerance)
    for line in lines:
        report(line)
    return not lines[-1].startswith("check FAILED")
