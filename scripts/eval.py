"""Evaluate a checkpoint on LMDB sets; run it through scripts/eval.sh.

    scripts/eval.sh runs/crnn/best.pt datasets/synth/val [more LMDBs ...] [--json results.json]
    NPROC=2 scripts/eval.sh runs/crnn/best.pt datasets/synth/val      # 2 processes, same numbers
    scripts/eval.sh best.pt benchmarks/*/ --dump predictions.tsv --errors misreads.png
    scripts/eval.sh best.pt benchmarks/*/ --decoder lexicon --lexicon synthetic/words/english.txt

Every sample is evaluated exactly once whatever the number of processes, and the metrics are sums
of integers, so the results do not depend on NPROC or the batch size. A checkpoint trained with
data.keep_aspect is evaluated in batches of one padded width (data.eval_width_step). Folders named after a standard
benchmark (IIIT5k_3000, SVT, ..., in any case) are shown under its conventional name, first, in the
conventional order. The default metric mode, `benchmark`, is the field's protocol (evaluation/metrics.py).
`--split-long` reads crops more than 1.5 model input widths long at the model's height in overlapping pieces,
as predict.py does by default (evaluation/long_crops.py); without it they are squashed, as in training.
Below the table: the accuracy of the most confident 50, 80 and 95 % of the readings of each set, which
says how far the word confidence can be trusted to pick the readings worth keeping. `--slices` adds each
set's accuracy by label length, crop shape, case and symbols, and its most frequent character confusions
(evaluation/slices.py). `--provenance` first prints what the checkpoint was trained on (the meta.json of each
dataset, docs/data.md); given no LMDB, only that. Under the table: the expected calibration error of the word
confidence before and after the checkpoint's temperature (scripts/calibrate.py; an uncalibrated checkpoint's is
its raw confidence's), also in --json under `calibration`; `--reliability PATH.png` draws the combined readings'
reliability diagram.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor, nn
from torch.utils.data import Dataset

from data.codec import CTCCodec, Reading
from data.label_index import DROP_REASONS, index_cache_dir
from data.lmdb_dataset import UNKNOWN_CHARACTERS, Batch, CollateBatch, LmdbDataset
from data.lmdb_env import open_lmdb, shared_lmdb
from data.lmdb_keys import image_key, read_label
from data.loaders import build_eval_loader
from data.provenance import trained_on
from data.transforms import ImageTransform, build_transform, decode_image, image_size
from evaluation.calibration import ECE_BINS, FrameCollector, calibration_report
from evaluation.decoders import Decoder, add_decoder_options, build_decoder
from evaluation.evaluate import evaluate
from evaluation.long_crops import LongCropTransform, PiecewiseModel, split_long_samples
from evaluation.metrics import COUNT_KEYS, METRIC_MODES, is_correct, new_counts, summarize
from evaluation.prediction_dump import write_dump
from evaluation.reliability import reliability_diagram
from evaluation.slices import SliceSample, format_slices, slice_report
from evaluation.visualize import caption_grid
from models import output_frames
from training.checkpoint import check_checkpoint_path, load_checkpoint, load_model, read_calibration
from training.config import Config, ConfigFileOption, load_config
from training.precision_choice import choose_precision, inference_shape
from utils import cli
from utils.atomic_write import check_writable, write_bytes_atomically, write_text_atomically
from utils.distributed import DistEnv, cleanup_distributed, gather_objects, read_env, setup_distributed
from utils.precision import PRECISIONS

# The benchmark sets as deep-text-recognition-benchmark and parseq name and order them.
BENCHMARKS = (
    "IIIT5k_3000",
    "SVT",
    "IC03_860",
    "IC03_867",
    "IC13_857",
    "IC13_1015",
    "IC15_1811",
    "IC15_2077",
    "SVTP",
    "CUTE80",
)
# Other names the same sets are released under.
ALIASES = {
    "iiit5k": "IIIT5k_3000",
    "svt_647": "SVT",
    "ic13": "IC13_857",
    "ic15": "IC15_2077",
    "svtp_645": "SVTP",
    "cute80_288": "CUTE80",
}
COMBINED = "combined (weighted by samples)"
MODE_HELP = {
    "benchmark": "the benchmark protocol (lowercase, only [0-9a-z] kept on both sides, exact match)",
    "exact": "prediction and label compared as they are",
    "ignore_case": "prediction and label compared lowercased",
    "ignore_case_symbols": "case-insensitive alphanumeric, the benchmark protocol for 36-class models"
    " (symbols the alphabet holds are compared too)",
}
ERRORS_COUNT, READINGS_COUNT = 32, 12  # the pictures' sizes when --errors-count, --readings-count are not given
COVERAGES = (0.5, 0.8, 0.95)  # the most confident shares of the readings whose accuracy is printed


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is below 0 (0 reads in the main process)")
    return value


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint of train.py, or a bare state dict with --config")
    parser.add_argument("lmdbs", nargs="*", help="LMDB folders to evaluate on, one table row each")
    parser.add_argument(
        "--provenance",
        action="store_true",
        help="first print what the checkpoint was trained on (each dataset's name, samples, source, licence);"
        " alone, without LMDBs, only that",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument(
        "--config",
        action=ConfigFileOption,
        help="model and alphabet for a bare state dict (YAML, or a name in configs/)",
    )
    # --help lists the options in the order they are added.
    add_scoring_options(parser)
    add_runtime_options(parser)
    return parser.parse_args()


def add_scoring_options(parser: argparse.ArgumentParser) -> None:
    """How the model's readings are decoded, compared with the labels, and shown beside the table."""
    parser.add_argument(
        "--metric-mode",
        default="benchmark",
        choices=METRIC_MODES,
        help="how predictions are compared with labels for acc, 1-NED, char P/R, CER, --dump's"
        " correct column and --errors (default benchmark, the field's protocol)",
    )
    add_decoder_options(parser)
    parser.add_argument(
        "--split-long",
        action="store_true",
        help="read crops over 1.5 input widths long in overlapping pieces (default: squashed)",
    )
    parser.add_argument("--dump", type=Path, metavar="PATH.tsv", help="write every prediction to this TSV file")
    parser.add_argument("--errors", type=Path, metavar="PATH.png", help="draw the most confident misreads here")
    parser.add_argument(
        "--errors-count", type=positive_int, metavar="N", help=f"misreads in the --errors grid (default {ERRORS_COUNT})"
    )
    parser.add_argument(
        "--readings", type=Path, metavar="PATH.png", help="draw each set's first images and what the model read"
    )
    parser.add_argument(
        "--readings-count",
        type=positive_int,
        metavar="N",
        help=f"images of each set in --readings (default {READINGS_COUNT})",
    )
    parser.add_argument(
        "--reliability",
        type=Path,
        metavar="PATH.png",
        help="draw the reliability diagram of the combined readings, before and after the checkpoint's temperature",
    )
    parser.add_argument(
        "--slices",
        action="store_true",
        help="also print (and write to --json) the accuracy by label length, crop shape, case and symbols, and"
        " the most frequent character confusions",
    )
    parser.add_argument(
        "--unknown-characters",
        default="remove",
        choices=UNKNOWN_CHARACTERS,
        help="labels with characters the model cannot emit: remove those characters and score the "
        "rest (the benchmarks' protocol, default), or leave the sample out",
    )


