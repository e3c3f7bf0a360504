"""Word accuracy by slice of the scored samples (eval.sh --slices), and the model's most frequent character
confusions: where a single accuracy figure hides a weakness (long words, tall crops, capitals, symbols).

Every figure uses the metric mode's own `is_correct`, so a slice's accuracies add up to the table's. The
slicings:

- label length, of the label in the mode's compared form (`compared_form`): 1-3, 4-6, 7-10, 11+;
- crop shape, the stored image's width / height (upright, as the model reads it): tall < 1, square-ish
  1-1.5, wide 1.5-6, very wide >= 6 (a lower bound belongs to its slice);
- case of the raw label, as the LMDB stores it: lower, upper, mixed, or no letters (no character with a
  case: digits, symbols, scripts without case). Raw, because a case-folding model's labels are lowercased
  and stripped of what its alphabet lacks before they are scored;
- symbols: whether the raw label holds a character outside `[0-9A-Za-z]` (what `benchmark` deletes).

The confusions are (label character, read character) pairs from a Levenshtein alignment of the reading
with the label, both in the mode's compared form; '' on one side is a deletion or an insertion.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from evaluation.metrics import compared_form, is_correct

# (name, lowest length); a length belongs to the last slice whose lowest it reaches.
LENGTH_SLICES = (("1-3", 1), ("4-6", 4), ("7-10", 7), ("11+", 11))
# (name, lowest width / height). A word crop is mostly wide (crnn.yaml's 128 x 32 input is 4); tall ones are
# single characters or vertical text, which the model stretches; very wide ones are phrases or lines, which
# it squashes.
SHAPE_SLICES = (
    ("tall (w/h < 1)", 0.0),
    ("square-ish (1-1.5)", 1.0),
    ("wide (1.5-6)", 1.5),
    ("very wide (>= 6)", 6.0),
)
CASE_SLICES = ("lower", "upper", "mixed", "no letters")
SYMBOL_SLICES = ("with symbols", "letters and digits only")
BENCHMARK_CHARSET = re.compile("[0-9A-Za-z]*")
TOP_CONFUSIONS = 10
# Each slicing's slices, in the order they are shown.
SLICINGS = {
    "label_length": tuple(name for name, _ in LENGTH_SLICES),
    "crop_shape": tuple(name for name, _ in SHAPE_SLICES),
    "label_case": CASE_SLICES,
    "label_symbols": SYMBOL_SLICES,
}


class SliceSample(NamedTuple):
    """One sample: its label as scored (the codec's normalisation, --unknown-characters), its label as the
    LMDB stores it, the model's reading, and its image's upright width and height."""

    label: str
    raw_label: str
    reading: str
    width: int
    height: int


def length_slice(length: int) -> str:
    return next(name for name, lowest in reversed(LENGTH_SLICES) if length >= lowest)


def shape_slice(width: int, height: int) -> str:
    return next(name for name, lowest in reversed(SHAPE_SLICES) if width / height >= lowest)


def case_slice(label: str) -> str:
    # Cased characters, not str.isalpha: a CJK character has no case to be right or wrong about.
    cased = [char for char in label if char.lower() != char.upper()]
    if not cased:
        return "no letters"
    if all(char == char.lower() for char in cased):
        return "lower"
    return "upper" if all(char == char.upper() for char in cased) else "mixed"


def symbol_slice(label: str) -> str:
    return SYMBOL_SLICES[1] if BENCHMARK_CHARSET.fullmatch(label) else SYMBOL_SLICES[0]


def confusions(label: str, reading: str) -> list[tuple[str, str]]:
    """The (label character, read character) pairs a Levenshtein alignment of `reading` with `label` does
    not match, in label order; '' stands for the missing side of a deletion or an insertion. Of equally
    short alignments, the one traced back from the ends preferring a match or substitution, then a
    deletion, is taken, so the result is fixed: `rn` read `m` is r->'' and n->m."""
    # distances[i][j]: edit distance of label[:i] and reading[:j]. Quadratic in Python, but only misreads
    # are aligned, and words are short.
    distances = [[i + j if i * j == 0 else 0 for j in range(len(reading) + 1)] for i in range(len(label) + 1)]
    for i in range(1, len(label) + 1):
        for j in range(1, len(reading) + 1):
            distances[i][j] = min(
                distances[i - 1][j - 1] + (label[i - 1] != reading[j - 1]),
                distances[i - 1][j] + 1,
                distances[i][j - 1] + 1,
            )
    pairs = []
    i, j = len(label), len(reading)
    while i or j:
        if i and j and distances[i][j] == distances[i - 1][j - 1] + (label[i - 1] != reading[j - 1]):
            if label[i - 1] != reading[j - 1]:
                pairs.append((label[i - 1], reading[j - 1]))
            i, j = i - 1, j - 1
        elif i and distances[i][j] == distances[i - 1][j] + 1:
            pairs.append((label[i - 1], ""))
            i -= 1
        else:
            pairs.append(("", reading[j - 1]))
            j -= 1
    return pairs[::-1]


def slice_accuracy(samples: list[tuple[str, bool]], names: Iterable[str]) -> dict[str, dict]:
    """Samples, correct ones and accuracy (None where no sample falls) of each slice `names` lists, from
    (slice name, correct) pairs."""
    totals, correct = Counter(name for name, _ in samples), Counter(name for name, right in samples if right)
    return {
        name: {
            "samples": totals[name],
            "correct": correct[name],
            "accuracy": correct[name] / totals[name] if totals[name] else None,
        }
        for name in names
    }


def slice_report(samples: Iterable[SliceSample], mode: str, alphabet: str) -> dict:
    """Samples, correct ones and accuracy under `mode` of each slice of each slicing (SLICINGS), and the
    TOP_CONFUSIONS most frequent confusions of the misreads (ties in character order). A sample `mode` does
    not score (its label is empty there) is left out, as the table leaves it out."""
    slices: list[tuple[dict[str, str], bool]] = []  # each scored sample's slice in every slicing, and correct
    counted: Counter[tuple[str, str]] = Counter()
    for sample in samples:
        correct = is_correct(sample.reading, sample.label, mode, alphabet)
        if correct is None:
            continue
        truth = compared_form(sample.label, mode, alphabet)
        which = {
            "label_length": length_slice(len(truth)),
            "crop_shape": shape_slice(sample.width, sample.height),
            "label_case": case_slice(sample.raw_label),
            "label_symbols": symbol_slice(sample.raw_label),
        }
        slices.append((which, correct))
        if not correct:
            counted.update(confusions(truth, compared_form(sample.reading, mode, alphabet)))
    top = sorted(counted.items(), key=lambda item: (-item[1], item[0]))[:TOP_CONFUSIONS]
    return {
        **{
            slicing: slice_accuracy([(which[slicing], correct) for which, correct in slices], names)
            for slicing, names in SLICINGS.items()
        },
        "confusions": [{"label": label, "read": read, "count": count} for (label, read), count in top],
    }


def format_slices(name: str, report: dict, mode: str) -> list[str]:
    """`report` (slice_report's) of set `name` as the lines eval.sh prints."""
    lines = [f"{name}: accuracy % by slice under {mode}"]
    for slicing in SLICINGS:
        cells = []
        for slice_name, entry in report[slicing].items():
            if entry["accuracy"] is None:
                cells.append(f"{slice_name}: 0 samples")
            else:
                cells.append(f"{slice_name}: {100 * entry['accuracy']:.2f} of {entry['samples']}")
        lines.append(f"  {slicing.replace('_', ' '):<14} " + ", ".join(cells))
    shown = [f"{entry['label']!r}->{entry['read']!r} {entry['count']}" for entry in report["confusions"]]
    lines.append(f"  {'confusions':<14} " + (", ".join(shown) if shown else "none"))
    return lines
