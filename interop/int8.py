"""An int8 ONNX model for CPUs: made from the float ONNX file by onnxruntime.quantization (calibrated on
images for static quantization), weighed against the float model on labelled images (the accuracy
gate, int8_report) and timed beside it under onnxruntime. scripts/export.py --int8 and --speed."""

from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from data.codec import CTCCodec
from data.image_files import encoded_images
from data.lmdb_env import lmdb_for_scan, read_num_samples
from data.lmdb_keys import image_key, read_label
from data.transforms import ImageTransform, Preprocessing
from evaluation.metrics import compared_form
from interop.export import Runner, decoded_texts, onnx_runner, rendered_images

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
        return rendered_images(alphabet, limit)
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


def calibration_batches(images: list[tuple[str, bytes]], preprocessing: Preprocessing) -> list[Tensor]:
    """`images` as batches [B, C, H, W] for quantize_int8; none for dynamic quantization, which gives no images."""
    if not images:
        return []
    return [batch for _, batch in batches_at_width(images, preprocessing, INT8_BATCH, "--calibrate")]


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
    float_onnx: Path,
    codec: CTCCodec,
    preprocessing: Preprocessing,
    images: list[tuple[str, bytes, str | None]],
    calibration: list[tuple[str, bytes]],
    *,
    mode: str,
    metric_mode: str,
    max_drop: float,
    speed: bool,
    report: Callable[[str], None],
) -> bool:
    """Quantize `float_onnx` in `mode` (one of INT8_MODES; static sets its ranges on the `calibration` images),
    weigh it against the float model on `images` under `metric_mode`, time both when `speed`, and move it to
    int8_path(float_onnx) only when it passes the gate (int8_report's `max_drop`). Each line of the report
    goes to `report` as it comes; False when the int8 model was refused, and then no int8 file is left."""
    target = int8_path(float_onnx)
    start = time.perf_counter()
    # Beside `float_onnx`, on its file system: the passing model is renamed into place, and a refused one
    # goes with the folder.
    with tempfile.TemporaryDirectory(prefix=".int8-", dir=float_onnx.parent) as work:
        int8_onnx = Path(work) / target.name
        quantize_int8(float_onnx, int8_onnx, mode, calibration_batches(calibration, preprocessing), Path(work))
        calibrated = f", calibrated on {len(calibration)} images" if calibration else ""
        report(
            f"quantized to int8 ({mode}{calibrated}) in {time.perf_counter() - start:.1f} s; comparing with the"
            f" float model on {len(images)} images"
        )
        comparison = compare_int8(
            onnx_runner(float_onnx), onnx_runner(int8_onnx), codec, images, preprocessing, metric_mode
        )
        lines, refusal = int8_report(comparison, metric_mode, max_drop)
        for line in lines:
            report(line)
        if speed:
            timed = [(name, image) for name, image, _ in images]
            for line in speed_lines({"float": float_onnx, "int8": int8_onnx}, timed, preprocessing):
                report(line)
        if refusal:
            # Dynamic keeps the convolutions in float: what to try when the static model fails the gate.
            fallback = ", or try --int8 dynamic" if mode == "static" else ""
            report(
                f"int8 check FAILED: {refusal}; no int8 file written (raise --max-accuracy-drop to accept it"
                f"{fallback})"
            )
            return False
        os.replace(int8_onnx, target)
    report(f"int8 check passed: wrote {target} ({target.stat().st_size / 1e6:.1f} MB)")
    return True
