"""Look inside a text-recognition LMDB: what it holds, what is wrong with it, and a picture of samples.

    python scripts/inspect_lmdb.py datasets/synth/train
    python scripts/inspect_lmdb.py datasets/mine --montage mine.png \\
        --alphabet configs/alphabets/latin_greek_cyrillic.txt
    python scripts/inspect_lmdb.py data_lmdb_release/training/ST --fold-case --limit 100000 --decode

Prints num-samples and the keys present, meta.json (where the data came from, docs/data.md), missing keys,
histograms of label length and image width and height, image formats, labels that are empty or not UTF-8,
characters outside `--alphabet` (with `--fold-case`, as training with data.fold_case=true sees them), labels
holding characters that print nothing (U+200B, ...), images that cannot be read (or of a format training
does not read), and images of several frames (training reads the first). Image sizes come from the file
headers, without decoding the pixels; `--decode` decodes every image too, which also finds truncated files.
`--montage` draws `--samples` random samples (fixed `--seed`) with their labels. The LMDB is opened read-only
(no lock file is written).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import lmdb
from PIL import Image
from tqdm import tqdm

from data.alphabet import describe_character, invisible_characters, load_alphabet
from data.codec import CTCCodec, fold_case
from data.image_formats import FormatNotRead, open_image
from data.lmdb_env import first_index, highest_index, open_lmdb, read_num_samples
from data.lmdb_keys import LabelNotUtf8, image_key, read_label
from data.provenance import MetaError, describe_meta, read_meta
from data.transforms import decode_image, image_size
from evaluation.visualize import caption_grid
from utils import cli

EXAMPLES = 5  # indices shown per problem
HISTOGRAM_ROWS = 16
BAR_WIDTH = 40
MAX_KEY_GROUPS = 50  # key names shown; an LMDB in another format may have one group per sample


@dataclass
class Report:
    """What one pass over the samples found."""

    missing_labels: list[int] = field(default_factory=list)
    missing_images: list[int] = field(default_factory=list)
    empty_labels: list[int] = field(default_factory=list)
    not_utf8: list[int] = field(default_factory=list)
    label_lengths: Counter = field(default_factory=Counter)
    widths: Counter = field(default_factory=Counter)
    heights: Counter = field(default_factory=Counter)
    formats: Counter = field(default_factory=Counter)  # "JPEG RGB", "PNG L", ...
    undecodable: list[tuple[int, str]] = field(default_factory=list)
    outside_alphabet: Counter = field(default_factory=Counter)  # character -> occurrences
    labels_outside_alphabet: list[int] = field(default_factory=list)
    invisible: Counter = field(default_factory=Counter)  # character that prints nothing -> labels holding it
    labels_with_invisible: list[int] = field(default_factory=list)
    several_frames: list[tuple[int, int]] = field(default_factory=list)  # (index, frames): training reads the first
    complete: list[int] = field(default_factory=list)  # indices holding both a label and an image


def key_groups(txn: lmdb.Transaction) -> tuple[list[str], bool]:
    """The keys, as ranges `image-000000001 .. image-000001000` for numbered ones; and whether cut short.

    Jumps over each numbered run of keys instead of reading it, so this takes a few lookups however
    large the LMDB is.
    """
    groups: list[str] = []
    cursor = txn.cursor()
    found = cursor.first()
    while found:
        if len(groups) == MAX_KEY_GROUPS:
            return groups, True
        key = bytes(cursor.key())
        prefix = key.rstrip(b"0123456789")
        if prefix in (key, b""):  # a single key such as num-samples
            groups.append(show_key(key))
            found = cursor.next()
            continue
        found = cursor.set_range(prefix + b"\xff")  # past every key starting with `prefix`
        if found:
            cursor.prev()
        else:
            cursor.last()
        groups.append(f"{show_key(key)} .. {show_key(bytes(cursor.key()))}")
        found = cursor.next()
    return groups, False


def show_key(key: bytes) -> str:
    text = key.decode("utf-8", errors="backslashreplace")
    return text if text.isprintable() else repr(text)


def inspect_image(image_bytes: bytes, decode: bool) -> tuple[int, int, str, int]:
    """(width, height, "FORMAT MODE", frames) from the header, and every pixel too with `decode`; raises if
    unreadable, or of a format training does not read."""
    if not image_bytes:
        raise ValueError("empty value")
    with open_image(image_bytes) as image:
        if decode:
            image.load()
        kind = f"{image.format} {image.mode}"
        frames = getattr(image, "n_frames", 1)
    return (*image_size(image_bytes), kind, frames)  # upright, as training sees it


def scan(
    txn: lmdb.Transaction, indices: range, alphabet: set[str] | None, normalize: Callable[[str], str], decode: bool
) -> Report:
    report = Report()
    for index in tqdm(indices, desc="scanning", unit="sample", mininterval=2.0, disable=None):
        image_bytes = txn.get(image_key(index))
        try:
            label = read_label(txn, index, strict=True)
        except LabelNotUtf8 as error:
            report.not_utf8.append(index)
            label = error.text  # what training reads
        if label is None:
            report.missing_labels.append(index)
        else:
            label = normalize(label)
            report.label_lengths[len(label)] += 1
            invisible = invisible_characters(label)
            if invisible:
                report.invisible.update(invisible)
                report.labels_with_invisible.append(index)
            if not label:
                report.empty_labels.append(index)
            if alphabet is not None:
                unknown = [char for char in label if char not in alphabet]
                if unknown:
                    report.outside_alphabet.update(unknown)
                    report.labels_outside_alphabet.append(index)
        if image_bytes is None:
            report.missing_images.append(index)
        else:
            try:
                width, height, kind, frames = inspect_image(bytes(image_bytes), decode)
            except Image.UnidentifiedImageError:
                report.undecodable.append((index, "not an image format Pillow knows (or a corrupt header)"))
            except FormatNotRead as error:
                report.undecodable.append((index, str(error)))
            except Exception as error:  # any failure is a finding, not a crash
                report.undecodable.append((index, f"{type(error).__name__}: {error}"))
            else:
                report.widths[width] += 1
                report.heights[height] += 1
                report.formats[kind] += 1
                if frames > 1:
                    report.several_frames.append((index, frames))
        if label is not None and image_bytes is not None:
            report.complete.append(index)
    return report


def histogram(counts: Counter, unit: str = "") -> list[str]:
    """Text rows `low-high  count  ####`, at most HISTOGRAM_ROWS of them (bins of 1, 2, 5, 10, 20, ...)."""
    if not counts:
        return ["  (none)"]
    low, high = min(counts), max(counts)
    size = 1
    while (high // size - low // size + 1) > HISTOGRAM_ROWS:
        size = next(step * 10**power for power in range(12) for step in (1, 2, 5) if step * 10**power > size)
    bins = Counter()
    for value, count in counts.items():
        bins[value // size * size] += count
    peak = max(bins.values())
    rows = [f"  min {low}, median {median(counts)}, max {high}"]
    for start in range(low // size * size, high + 1, size):
        name = f"{start}" if size == 1 else f"{start}-{start + size - 1}"
        bar = "#" * max(1, round(BAR_WIDTH * bins[start] / peak)) if bins[start] else ""
        rows.append(f"  {name + unit:>12} {bins[start]:>10}  {bar}")
    return rows


def median(counts: Counter) -> int:
    """The lower median of the values `counts` counts, without expanding them."""
    seen, middle = 0, (sum(counts.values()) + 1) // 2
    for value in sorted(counts):
        seen += counts[value]
        if seen >= middle:
            return value
    raise ValueError("median of nothing")


def examples(indices: list[int]) -> str:
    shown = ", ".join(f"#{index}" for index in indices[:EXAMPLES])
    return shown + (f" and {len(indices) - EXAMPLES} more" if len(indices) > EXAMPLES else "")


def write_montage(
    txn: lmdb.Transaction, complete: list[int], path: Path, samples: int, seed: int, normalize: Callable[[str], str]
) -> None:
    """A picture of `samples` samples drawn (by `seed`) from those holding both a label and an image."""
    if not complete:
        print("montage: not written, no sample holds both a label and an image")
        return
    chosen = random.Random(seed).sample(complete, min(samples, len(complete)))
    picture = montage(txn, sorted(chosen), normalize)
    path.parent.mkdir(parents=True, exist_ok=True)
    picture.save(path)
    print(f"montage: wrote {len(chosen)} samples (seed {seed}) to {path}")


def montage(txn: lmdb.Transaction, indices: list[int], normalize: Callable[[str], str]) -> Image.Image:
    """Each sample's image fitted into a tile, with `#index: label` under it."""
    tiles = []
    for index in indices:
        label = normalize(read_label(txn, index))
        try:
            picture: Image.Image | str = decode_image(bytes(txn.get(image_key(index))), "RGB")  # as training sees it
        except Exception:  # the report above says why
            picture = "undecodable image"
        tiles.append((picture, [(f"#{index}", "dimgray"), (label, "black")]))
    return caption_grid(tiles)


