"""Find evaluation images that are also in the training data: identical copies, near-duplicates and
same-label near-identical pairs, for every (training set, evaluation set) pair.

    python scripts/check_overlap.py real/IIIT5K_train_2000 real/SVT_train_257 \\
        --against benchmarks/IIIT5K_3000 benchmarks/SVT_647 --pairs overlap.png --json overlap.json
    python scripts/check_overlap.py datasets/mine --against benchmarks/IC13_857 --write-filtered datasets/mine_clean

Prints, per pair, how many training samples are identical copies (the same bytes, or the same decoded
pixels), near-duplicates (perceptual hashes within --whole-threshold bits for the whole crop or
--threshold bits for its ink box: a copy re-encoded, resized or cut by a few pixels) and how many of
those carry the same label (case folded), with examples. The same label alone is no leakage: a word occurs
in many pictures. How the hash and its thresholds were chosen: docs/data.md ("Checking for leakage between
training and evaluation sets"); the hashing and matching: data/overlap.py.

`--pairs PNG` draws example pairs (training crop beside evaluation crop, labels and Hamming distances),
`--json FILE` writes the counts and examples, `--write-filtered OUT` writes a copy of the one training set
without its flagged samples (several training sets with it are refused: filter each on its own). Files are
written under a temporary name and renamed into place. Every LMDB is opened read-only. Bad input (a path
that is not an LMDB, an empty one, an output in a missing folder, a threshold out of range) is one line,
exit code 1, before any hashing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lmdb
from PIL import Image

from data import overlap
from data.lmdb_env import first_index, highest_index, lmdb_for_scan, read_num_samples
from data.lmdb_writer import check_replaceable, write_lmdb
from evaluation.visualize import caption_grid
from utils import cli
from utils.atomic_write import write_atomically, write_text_atomically

MAX_BITS = 64
COLUMNS = (  # (count key, table heading)
    ("identical_bytes", "same bytes"),
    ("identical_pixels", "same pixels"),
    ("near_duplicate", "near-dup"),
    ("same_label", "same label"),
    ("flagged_train", "flagged train"),
    ("matched_eval", "matched eval"),
)


class BadInput(ValueError):
    """Input refused before any work: cli.run's one line and exit code 1, as every command's bad input."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("train", nargs="+", type=Path, help="training LMDB folders")
    parser.add_argument("--against", nargs="+", type=Path, required=True, help="evaluation LMDB folders")
    parser.add_argument(
        "--threshold",
        type=int,
        default=overlap.DEFAULT_INK_THRESHOLD,
        help="most bits (of 64) between the ink-box hashes of a near-duplicate "
        f"(default {overlap.DEFAULT_INK_THRESHOLD})",
    )
    parser.add_argument(
        "--whole-threshold",
        type=int,
        default=overlap.DEFAULT_WHOLE_THRESHOLD,
        help="most bits (of 64) between the whole-crop hashes of a near-duplicate "
        f"(default {overlap.DEFAULT_WHOLE_THRESHOLD})",
    )
    parser.add_argument("--examples", type=int, default=5, help="example pairs shown per set pair (default 5)")
    parser.add_argument("--pairs", type=Path, help="write a PNG of the example pairs here")
    parser.add_argument("--json", type=Path, help="write the counts and examples here, as JSON")
    parser.add_argument("--write-filtered", type=Path, help="write the training set without its flagged samples")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --write-filtered LMDB")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """Raise BadInput naming the first option or path that cannot work, before the hashing (minutes)."""
    for option, value in (("--threshold", args.threshold), ("--whole-threshold", args.whole_threshold)):
        if not 0 <= value <= MAX_BITS:
            raise BadInput(f"{option} {value}: out of range; give a number of bits from 0 to {MAX_BITS}")
    if args.examples < 0:
        raise BadInput(f"--examples {args.examples}: give 0 or more")
    for path in [*args.train, *args.against]:
        check_lmdb(path)
    if args.pairs is not None and args.pairs.suffix.lower() != ".png":
        raise BadInput(f"--pairs {args.pairs}: the picture is a PNG; end its name in .png")
    for option, path in (("--pairs", args.pairs), ("--json", args.json), ("--write-filtered", args.write_filtered)):
        if path is not None and not path.parent.is_dir():
            raise BadInput(f"{option} {path}: folder {path.parent} does not exist; create it or give another path")
        if path is not None and path.is_dir() and option != "--write-filtered":
            raise BadInput(f"{option} {path} is a folder; give a file name")
    if args.write_filtered is not None:
        if len(args.train) > 1:
            raise BadInput(
                f"--write-filtered takes one training set, {len(args.train)} were given: run once per training set"
            )
        if args.write_filtered.resolve() in {path.resolve() for path in [*args.train, *args.against]}:
            raise BadInput(f"--write-filtered {args.write_filtered} is one of the LMDBs read; give another path")
        try:
            check_replaceable(args.write_filtered, args.overwrite)
        except FileExistsError as error:
            raise BadInput(f"--write-filtered: {error}") from None


def check_lmdb(path: Path) -> None:
    """Raise BadInput where `path` is not a readable LMDB holding at least one sample."""
    try:
        with lmdb_for_scan(path) as env, env.begin() as txn:
            read_num_samples(txn, path)
            empty = highest_index(txn) < first_index(txn)
    except (OSError, ValueError, lmdb.Error) as error:
        raise BadInput(f"{cli.describe(error)} (give an LMDB folder, one holding data.mdb)") from None
    if empty:
        raise BadInput(f"{path} holds no samples (an empty LMDB): there is nothing to compare; give another LMDB")


def fingerprints(paths: list[Path]) -> dict[Path, overlap.Fingerprints]:
    found = {}
    for path in paths:
        start = time.perf_counter()
        found[path] = overlap.fingerprint_lmdb(path)
        undecodable = len(found[path].undecodable)
        print(
            f"hashed {len(found[path].indices)} images of {path} in {time.perf_counter() - start:.1f} s"
            + (f" ({undecodable} undecodable: compared by their bytes only)" if undecodable else "")
        )
    return found


def describe_match(match: overlap.Match) -> str:
    return (
        f"train #{match.train_index} {match.train_label!r} ~ eval #{match.eval_index} {match.eval_label!r}: "
        f"{match.kind}{', same label' if match.same_label else ''} (whole {match.whole_distance} bits, ink box "
        f"{match.ink_distance} bits)"
    )


def print_table(reports: list[dict]) -> None:
    names = [(str(report["train"]), str(report["eval"])) for report in reports]
    train_width = max(len("train"), *(len(train) for train, _ in names))
    eval_width = max(len("eval"), *(len(evaluation) for _, evaluation in names))
    print(f"{'train':<{train_width}}  {'eval':<{eval_width}}  " + "  ".join(heading for _, heading in COLUMNS))
    for report, (train, evaluation) in zip(reports, names):
        cells = "  ".join(f"{report['counts'][key]:>{len(heading)}}" for key, heading in COLUMNS)
        print(f"{train:<{train_width}}  {evaluation:<{eval_width}}  {cells}")
    for report in reports:
        if report["examples"]:
            print(f"{report['train']} ~ {report['eval']}:")
            for match in report["examples"]:
                print(f"  {describe_match(match)}")


def pairs_picture(reports: list[dict]) -> Image.Image:
    """The example pairs, each training crop beside its evaluation crop (two pairs a row)."""
    cells: list[tuple[Image.Image | str, list[tuple[str, str]]]] = []
    for report in reports:
        matches = report["examples"]
        train_images = overlap.read_images(report["train"], [match.train_index for match in matches])
        eval_images = overlap.read_images(report["eval"], [match.eval_index for match in matches])
        for match, train_image, eval_image in zip(matches, train_images, eval_images):
            distances = f"{match.kind}: whole {match.whole_distance}, ink {match.ink_distance} bits"
            cells.append(
                (
                    train_image,
                    [
                        (f"train {report['train'].name}#{match.train_index}", "dimgray"),
                        (match.train_label, "black"),
                        (distances, "firebrick"),
                    ],
                )
            )
            cells.append(
                (
                    eval_image,
                    [
                        (f"eval {report['eval'].name}#{match.eval_index}", "dimgray"),
                        (match.eval_label, "black"),
                        ("", "black"),
                    ],
                )
            )
    return caption_grid(cells, empty_note="no pairs found")


def json_report(args: argparse.Namespace, reports: list[dict], found: dict[Path, overlap.Fingerprints]) -> str:
    return json.dumps(
        {
            "hash": f"DCT {overlap.LOW_ROWS}x{overlap.LOW_COLUMNS} of {overlap.HASH_WIDTH}x{overlap.HASH_HEIGHT} grey,"
            " whole crop and ink box",
            "whole_threshold": args.whole_threshold,
            "ink_threshold": args.threshold,
            "max_aspect_change": overlap.MAX_ASPECT_CHANGE,
            "max_colour_change": overlap.MAX_COLOUR_CHANGE,
            "images": {str(path): len(prints.indices) for path, prints in found.items()},
            "pairs": [
                {
                    "train": str(report["train"]),
                    "eval": str(report["eval"]),
                    "counts": report["counts"],
                    "examples": [
                        {
                            "train_index": match.train_index,
                            "eval_index": match.eval_index,
                            "kind": match.kind,
                            "whole_distance": match.whole_distance,
                            "ink_distance": match.ink_distance,
                            "same_label": match.same_label,
                            "train_label": match.train_label,
                            "eval_label": match.eval_label,
                        }
                        for match in report["examples"]
                    ],
                }
                for report in reports
            ],
        },
        indent=2,
        ensure_ascii=False,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_args(args)
    start = time.perf_counter()
    found = fingerprints(list(dict.fromkeys([*args.train, *args.against])))
    reports, flagged = [], {path: set() for path in args.train}
    for train in args.train:
        for evaluation in args.against:
            matches = overlap.find_matches(found[train], found[evaluation], args.whole_threshold, args.threshold)
            flagged[train] |= overlap.flagged_indices(matches)
            reports.append(
                {
                    "train": train,
                    "eval": evaluation,
                    "counts": overlap.count_matches(matches),
                    "examples": overlap.example_matches(matches, args.examples),
                }
            )
    print_table(reports)
    for train in args.train:
        print(f"{train}: {len(flagged[train])} of {len(found[train].indices)} samples flagged against every eval set")
    print(f"checked in {time.perf_counter() - start:.1f} s")
    if args.json is not None:
        write_text_atomically(args.json, json_report(args, reports, found) + "\n")
        print(f"wrote {args.json}")
    if args.pairs is not None:
        picture = pairs_picture(reports)
        write_atomically(args.pairs, lambda file: picture.save(file, format="PNG"))
        print(f"wrote {args.pairs}")
    if args.write_filtered is not None:
        train = args.train[0]
        written = write_lmdb(args.write_filtered, overlap.kept_samples(train, flagged[train]), args.overwrite)
        print(f"wrote {written} samples of {train} to {args.write_filtered}, leaving out {len(flagged[train])} flagged")
    return 0


if __name__ == "__main__":
    cli.run(main)