def add_runtime_options(parser: argparse.ArgumentParser) -> None:
    """How the evaluation runs on this machine: batches, loader processes, index cache, precision."""
    parser.add_argument("--batch-size", type=positive_int, default=256, metavar="N", help="per process (default 256)")
    parser.add_argument("--workers", type=non_negative_int, default=2, help="data-loader workers per process")
    parser.add_argument(
        "--index-cache",
        default="auto",
        metavar="DIR|auto|off",
        help="where each LMDB's usable-sample index is cached, as train.py's data.index_cache",
    )
    parser.add_argument(
        "--precision",
        default="auto",
        choices=PRECISIONS,
        help="default auto: the faster of fp32 and bf16 on this machine, measured (a GPU: bf16)",
    )


def check_args(args: argparse.Namespace) -> None:
    """Fail on what the command line alone shows to be wrong, before a set is evaluated."""
    check_checkpoint_path(args.checkpoint)
    if not args.lmdbs and not args.provenance:
        raise ValueError("no LMDB to evaluate on: give one or more LMDB folders after the checkpoint")
    outputs = [option for option in ("json", "dump", "errors", "readings") if getattr(args, option) is not None]
    if not args.lmdbs and outputs:  # --provenance alone evaluates nothing: they would not be written
        raise ValueError(f"--{outputs[0]} writes an evaluation's results: give the LMDBs to evaluate on")
    for root in args.lmdbs:
        open_lmdb(root).close()  # the dataset's own errors for a missing folder or one that is no LMDB
    real = [os.path.realpath(root) for root in args.lmdbs]
    for root in args.lmdbs:
        if real.count(os.path.realpath(root)) > 1:
            raise ValueError(f"LMDB {root} is listed twice")
    check_outputs(args)
    pictures = (
        ("--errors", args.errors, args.errors_count),
        ("--readings", args.readings, args.readings_count),
        ("--reliability", args.reliability, None),
    )
    for option, path, count in pictures:
        if path is not None and path.suffix.lower() != ".png":
            raise ValueError(f"{option} {path}: the grid is written as a PNG image; give a path ending in .png")
        if path is None and count is not None:  # it would draw nothing, and say nothing
            raise ValueError(
                f"{option}-count {count} sizes the {option} picture; add {option} PATH.png or leave it out"
            )
    args.errors_count = args.errors_count or ERRORS_COUNT
    args.readings_count = args.readings_count or READINGS_COUNT