def print_report(
    report: Report, alphabet: str | None, alphabet_spec: str | None, case_folded: bool, decode: bool
) -> None:
    missing = len(report.missing_labels) + len(report.missing_images)
    print(
        f"missing keys: {len(report.missing_labels)} labels, {len(report.missing_images)} images"
        + (":" if missing else "")
    )
    if report.missing_labels:
        print(f"  label missing at {examples(report.missing_labels)}")
    if report.missing_images:
        print(f"  image missing at {examples(report.missing_images)}")
    print("label length" + (" (lowercased)" if case_folded else "") + ":")
    print("\n".join(histogram(report.label_lengths)))
    empty = report.empty_labels
    print(f"empty labels: {len(empty)}" + (f" ({examples(empty)})" if empty else ""))
    if report.not_utf8:
        print(
            f"labels not valid UTF-8: {len(report.not_utf8)} ({examples(report.not_utf8)});"
            " training reads them with U+FFFD in place of the bad bytes"
        )
    print("image height (px):")
    print("\n".join(histogram(report.heights)))
    print("image width (px):")
    print("\n".join(histogram(report.widths)))
    print("image formats: " + (", ".join(f"{kind} {count}" for kind, count in report.formats.most_common()) or "none"))
    how = "decoding every image" if decode else "reading headers only; --decode also finds truncated images"
    print(f"undecodable images: {len(report.undecodable)} ({how})")
    for index, reason in report.undecodable[:EXAMPLES]:
        print(f"  #{index}: {reason}")
    if len(report.undecodable) > EXAMPLES:
        print(f"  ... and {len(report.undecodable) - EXAMPLES} more")
    if report.several_frames:
        more = len(report.several_frames) - EXAMPLES
        shown = ", ".join(f"#{index} ({frames} frames)" for index, frames in report.several_frames[:EXAMPLES])
        shown += f" and {more} more" if more > 0 else ""
        print(
            f"images of several frames: {len(report.several_frames)} ({shown});"
            " training reads the first frame alone: check it shows the label (--montage draws it)"
        )
    if report.labels_with_invisible:
        names = ", ".join(f"{describe_character(char)}: {count}" for char, count in report.invisible.most_common())
        print(
            f"labels holding characters that print nothing: {len(report.labels_with_invisible)}"
            f" ({examples(report.labels_with_invisible)}): {names}; they look right and are not: training"
            " counts them outside the alphabet unless it lists them"
        )
    if alphabet is not None:
        labels = report.labels_outside_alphabet
        print(
            f"characters outside the alphabet ({len(alphabet)} characters from {alphabet_spec}):"
            f" {len(report.outside_alphabet)} distinct, in {len(labels)} labels"
            + (f" ({examples(labels)}); training drops these samples" if labels else "")
        )
        for char, count in report.outside_alphabet.most_common(20):
            print(f"  {char!r} (U+{ord(char):04X} {unicodedata.name(char, '?')}): {count}")
        if len(report.outside_alphabet) > 20:
            print(f"  ... and {len(report.outside_alphabet) - 20} more characters")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lmdb", type=Path, help="LMDB folder (holding data.mdb)")
    parser.add_argument(
        "--alphabet",
        help="report label characters outside it: characters, or a .txt file with one" " per line (like data.alphabet)",
    )
    parser.add_argument("--fold-case", action="store_true", help="lowercase labels first, like data.fold_case=true")
    parser.add_argument("--limit", type=int, help="scan only the first N samples (for very large LMDBs)")
    parser.add_argument("--decode", action="store_true", help="decode every image, not only its header (slower)")
    parser.add_argument("--montage", type=Path, help="write a PNG of random samples with their labels here")
    parser.add_argument("--samples", type=int, default=32, help="samples in the montage (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="which samples the montage shows (default 0)")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    if args.samples < 1:
        parser.error(f"--samples must be >= 1, got {args.samples}")
    # Checked before the scan, which can take minutes, not when the picture is saved at its end.
    if args.montage is not None and Image.registered_extensions().get(args.montage.suffix.lower()) not in Image.SAVE:
        parser.error(f"--montage {args.montage}: not a picture file name Pillow can write; end it in .png or .jpg")
    return args


def read_alphabet(spec: str | None) -> str | None:
    """--alphabet's characters (None without it); a bad one ends the command with one line."""
    if spec is None:
        return None
    try:
        return load_alphabet(spec)
    except (OSError, ValueError) as error:
        sys.exit(f"error: --alphabet: {error}")


def print_contents(env: lmdb.Environment, txn: lmdb.Transaction, root: Path) -> int | None:
    """Print the LMDB's size, num-samples and key ranges; return num-samples, or None where it is unusable."""
    size = (root / "data.mdb").stat().st_size
    shown_size = f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.0f} KiB"
    print(f"{root}: {shown_size}, {env.stat()['entries']} keys")
    try:
        num_samples = read_num_samples(txn, root)
        print(f"num-samples: {num_samples}")
    except ValueError as error:  # reported, not fatal: the rest of the LMDB is still worth a look
        num_samples = None
        print(f"num-samples: {error} (training refuses this LMDB)")
    groups, cut = key_groups(txn)
    print("keys: " + "; ".join(groups) + (" ..." if cut else ""))
    return num_samples


