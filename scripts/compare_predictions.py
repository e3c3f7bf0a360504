"""Compare two models on the same LMDB sets from their `eval.sh --dump` files: per set and in all, each
one's word accuracy, the difference with its 95 % interval, and whether it is more than chance.

    scripts/eval.sh pretrained/english_g2.pt benchmarks/*/ --dump english_g2.tsv
    scripts/eval.sh runs/crnn/best.pt benchmarks/*/ --dump mine.tsv
    python scripts/compare_predictions.py english_g2.tsv mine.tsv [--json comparison.json]

The words both models read right, or both wrong, say nothing about which is better: the comparison
rests on the words exactly one of them reads right (exact McNemar test; evaluation/paired.py). Both
files must hold the same sets and samples, dumped under the same `--metric-mode`; a sample the mode
leaves out of either file is left out of both.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evaluation.paired import PairedComparison, compare_paired
from evaluation.prediction_dump import Dump, Scored, read_dump
from utils import cli
from utils.atomic_write import write_text_atomically

ALL = "all (weighted by words)"
SIGNIFICANCE = 0.05


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", type=Path, help="the --dump file of the model compared against (FIRST.tsv)")
    parser.add_argument("second", type=Path, help="the --dump file of the other model: differences are second - first")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the comparison here as JSON")
    return parser.parse_args(argv)


def check_same_mode(first: Dump, second: Dump, names: tuple[str, str]) -> None:
    """`correct` means one thing in both files only under one --metric-mode (a file written before the mode
    was recorded passes)."""
    if None not in (first.metric_mode, second.metric_mode) and first.metric_mode != second.metric_mode:
        raise ValueError(
            f"{names[0]} was scored under --metric-mode {first.metric_mode} and {names[1]} under "
            f"{second.metric_mode}: dump both models under the same mode"
        )


def paired_readings(first: Scored, second: Scored, names: tuple[str, str]) -> dict[str, tuple[list[bool], list[bool]]]:
    """For each set, both models' right/wrong readings of the samples scored in both files, in one order."""
    if list(first) != list(second):
        raise ValueError(
            f"{names[0]} holds the sets {list(first)} and {names[1]} {list(second)}: dump both models on the same LMDBs"
        )
    paired = {}
    for name, samples in first.items():
        others = second[name]
        if samples.keys() != others.keys():
            index = min(samples.keys() ^ others.keys())
            where = names[0] if index in samples else names[1]
            raise ValueError(f"set {name}: sample {index} is in {where} only; dump both models on the same LMDBs")
        readings: tuple[list[bool], list[bool]] = ([], [])
        for index, (label, correct) in samples.items():
            other_label, other_correct = others[index]
            if not same_label(label, other_label):
                raise ValueError(
                    f"set {name}, sample {index}: labelled {label!r} in {names[0]} and {other_label!r} in {names[1]}; "
                    "dump both models on the same LMDBs"
                )
            if correct is not None and other_correct is not None:
                readings[0].append(correct)
                readings[1].append(other_correct)
        paired[name] = readings
    return paired


def same_label(first: str, second: str) -> bool:
    """Whether two dumps' labels can be one LMDB label: each model writes it as it compares it, case-folded
    if it folds case and without the characters its alphabet lacks (data.unknown_characters: remove), so
    the letters and digits of one must be those of the other, or some of them in the same order."""
    first, second = ("".join(filter(str.isalnum, label.casefold())) for label in (first, second))
    shorter, longer = sorted((first, second), key=len)
    remaining = iter(longer)
    return all(character in remaining for character in shorter)  # a subsequence: `in` advances the iterator


def verdict(comparison: PairedComparison) -> str:
    if comparison.p_value >= SIGNIFICANCE:
        return "within chance"
    return "second reads more" if comparison.difference > 0 else "first reads more"


def as_record(comparison: PairedComparison) -> dict[str, float | int | str | list[float]]:
    return {
        "words": comparison.samples,
        "first_accuracy": round(comparison.first_accuracy, 4),
        "second_accuracy": round(comparison.second_accuracy, 4),
        "difference": round(comparison.difference, 4),
        "interval_95": [round(bound, 4) for bound in comparison.interval],
        "first_only": comparison.first_only,
        "second_only": comparison.second_only,
        "p_value": comparison.p_value,
        "verdict": verdict(comparison),
    }


def print_table(comparisons: dict[str, PairedComparison], first: Path, second: Path) -> None:
    print(f"first:  {first}\nsecond: {second}")
    width = max(len(name) for name in comparisons)
    print(
        f"{'set':<{width}}  {'words':>6}  {'first %':>7}  {'second %':>8}  {'difference':>10}  {'95 % interval':>16}"
        f"  {'first only':>10}  {'second only':>11}  {'p':>7}  reading"
    )
    for name, comparison in comparisons.items():
        low, high = comparison.interval
        print(
            f"{name:<{width}}  {comparison.samples:>6}  {comparison.first_accuracy:>7.2f}  "
            f"{comparison.second_accuracy:>8.2f}  {comparison.difference:>+10.2f}  {f'[{low:+.2f}, {high:+.2f}]':>16}"
            f"  {comparison.first_only:>10}  {comparison.second_only:>11}  {comparison.p_value:>7.3f}  "
            f"{verdict(comparison)}"
        )
    print(
        "difference: second - first, in points; p: exact McNemar test on the words one model alone reads right; "
        f"'within chance' where p >= {SIGNIFICANCE}"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.json is not None and args.json.suffix.lower() != ".json":
        raise ValueError(f"--json {args.json}: the comparison is written as JSON; give a path ending in .json")
    first, second = read_dump(args.first), read_dump(args.second)
    names = (str(args.first), str(args.second))
    check_same_mode(first, second, names)
    paired = paired_readings(first.scored, second.scored, names)
    comparisons = {name: compare_paired(*readings) for name, readings in paired.items()}
    if len(comparisons) > 1:
        comparisons[ALL] = compare_paired(
            [correct for first, _ in paired.values() for correct in first],
            [correct for _, second in paired.values() for correct in second],
        )
    print_table(comparisons, args.first, args.second)
    if args.json is not None:
        record = {"first": str(args.first), "second": str(args.second)}
        record |= {"sets": {name: as_record(comparison) for name, comparison in comparisons.items()}}
        write_text_atomically(args.json, json.dumps(record, indent=2) + "\n")
        print(f"comparison: {args.json}")


if __name__ == "__main__":
    cli.run(main)