def check_outputs(args: argparse.Namespace) -> None:
    """The files written after the evaluation can be written, and replace none of its inputs nor each other:
    found out now, not after minutes of evaluating."""
    named = (
        ("--json", args.json),
        ("--dump", args.dump),
        ("--errors", args.errors),
        ("--readings", args.readings),
        ("--reliability", args.reliability),
    )
    outputs = {option: path for option, path in named if path is not None}
    inputs = {os.path.realpath(args.checkpoint): "the checkpoint"}
    inputs.update((os.path.realpath(root), f"LMDB {root}") for root in args.lmdbs)
    written: dict[str, str] = {}
    for option, path in outputs.items():
        if path.is_dir():
            raise ValueError(f"{option} {path} is a folder; give a file name")
        if option != "--json" and not path.parent.is_dir():  # --json creates its folder
            raise FileNotFoundError(f"{option} {path}: folder {path.parent} does not exist")
        real = os.path.realpath(path)
        for place in (real, os.path.dirname(real)):  # the checkpoint itself, or a file inside an LMDB folder
            if place in inputs:
                raise ValueError(f"{option} {path} would overwrite {inputs[place]}; write it elsewhere")
        if real in written:
            raise ValueError(f"{option} and {written[real]} both name {path}; give each its own file")
        written[real] = option
        check_writable(path, f"{option} {path}")


def set_names(roots: list[str]) -> list[str]:
    """A benchmark's conventional name, else the folder's name; the path where two names would clash."""
    conventional = {**{name.lower(): name for name in BENCHMARKS}, **ALIASES}
    folders = [Path(os.path.abspath(root)).name for root in roots]  # abspath: "SVT/" and "." have names too
    names = [conventional.get(folder.lower(), folder) for folder in folders]
    return [str(root) if names.count(name) > 1 else name for root, name in zip(roots, names)]