def print_meta(root: Path) -> None:
    """The LMDB's meta.json (data/provenance.py): where its data came from, or that it does not say."""
    try:
        meta = read_meta(root)
    except MetaError as error:  # reported, not fatal, as num-samples is
        print(f"meta.json: {error} (training refuses this LMDB)")
        return
    if meta is None:
        print("meta.json: none (where the data came from is not recorded)")
        return
    print(f"meta.json: {describe_meta(meta)}")
    for name, value in meta.items():
        if name not in ("name", "samples", "source", "licence", "sources"):
            print(f"  {name}: {json.dumps(value, ensure_ascii=False)}")


def indices_to_scan(txn: lmdb.Transaction, num_samples: int | None, limit: int | None) -> range:
    """The indices training reads (up to the highest key, whatever num-samples says), cut at `limit`;
    printed, with where they disagree with num-samples."""
    first, highest = first_index(txn), highest_index(txn)
    if first == 0:
        print(
            "  index 0 holds a sample: the format counts from 1 and other readers skip it; training and" " eval read it"
        )
    if num_samples is None:
        print(f"scanning indices {first} to {highest}, the highest image-/label- key")
    elif num_samples + first - 1 > highest:
        print(
            f"  no sample beyond index {highest}, the highest image-/label- key: num-samples is wrong,"
            f" or the LMDB was cut short; scanning indices {first} to {highest}"
        )
    elif num_samples + first - 1 < highest:
        print(
            f"  samples beyond num-samples, up to index {highest}: training and eval read them all;"
            f" num-samples is wrong (scripts/create_lmdb.py writes it); scanning indices {first} to {highest}"
        )
    end = highest if limit is None else min(highest, limit)
    print(
        "scanned: no samples; training and eval refuse an LMDB without samples"
        if end < first
        else f"scanned: samples {first} to {end}" + (f" of {highest} (--limit)" if end < highest else " (all)")
    )
    return range(first, end + 1)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    alphabet = read_alphabet(args.alphabet)
    # Labels as training reads them (case folded, Unicode composed as the alphabet is), so the counts
    # below are training's; without an alphabet, only the case.
    normalize = (
        CTCCodec(alphabet, args.fold_case).normalize if alphabet is not None else fold_case if args.fold_case else str
    )
    env = open_lmdb(args.lmdb)
    try:
        with env.begin(buffers=True) as txn:
            num_samples = print_contents(env, txn, args.lmdb)
            print_meta(args.lmdb)
            indices = indices_to_scan(txn, num_samples, args.limit)
            report = scan(txn, indices, set(alphabet) if alphabet is not None else None, normalize, args.decode)
            print_report(report, alphabet, args.alphabet, args.fold_case, args.decode)
            if args.montage is not None:
                write_montage(txn, report.complete, args.montage, args.samples, args.seed, normalize)
    finally:
        env.close()


if __name__ == "__main__":
    cli.run(main)
