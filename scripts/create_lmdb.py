"""Convert your own labelled images into an LMDB that training reads.

    python scripts/create_lmdb.py --images synthetic/words --gt synthetic/words/gt.txt --out datasets/words/train
    python scripts/create_lmdb.py --images ROOT --gt GT_FILE --out LMDB --check-alphabet alphabet.txt --overwrite

GT_FILE is UTF-8 text, one `relative/path<TAB>label` per line, paths relative to ROOT; blank lines are
ignored. Every image is fully decoded once to check it, as training decodes it, then its original file
bytes are stored as they are (no re-encoding). Lines that fail a check are skipped and reported, grouped
by reason. An image listed again (under the same path or another spelling of it: `./a.jpg`, `a.jpg`)
with the same label is stored once; with another label it is an error, and nothing is written. So is a
line with a third column (a tab in the label: which column is the label is not guessed), and a label
holding a character that prints nothing (U+200B ZERO WIDTH SPACE, a control character: one
--check-alphabet lists is kept). A label's surrounding whitespace is removed, and each such line is
listed before anything is written. Images are read in the formats training reads (docs/data.md); one
of several frames (an animated GIF or PNG, a TIFF of pages) is skipped, as the frame the label
describes is not guessed. OUT/meta.json records where the data came from (--source, --licence; "not given"
where left out), the command and the date: training carries it into the run folder and its checkpoints
(docs/data.md).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from data.alphabet import describe_character, invisible_characters, load_alphabet
from data.image_formats import FormatNotRead, frame_count
from data.lmdb_writer import write_lmdb
from data.provenance import new_meta
from data.transforms import decode_image
from utils import cli

EXAMPLES_PER_REASON = 3


class BadLine(Exception):
    """A GT line that cannot become a sample: `reason` groups the report, `detail` is about this line."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


def parse_line(line: str) -> tuple[str, str]:
    """(relative path, label) of a GT line, the label without surrounding whitespace: a word crop has
    no space at its edges for the model to read, so a label ' cat' or 'cat ' would score every reading
    of it wrong. BadLine if there is no tab."""
    relative_path, has_tab, label = line.partition("\t")
    if not has_tab:
        raise BadLine("line has no tab between path and label")
    return relative_path, label.strip()


def check_sample(root: Path, line: str, alphabet: set[str] | None) -> tuple[bytes, str]:
    """The `(image_bytes, label)` a GT line names, or BadLine saying why it cannot be used."""
    relative_path, label = parse_line(line)
    if not label:
        raise BadLine("empty label")
    if alphabet is not None and not set(label) <= alphabet:
        raise BadLine("label has characters outside the alphabet", "".join(sorted(set(label) - alphabet)))
    path = root / relative_path
    if not path.is_file():
        raise BadLine("image file missing")
    image_bytes = path.read_bytes()
    if not image_bytes:
        raise BadLine("image file empty")
    try:
        # Decode the very bytes that will be stored, in full (what catches truncated files), as training will.
        width, height = decode_image(image_bytes, "L").size
        frames = frame_count(image_bytes)
    except FormatNotRead as error:
        raise BadLine("image in a format training does not read", str(error)) from error
    except Exception as error:  # Pillow's plugins raise many types (OSError, SyntaxError, ValueError, ...)
        raise BadLine("image cannot be decoded", f"{type(error).__name__}: {error}") from error
    if width == 0 or height == 0:
        raise BadLine("image has zero width or height", f"{width}x{height}")
    if frames > 1:  # which frame the label describes is not guessed: training would read the first
        raise BadLine(
            "image holds several frames (an animation, or pages); training reads only the first: save the"
            " frame that shows the label as an image of its own",
            f"{frames} frames",
        )
    return image_bytes, label