def benchmark_order(name: str) -> int:
    return BENCHMARKS.index(name) if name in BENCHMARKS else len(BENCHMARKS)


class IndexedSamples(Dataset):
    """The samples of an LmdbDataset, each with its LMDB index (1-based) for the --dump file."""

    def __init__(self, dataset: LmdbDataset) -> None:
        self.dataset = dataset
        self.transform = dataset.transform
        self.padded_widths = dataset.padded_widths

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, position: int) -> tuple[int, object]:
        return int(self.dataset.indices[position]), self.dataset[position]


class CollateWithIndices(CollateBatch):
    """CollateBatch, plus `batch.indices`: the LMDB index of each sample it keeps."""

    def __call__(self, samples: list[tuple[int, object]]) -> Batch:
        batch = super().__call__([sample for _, sample in samples])
        batch.indices = [index for index, sample in samples if sample is not None]
        return batch


def set_batches(
    dataset: LmdbDataset, args: argparse.Namespace, env: DistEnv, long_crops: LongCropTransform | None
) -> tuple[Iterable[Batch], int]:
    """This process's batches of `dataset`, and how many of its samples are read in pieces: with
    --split-long, the crops read whole, then each long crop alone (its pieces are its batch), aspect kept."""

    def loader(part: LmdbDataset, batch_size: int) -> Iterable[Batch]:
        return build_eval_loader(
            IndexedSamples(part),
            part.codec,
            batch_size,
            args.workers,
            env,
            CollateWithIndices(part.codec, part.transform.output_shape),
        )

    if long_crops is None:
        return loader(dataset, args.batch_size), 0
    whole, long = split_long_samples(dataset, long_crops)
    return itertools.chain(loader(whole, args.batch_size), loader(long, 1)), len(long)


def format_row(name: str, width: int, metrics: dict, in_lmdb: int) -> str:
    return (
        f"{name:<{width}} {metrics['scored']:>9} {in_lmdb:>8} {100 * metrics['accuracy']:>7.2f}"
        f" {metrics['one_minus_ned']:>7.4f} {100 * metrics['char_precision']:>8.2f}"
        f" {100 * metrics['char_recall']:>8.2f} {100 * metrics['cer']:>7.2f} {metrics['mean_confidence']:>6.3f}"
    )


def print_table(sets: list[dict], combined: dict, mode: str, decoder: str) -> None:
    width = max(len(COMBINED), *(len(row["name"]) for row in sets))
    print(f"metric mode {mode}: {MODE_HELP[mode]}; decoder {decoder}")
    print(
        f"{'set':<{width}} {'evaluated':>9} {'in LMDB':>8} {'acc %':>7} {'1-NED':>7} {'char P %':>8} {'char R %':>8}"
        f" {'CER %':>7} {'conf':>6}"
    )
    for row in sets:
        print(format_row(row["name"], width, row, row["in_lmdb"]))
        skipped = row["in_lmdb"] - row["samples"]
        if skipped:
            reasons = [(reason, row["dropped"].get(reason, 0)) for reason in DROP_REASONS]
            reasons.append(("undecodable image", row["undecodable_images"]))
            print(
                f"{'':<4}{skipped} of {row['in_lmdb']} not evaluated: "
                + ", ".join(f"{n} {reason}" for reason, n in reasons if n)
            )
        if row["samples"] > row["scored"]:
            print(f"{'':<4}{row['samples'] - row['scored']} of {row['in_lmdb']} left out: label empty under {mode}")
        if row["labels_shortened"]:
            print(f"{'':<4}{row['labels_shortened']} labels scored without their characters outside the alphabet")
    print(format_row(COMBINED, width, combined, combined["in_lmdb"]))
    print(
        "accuracy % by metric mode, combined: "
        + ", ".join(f"{each} {100 * combined[f'accuracy_{each}']:.2f}" for each in METRIC_MODES)
    )
    print(
        f"\naccuracy % of the most confident readings, under {mode} (the rest would go to a person or a second"
        f" reader)"
    )
    print(
        f"{'set':<{width}} "
        + " ".join(f"{'top ' + share:>8}" for share in combined["accuracy_by_confidence"])
        + f" {'all':>8}"
    )
    for row in [*sets, {**combined, "name": COMBINED}]:
        print(
            f"{row['name']:<{width}} "
            + " ".join(f"{100 * accuracy:>8.2f}" for accuracy in row["accuracy_by_confidence"].values())
            + f" {100 * row['accuracy']:>8.2f}"
        )


