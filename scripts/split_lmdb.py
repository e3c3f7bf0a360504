"""Split labelled LMDBs into a training LMDB and a held-out validation LMDB, drawn at random with a
seed: the validation set that picks best.pt when you fine-tune on your own real crops.

    python scripts/split_lmdb.py real/IIIT5K_train_2000 real/SVT_train_257 real/IC15_train_4468 \
        --val 672 --out datasets/real
    python scripts/split_lmdb.py datasets/mine --val 10% --out datasets/mine_split --seed 1

writes OUT/train and OUT/val. The samples of all the given LMDBs are pooled, shuffled once with
`--seed` and the first `--val` of them held out (a count, or a share such as 10%); each split keeps
the samples in the order they came. Image bytes, labels and any `meta-` keys are copied unchanged; each
split's meta.json says what it is a split of and carries the sources' meta.json records (docs/data.md).
The sources are opened read-only, and both splits are built beside their folders and renamed into place
together at the end: stopped part way, the splits that were there stay as they were.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from pathlib import Path
from typing import Any

from data.lmdb_writer import check_replaceable, copied_samples, fill_lmdb, labelled_samples, staged_lmdb
from data.provenance import NOT_GIVEN, new_meta, read_meta, write_meta
from utils import cli


def parse_val(spec: str) -> tuple[int | None, float | None]:
    """`--val` as (count, None) for "672" or (None, share) for "10%"."""
    try:
        if spec.endswith("%"):
            share = float(spec[:-1]) / 100
            if 0 < share < 1:
                return None, share
        elif int(spec) > 0:
            return int(spec), None
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{spec!r}: give a count of samples (672) or a share between 0 and 100 % (10%)")


def held_out_count(total: int, count: int | None, share: float | None) -> int:
    held_out = count if count is not None else round(total * share)
    if not 0 < held_out < total:
        raise ValueError(
            f"--val takes {held_out} of the {total} labelled samples; both splits need at least one: give a"
            f" count between 1 and {total - 1}"
        )
    return held_out


def source_records(sources: list[Path]) -> list[dict[str, Any]]:
    """Each source's meta.json with its path; a source without one is named as such."""
    return [{"path": str(source), **(read_meta(source) or {"notes": "no meta.json"})} for source in sources]


def split_meta(
    args: argparse.Namespace, split: str, count: int, total: int, records: list[dict[str, Any]]
) -> dict[str, Any]:
    """A split's meta.json: what it is a split of, and the sources' records, whose licences still apply."""
    licences = sorted({record.get("licence", NOT_GIVEN) for record in records})
    return {
        **new_meta(
            f"{args.out.name}/{split}",
            f"split of {', '.join(map(str, args.sources))} (seed {args.seed}, {count} of {total} samples)",
            "; ".join(licences),
            sources=records,
        ),
        "samples": count,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sources", nargs="+", type=Path, help="LMDB folders to pool and split")
    parser.add_argument("--out", type=Path, required=True, help="folder to write OUT/train and OUT/val in")
    parser.add_argument(
        "--val", type=parse_val, required=True, help="how many to hold out: a count (672) or a share (10%%)"
    )
    parser.add_argument("--seed", type=int, default=0, help="draws which samples are held out (default 0)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing OUT/train and OUT/val LMDBs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if len(set(map(Path.resolve, args.sources))) < len(args.sources):
        raise ValueError("an LMDB is given twice: its samples would be in both splits; give each once")
    splits = {"train": args.out / "train", "val": args.out / "val"}
    for path in splits.values():
        if path.resolve() in map(Path.resolve, args.sources):
            raise ValueError(
                f"--out {args.out} would write over {path}, one of the LMDBs being split: give another --out"
            )
        check_replaceable(path, args.overwrite)
    records = source_records(args.sources)  # before the scan: a bad meta.json stops the split at once
    samples = labelled_samples(args.sources)
    val_count = held_out_count(len(samples), *args.val)
    shuffled = samples.copy()
    random.Random(args.seed).shuffle(shuffled)
    held_out = set(shuffled[:val_count])
    chosen = {
        "val": [sample for sample in samples if sample in held_out],
        "train": [sample for sample in samples if sample not in held_out],
    }
    # Both splits are staged and renamed into place together: written one after the other, a crash
    # between them would leave a new val beside an old train that holds some of its samples.
    with staged_lmdb(splits["val"]) as val_folder, staged_lmdb(splits["train"]) as train_folder:
        written = {}
        for name, folder in (("val", val_folder), ("train", train_folder)):
            written[name] = fill_lmdb(folder, copied_samples(args.sources, chosen[name]))
            write_meta(folder, split_meta(args, name, written[name], len(samples), records))
    for name in ("val", "train"):
        by_source = Counter(source_number for source_number, _ in chosen[name])
        origins = ", ".join(f"{count} from {args.sources[number]}" for number, count in sorted(by_source.items()))
        print(f"wrote {written[name]} samples to {splits[name]} ({origins})")


if __name__ == "__main__":
    cli.run(main)