def gt_lines(gt_file: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of every non-blank line of `gt_file`."""
    # utf-8-sig: editors on Windows start files with a byte-order mark that would join the first path.
    with open(gt_file, encoding="utf-8-sig") as lines:
        for number, line in enumerate(lines, start=1):
            line = line.rstrip("\n")
            if line.strip():
                yield number, line


@dataclass
class GtCheck:
    """What a first pass over the GT file found, before anything is written."""

    repeats: dict[int, int] = field(default_factory=dict)  # line number -> the first line listing its image
    conflicts: list[str] = field(default_factory=list)  # an image given two labels, described
    extra_columns: list[str] = field(default_factory=list)  # lines with a tab in the label, described
    stripped: list[str] = field(default_factory=list)  # labels stored without surrounding whitespace, described
    invisible: list[str] = field(default_factory=list)  # labels holding characters that print nothing, described
    outside: list[str] = field(default_factory=list)  # paths leading out of --images, described


def inside(image: str, resolved_root: str) -> bool:
    """Whether `image` lies under `resolved_root`, both with their symbolic links resolved. A GT file may
    come from someone else: `../`, an absolute path or a link leading out would store any image this
    user can read in an LMDB that is then shared."""
    return os.path.commonpath([resolved_root, image]) == resolved_root


def check_gt(root: Path, gt_file: Path, alphabet: set[str] | None = None) -> GtCheck:
    """Images the GT lists more than once (however the path is spelled), lines with more than two
    columns, labels with surrounding whitespace, and labels holding characters that print nothing
    (data.alphabet.invisible_characters) which `alphabet` does not list; and paths that lead out of `root`."""
    first: dict[str, tuple[int, str]] = {}
    resolved_root = os.path.realpath(root)
    found = GtCheck()
    for number, line in gt_lines(gt_file):
        try:
            relative_path, label = parse_line(line)
        except BadLine:  # skipped anyway, and reported as such
            continue
        if not label:  # skipped anyway, and reported as such
            continue
        if "\t" in label:
            columns = line.count("\t") + 1
            found.extra_columns.append(f"line {number}: {line!r} has {columns} columns")
            continue
        written = line.partition("\t")[2]
        if label != written:
            found.stripped.append(f"line {number}: {written!r} -> {label!r}")
        invisible = [char for char in invisible_characters(label) if alphabet is None or char not in alphabet]
        if invisible:
            names = ", ".join(describe_character(char) for char in invisible)
            found.invisible.append(f"line {number}: {label!r} holds {names}")
        image = os.path.realpath(root / relative_path)
        if not inside(image, resolved_root):
            found.outside.append(f"line {number}: {relative_path!r} is {image}")
        if image not in first:
            first[image] = (number, label)
        elif first[image][1] == label:
            found.repeats[number] = first[image][0]
        else:
            found.conflicts.append(
                f"{relative_path}: line {first[image][0]} says {first[image][1]!r}, line {number}" f" says {label!r}"
            )
    return found


def read_samples(
    root: Path, gt_file: Path, alphabet: set[str] | None, skipped: dict[str, list[str]], repeats: dict[int, int]
) -> Iterator[tuple[bytes, str]]:
    """Yield `(image_bytes, label)` for each good line of `gt_file`; record the others in `skipped`.

    `skipped` maps a reason to its lines, as "line N: path (detail)". A generator, so images stream
    into the LMDB instead of being held in memory.
    """
    for number, line in gt_lines(gt_file):
        try:
            if number in repeats:
                raise BadLine(
                    "image listed again, with the same label (stored once)", f"first at line {repeats[number]}"
                )
            yield check_sample(root, line, alphabet)
        except BadLine as bad:
            relative_path = line.partition("\t")[0]
            where = f"line {number}: {relative_path}"
            skipped[bad.reason].append(f"{where} ({bad.detail})" if bad.detail else where)


def shown(descriptions: list[str]) -> str:
    """The first EXAMPLES_PER_REASON descriptions, one per indented line, and how many more."""
    more = len(descriptions) - EXAMPLES_PER_REASON
    return "\n  ".join(descriptions[:EXAMPLES_PER_REASON]) + (f"\n  ... and {more} more" if more > 0 else "")


def report_skipped(skipped: dict[str, list[str]]) -> None:
    for reason, examples in skipped.items():
        print(f"skipped {len(examples)}: {reason}")
        for example in examples[:EXAMPLES_PER_REASON]:
            print(f"    {example}")
        if len(examples) > EXAMPLES_PER_REASON:
            print(f"    ... and {len(examples) - EXAMPLES_PER_REASON} more")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, required=True, help="ROOT folder the GT paths are relative to")
    parser.add_argument("--gt", type=Path, required=True, help="GT_FILE: lines of `relative/path<TAB>label`")
    parser.add_argument("--out", type=Path, required=True, help="LMDB folder to create")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument(
        "--check-alphabet", metavar="SPEC", help="skip labels with characters outside this alphabet (or .txt file)"
    )
    parser.add_argument("--source", help="where the images and labels came from (a URL or words), for OUT/meta.json")
    parser.add_argument("--licence", help="the terms the data may be used under, for OUT/meta.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.gt.is_dir():
        sys.exit(f"error: --gt {args.gt} is a folder; give the ground-truth file (one `path<TAB>label` a line)")
    if not args.gt.is_file():
        sys.exit(f"error: --gt {args.gt} does not exist")
    if args.images.exists() and not args.images.is_dir():
        sys.exit(f"error: --images {args.images} is a file; give the folder the --gt paths are relative to")
    if not args.images.is_dir():
        sys.exit(f"error: --images {args.images} does not exist")
    if args.out.exists() and not args.overwrite:
        sys.exit(f"error: --out {args.out} already exists; remove it or pass --overwrite to replace it")
    alphabet = None
    if args.check_alphabet is not None:
        try:
            alphabet = set(load_alphabet(args.check_alphabet))
        except (OSError, ValueError) as error:
            sys.exit(f"error: --check-alphabet: {error}")

    try:
        found = check_gt(args.images, args.gt, alphabet)
    except UnicodeDecodeError as error:
        sys.exit(f"error: --gt {args.gt} is not UTF-8 text ({error}); re-save it as UTF-8")
    if found.outside:
        sys.exit(
            f"error: --gt {args.gt}: {len(found.outside)} line(s) name images outside --images {args.images} (by"
            f" ../, an absolute path or a symbolic link), which would be stored in the LMDB: copy those images"
            f" under {args.images}, or give --images a folder that holds them all; nothing was written:\n"
            f"  {shown(found.outside)}"
        )
    if found.extra_columns:
        # Refused, not guessed at: the label may be the second column or the last (`path, id, label`).
        sys.exit(
            f"error: --gt {args.gt}: {len(found.extra_columns)} line(s) have more than two tab-separated"
            f" columns; a line is path<TAB>label and a label holds no tab: keep the two columns (e.g."
            f" cut -f1,2), nothing was written:\n  {shown(found.extra_columns)}"
        )
    if found.invisible:
        # Refused, not removed: which were typed by mistake is not guessed (U+200C joins Persian letters).
        sys.exit(
            f"error: --gt {args.gt}: {len(found.invisible)} label(s) hold characters that print nothing: they"
            f" look right and are not; remove those characters from the labels (or, where the script writes"
            f" them, list them in --check-alphabet), nothing was written:\n  {shown(found.invisible)}"
        )
    if found.conflicts:
        sys.exit(
            f"error: --gt {args.gt} gives {len(found.conflicts)} image(s) two different labels; keep one line"
            f" per image, nothing was written:\n  {shown(found.conflicts)}"
        )
    if found.stripped:
        print(
            f"{len(found.stripped)} label(s) stored without their surrounding whitespace (a word crop has none"
            f" for the model to read); fix {args.gt} if a label was cut elsewhere:\n  {shown(found.stripped)}"
        )
    skipped: dict[str, list[str]] = defaultdict(list)
    samples = read_samples(args.images, args.gt, alphabet, skipped, found.repeats)
    # Look for one good sample first: with none, --overwrite must not replace a good LMDB by an empty one.
    first = next(samples, None)
    if first is None:
        report_skipped(skipped)
        sys.exit(f"error: no valid samples in {args.gt}; nothing written to {args.out}")
    progress = tqdm(itertools.chain([first], samples), desc="checked and written", unit="img")
    meta = new_meta(args.out.name, args.source, args.licence)
    written = write_lmdb(args.out, progress, overwrite=args.overwrite, meta=meta)
    report_skipped(skipped)
    total_skipped = sum(len(examples) for examples in skipped.values())
    print(f"wrote {written} samples to {args.out} (skipped {total_skipped})")


if __name__ == "__main__":
    cli.run(main)