def accuracy_by_confidence(scored: list[tuple[float, bool]]) -> dict[str, float]:
    """The accuracy of the most confident 50, 80 and 95 % of `scored` (confidence, correct) readings."""
    ranked = sorted(scored, key=lambda pair: -pair[0])  # stable: ties keep the set's LMDB-index order
    shares = {}
    for coverage in COVERAGES:
        kept = ranked[: max(1, round(coverage * len(ranked)))]
        shares[f"{round(100 * coverage)}%"] = sum(correct for _, correct in kept) / len(kept) if ranked else 0.0
    return shares


def draw_errors(
    path: Path, sets: list[dict], predictions: list[list[tuple]], mode: str, alphabet: str, count: int
) -> int:
    """A grid of the `count` most confident misreads under `mode` (the most misleading ones); returns how many."""
    misreads = [
        (position, index, label, reading)
        for position, records in enumerate(predictions)
        for index, label, reading in records
        if is_correct(reading.text, label, mode, alphabet) is False
    ]
    misreads = sorted(misreads, key=lambda misread: -misread[3].confidence)[:count]  # stable: ties in LMDB order
    draw_readings(path, sets, misreads, empty_note=f"no misreads under {mode}", mode=mode, alphabet=alphabet)
    return len(misreads)


def draw_first_readings(
    path: Path, sets: list[dict], predictions: list[list[tuple]], mode: str, alphabet: str, count: int
) -> int:
    """A grid of each set's first `count` images in LMDB order, right and wrong; returns how many."""
    first = [(position, *record) for position, records in enumerate(predictions) for record in records[:count]]
    draw_readings(path, sets, first, empty_note="no images", mode=mode, alphabet=alphabet)
    return len(first)


def draw_readings(
    path: Path, sets: list[dict], readings: list[tuple], empty_note: str, mode: str, alphabet: str
) -> None:
    """Each (set position, LMDB index, label, reading) as the image the model read, its label and its reading
    (green where right under `mode`, red where wrong), written to `path` as a PNG."""
    cells = []
    for position, index, label, reading in readings:
        with shared_lmdb(sets[position]["path"]).begin() as txn:
            image = decode_image(bytes(txn.get(image_key(index))), "RGB")  # upright, as the model read it
        colour = "darkgreen" if is_correct(reading.text, label, mode, alphabet) else "firebrick"
        source = f"{sets[position]['name']} #{index}  confidence {reading.confidence:.3f}"
        cells.append((image, [(f"label: {label}", "black"), (f"pred: {reading.text}", colour), (source, "dimgray")]))
    grid = caption_grid(cells, empty_note=empty_note)
    png = io.BytesIO()
    grid.save(png, format="PNG")
    write_bytes_atomically(path, png.getvalue())


@dataclass(frozen=True)
class Reader:
    """The checkpoint's model and what turns a set's images into its readings."""

    model: nn.Module  # the model itself, or with --split-long a PiecewiseModel around it
    codec: CTCCodec
    transform: ImageTransform
    long_crops: LongCropTransform | None  # with --split-long
    frames: int  # the model's output frames at its input width
    precision: str
    decode: Decoder
    calibration: dict | None  # the checkpoint's temperature and what it was fitted on; None: not calibrated

    @property
    def temperature(self) -> float:
        """What the model's logits are divided by (1: not calibrated)."""
        return self.calibration["temperature"] if self.calibration else 1.0


def load_reader(args: argparse.Namespace, env: DistEnv, config: Config | None) -> Reader:
    """The Reader of `args.checkpoint`, at the precision `args.precision` picks on this machine."""
    model, codec, config, preprocessing = load_model(args.checkpoint, env.device, config)
    precision = choose_precision(
        args.precision,
        env.device,
        model,
        inference_shape(preprocessing, args.batch_size),
        training=False,
        log=print,
        is_main=env.is_main,
        group=env.cpu_group,
        option="--precision",
    )
    transform = build_transform(config, preprocessing)
    long_crops = LongCropTransform(transform) if args.split_long else None
    reader = PiecewiseModel(model, preprocessing) if args.split_long else model  # the model itself up to its width
    frames = output_frames(model, preprocessing.channels, preprocessing.height, preprocessing.width)
    decode = build_decoder(args.decoder, codec, args.lexicon, args.beam_size)
    return Reader(reader, codec, transform, long_crops, frames, precision, decode, read_calibration(args.checkpoint))


def evaluate_set(
    name: str,
    root: str,
    reader: Reader,
    args: argparse.Namespace,
    env: DistEnv,
    index_cache: Path | None,
    keep_predictions: bool,
) -> tuple[dict, dict[str, int], list, list, list[SliceSample], list]:
    """This process's shard of one set: the set's table row and metric counts (both summed over every
    process), (LMDB index, label, reading) records when `keep_predictions`, (LMDB index, confidence,
    correct) of the samples args.metric_mode scores, with --slices every sample for slice_report, and the
    samples' confidences before and after the temperature (evaluation.calibration.FrameCollector)."""
    dataset = LmdbDataset(
        root,
        reader.codec,
        reader.frames,
        reader.transform,
        remove_unknown=args.unknown_characters == "remove",
        index_cache=index_cache,
    )
    batches, in_pieces = set_batches(dataset, args, env, reader.long_crops)
    records = []  # for --dump, --errors and --readings
    confidences = []  # for the accuracy by confidence
    sliced = []  # with --slices: SliceSamples
    calibration = FrameCollector(reader.codec, args.metric_mode, reader.temperature)

    def keep(batch: Batch, readings: list[Reading], logits: Tensor) -> None:
        calibration(batch, readings, logits)
        for index, label, reading in zip(batch.indices, batch.labels, readings):
            correct = is_correct(reading.text, label, args.metric_mode, reader.codec.alphabet)
            if correct is not None:
                confidences.append((index, reading.confidence, correct))
        if args.slices:
            # The loader hands over resized images and normalised labels: the stored size comes from each
            # image's header alone, the raw label (its case, its symbols) from the LMDB.
            with shared_lmdb(root).begin() as txn:
                for index, label, reading in zip(batch.indices, batch.labels, readings):
                    size = image_size(txn.get(image_key(index)))
                    sliced.append(SliceSample(label, read_label(txn, index), reading.text, *size))
        if keep_predictions:
            records.extend(zip(batch.indices, batch.labels, readings))

    counts = evaluate(reader.model, batches, reader.codec, env, reader.precision, on_batch=keep, decode=reader.decode)
    row = {
        "name": name,
        "path": str(root),
        **summarize(counts, args.metric_mode),
        "in_lmdb": dataset.report.total,
        "dropped": dict(dataset.report.dropped),
        "labels_shortened": dataset.report.shortened,
        "undecodable_images": counts["dropped"],
        "read_in_pieces": in_pieces,
    }
    return row, counts, records, confidences, sliced, calibration.samples


def collect_results(
    args: argparse.Namespace,
    sets: list[dict],
    combined: dict[str, int],
    scored_shards: list[list[list[tuple]]],
    slice_shards: list[list[list[SliceSample]]] | None,
    calibration_shards: list[list[list[tuple]]],
    alphabet: str,
    temperature: float,
) -> dict:
    """What --json writes: each set's row and the combined one, with the accuracy of the most confident
    readings of every process, taken in LMDB-index order, and with --slices the slices of every process's
    samples (sums, so their order does not matter)."""
    by_set = [
        sorted((pair for shard in scored_shards for pair in shard[position]), key=lambda pair: pair[0])
        for position in range(len(sets))
    ]
    for row, pairs in zip(sets, by_set):
        row["accuracy_by_confidence"] = accuracy_by_confidence([pair[1:] for pair in pairs])
    frames = [[sample for shard in calibration_shards for sample in shard[position]] for position in range(len(sets))]
    for row, samples in zip(sets, frames):
        row["calibration"] = calibration_summary(calibration_report(samples, temperature))
    # The sets' keys (LMDB indices) overlap: each set's position keeps them apart, in the sets' order.
    every = [((position, key), *rest) for position, samples in enumerate(frames) for key, *rest in samples]
    combined_calibration = calibration_report(every, temperature)
    sliced = {}
    if slice_shards is not None:
        for position, row in enumerate(sets):
            row["slices"] = slice_report(
                (sample for shard in slice_shards for sample in shard[position]), args.metric_mode, alphabet
            )
        every = (sample for shard in slice_shards for samples in shard for sample in samples)
        sliced["slices"] = slice_report(every, args.metric_mode, alphabet)
    return {
        "checkpoint": str(args.checkpoint),
        "metric_mode": args.metric_mode,
        "decoder": args.decoder,
        "sets": sets,
        "combined": {
            **summarize(combined, args.metric_mode),
            "in_lmdb": sum(row["in_lmdb"] for row in sets),
            "accuracy_by_confidence": accuracy_by_confidence([pair[1:] for pairs in by_set for pair in pairs]),
            "calibration": combined_calibration,
            **sliced,
        },
    }


def calibration_summary(report: dict) -> dict:
    """A set's calibration figures for its row: the ECE before and after, without the reliability tables."""
    return {key: value for key, value in report.items() if not key.startswith("reliability")}


def print_calibration(sets: list[dict], combined: dict, mode: str, calibration: dict | None) -> None:
    """The expected calibration error of each set and the combined readings, before and after the temperature."""
    fitted = (
        f"temperature {calibration['temperature']:.3f}, fitted on {calibration.get('readings', '?')} readings of "
        f"{', '.join(Path(root).name for root in calibration.get('fitted_on', [])) or 'unrecorded sets'}"
        if calibration
        else "not calibrated: before and after are the raw confidence's (scripts/calibrate.py fits a temperature)"
    )
    print(f"\nexpected calibration error % of the word confidence ({ECE_BINS} equal bins), under {mode}; {fitted}")
    width = max(len(COMBINED), *(len(row["name"]) for row in sets))
    print(f"{'set':<{width}} {'before':>8} {'after':>8}")
    for row in [*sets, {**combined, "name": COMBINED}]:
        figures = row["calibration"]
        print(f"{row['name']:<{width}} {100 * figures['ece_before']:>8.2f} {100 * figures['ece_after']:>8.2f}")


def draw_reliability(path: Path, calibration: dict) -> None:
    """The combined readings' reliability diagram, before and after the temperature, as a PNG."""
    panels = [
        (f"before: ECE {100 * calibration['ece_before']:.2f} %", calibration["reliability_before"]),
        (
            f"after (T {calibration['temperature']:.3f}): ECE {100 * calibration['ece_after']:.2f} %",
            calibration["reliability_after"],
        ),
    ]
    png = io.BytesIO()
    reliability_diagram(panels).save(png, format="PNG")
    write_bytes_atomically(path, png.getvalue())


def report(
    args: argparse.Namespace,
    results: dict,
    shards: list[list[list[tuple]]] | None,
    seconds: float,
    env: DistEnv,
    reader: Reader,
) -> None:
    """Rank 0's part: the table, and the files asked for from every process's `shards` of predictions."""
    sets, combined = results["sets"], results["combined"]
    print_table(sets, combined, args.metric_mode, args.decoder)
    print_calibration(sets, combined, args.metric_mode, reader.calibration)
    print(f"{combined['samples'] / seconds:.0f} images/s on {env.world_size} process(es), {env.device.type}")
    if reader.long_crops is not None:
        print(
            f"{sum(row['read_in_pieces'] for row in sets)} of {combined['in_lmdb']} images were wider than "
            f"{reader.long_crops.split_ratio:.3g}:1 and were read in overlapping pieces (--split-long)"
        )
    if args.slices:
        for row in [*sets, {**combined, "name": COMBINED}]:
            print("\n" + "\n".join(format_slices(row["name"], row["slices"], args.metric_mode)))
    if shards is not None:  # each set's records from every process, in LMDB-index order
        merged = [
            sorted((record for shard in shards for record in shard[position]), key=lambda r: r[0])
            for position in range(len(sets))
        ]
    if args.dump:
        write_dump(args.dump, sets, merged, args.metric_mode, reader.codec.alphabet)
        print(f"predictions: {args.dump}")
    if args.errors:
        shown = draw_errors(args.errors, sets, merged, args.metric_mode, reader.codec.alphabet, args.errors_count)
        print(f"{shown} most confident misreads ({args.metric_mode}): {args.errors}")
    if args.readings:
        shown = draw_first_readings(
            args.readings, sets, merged, args.metric_mode, reader.codec.alphabet, args.readings_count
        )
        print(f"{shown} readings: {args.readings}")
    if args.reliability:
        draw_reliability(args.reliability, combined["calibration"])
        print(f"reliability diagram: {args.reliability}")
    if args.json:
        write_text_atomically(args.json, json.dumps(results, indent=2) + "\n")


def main() -> None:
    args = parse_args()
    check_args(args)
    config = load_config(args.config, []) if args.config else None
    if args.provenance and read_env()[0] == 0:
        print("\n".join(trained_on(load_checkpoint(args.checkpoint))), flush=True)
    if not args.lmdbs:
        return
    env = setup_distributed(device_ids=[])
    try:
        reader = load_reader(args, env, config)
        roots = sorted(zip(set_names(args.lmdbs), args.lmdbs), key=lambda pair: benchmark_order(pair[0]))
        keep_predictions = any(
            path is not None for path in (args.dump, args.errors, args.readings)
        )  # they can be large
        sets, combined, predictions, scored, sliced, calibration = [], new_counts(), [], [], [], []
        index_cache = index_cache_dir(args.index_cache)
        start = time.perf_counter()
        for name, root in roots:
            row, counts, records, confidences, samples, frames = evaluate_set(
                name, root, reader, args, env, index_cache, keep_predictions
            )
            for key in COUNT_KEYS:
                combined[key] += counts[key]
            sets.append(row)
            predictions.append(records)
            scored.append(confidences)
            sliced.append(samples)
            calibration.append(frames)
        seconds = time.perf_counter() - start
        # Every process's predictions on rank 0, merged into LMDB-index order: the same file for any NPROC.
        shards = gather_objects(predictions, env.cpu_group) if keep_predictions else None
        scored_shards = gather_objects(scored, env.cpu_group)
        slice_shards = gather_objects(sliced, env.cpu_group) if args.slices else None
        calibration_shards = gather_objects(calibration, env.cpu_group)
        if env.is_main:
            results = collect_results(
                args,
                sets,
                combined,
                scored_shards,
                slice_shards,
                calibration_shards,
                reader.codec.alphabet,
                reader.temperature,
            )
            report(args, results, shards, seconds, env, reader)
    finally:
        cleanup_distributed()


if __name__ == "__main__":
    cli.run(main, expected=(ImportError,))  # a missing optional extra (--decoder beam, lexicon): one line
