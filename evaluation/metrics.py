"""Recognition metrics as sums, so that shards from several processes add up exactly.

Every string metric is counted under each of four metric modes, which say which differences between
a prediction and its label count as errors:

- `benchmark`: the field's protocol for English scene-text benchmarks, as deep-text-recognition-benchmark's
  test.py and parseq's CharsetAdapter apply it: both lowercased, every character outside `[0-9a-z]`
  deleted from both, then an exact match. Whatever the model's alphabet: `CHANNEL_` reads `CHANNEL`,
  `41 KM` reads `41KM`.
- `exact`: every difference.
- `ignore_case`: both lowercased first.
- `ignore_case_symbols`: both lowercased, then every character dropped that is neither alphanumeric
  (`str.isalnum`, so letters and digits of any script) nor one of the model's own alphabet: for
  alphabets beyond `[0-9a-z]` (accented Latin, Greek, CJK), where `benchmark` would delete the text itself.

A sample whose label is empty in a mode's compared form (a label of symbols only, under `benchmark`)
cannot be read right or wrong there: it is left out of that mode's figures and counted (`scored_<mode>`).
"""

from __future__ import annotations

import re
from functools import lru_cache

import editdistance
import torch
from torch import Tensor

METRIC_MODES = ("benchmark", "exact", "ignore_case", "ignore_case_symbols")
OUTSIDE_BENCHMARK_CHARSET = re.compile("[^0-9a-z]")

# Per-sample 1-NED, confidence and loss are summed in fixed point (units of 1e-9) as integers: integer
# sums do not depend on the order of addition, so the result is identical for any number of processes
# or batch size.
NED_SCALE = 10**9
# A sample's loss counts at most this much (a diverging model's, or infinity where no alignment exists):
# a CTC loss of 1,000 is a model that reads nothing, and at this cap 9 million samples still sum within
# int64 (the fixed-point sum of a model whose loss reached 10^12 overflowed, and validation stopped there).
MAX_SAMPLE_LOSS = 1_000.0

# Sums kept once per mode, as `<key>_<mode>`: matched characters are those of a longest common
# subsequence of prediction and label (characters read, in the right order).
MODE_KEYS = ("scored", "correct", "edit_distance", "label_chars", "pred_chars", "matched_chars", "ned_fixed")
COUNT_KEYS = (
    "samples",
    "confidence_fixed",
    "loss_fixed",
    *(f"{key}_{mode}" for mode in METRIC_MODES for key in MODE_KEYS),
)


def new_counts() -> dict[str, int]:
    return dict.fromkeys(COUNT_KEYS, 0)


def compared_form(text: str, mode: str, alphabet: str = "") -> str:
    """`text` as `mode` compares it; `alphabet` (the model's) lists the symbols ignore_case_symbols keeps."""
    if mode == "exact":
        return text
    text = text.lower()
    if mode == "ignore_case":
        return text
    if mode == "benchmark":
        return OUTSIDE_BENCHMARK_CHARSET.sub("", text)
    if mode != "ignore_case_symbols":
        raise ValueError(f"unknown metric mode {mode!r}; choose one of {', '.join(METRIC_MODES)}")
    kept = alphabet_characters(alphabet)
    return "".join(char for char in text if char.isalnum() or char in kept)


def is_correct(prediction: str, label: str, mode: str, alphabet: str) -> bool | None:
    """Whether `prediction` reads `label` under `mode`; None when `mode` leaves the sample out (empty label)."""
    truth = compared_form(label, mode, alphabet)
    return compared_form(prediction, mode, alphabet) == truth if truth else None


@lru_cache(maxsize=4)
def alphabet_characters(alphabet: str) -> frozenset[str]:
    # Cached: built once, not once per sample, for alphabets of thousands of characters.
    return frozenset(alphabet) | frozenset(alphabet.lower())


def lcs_length(first: str, second: str) -> int:
    """Length of a longest common subsequence, bit-parallel (Hyyrö 2004): one big-int step per
    character of `second`, so long text lines cost no quadratic Python loop. Bit i of `row` is 0 where
    the LCS grows at character i of `first`."""
    if not first or not second:
        return 0
    masks: dict[str, int] = {}
    for position, char in enumerate(first):
        masks[char] = masks.get(char, 0) | 1 << position
    full = (1 << len(first)) - 1
    row = full
    for char in second:
        matches = row & masks.get(char, 0)
        row = ((row + matches) | (row - matches)) & full
    return len(first) - row.bit_count()


def update_counts(
    counts: dict[str, int],
    predictions: list[str],
    labels: list[str],
    confidences: list[float] | None = None,
    losses: list[float] | None = None,
    alphabet: str = "",
) -> None:
    """Add a batch to `counts`, in every metric mode; `alphabet` is the model's (see `compared_form`)."""
    confidences = confidences or [1.0] * len(predictions)
    losses = losses or [0.0] * len(predictions)
    for prediction, label, confidence, loss in zip(predictions, labels, confidences, losses, strict=True):
        counts["samples"] += 1
        counts["confidence_fixed"] += round(NED_SCALE * confidence)
        counts["loss_fixed"] += round(NED_SCALE * (loss if loss < MAX_SAMPLE_LOSS else MAX_SAMPLE_LOSS))  # NaN too
        for mode in METRIC_MODES:
            predicted, truth = compared_form(prediction, mode, alphabet), compared_form(label, mode, alphabet)
            if not truth:
                continue
            distance = editdistance.eval(predicted, truth)
            counts[f"scored_{mode}"] += 1
            counts[f"correct_{mode}"] += predicted == truth
            counts[f"edit_distance_{mode}"] += distance
            counts[f"label_chars_{mode}"] += len(truth)
            counts[f"pred_chars_{mode}"] += len(predicted)
            counts[f"matched_chars_{mode}"] += lcs_length(predicted, truth)
            # 1 - normalised edit distance (ICDAR 2019): distance over the longer of the two strings.
            counts[f"ned_fixed_{mode}"] += round(NED_SCALE * (1 - distance / max(len(predicted), len(truth))))


def counts_to_tensor(counts: dict[str, int]) -> Tensor:
    return torch.tensor([counts[key] for key in COUNT_KEYS], dtype=torch.int64)


def tensor_to_counts(tensor: Tensor) -> dict[str, int]:
    return dict(zip(COUNT_KEYS, tensor.tolist()))


def summarize(counts: dict[str, int], mode: str = "exact") -> dict[str, float | int]:
    """The metrics of `counts`: word accuracy in every mode, and accuracy, 1-NED, character precision
    and recall and CER under `mode` (training validation uses `exact`, what the model is trained for).
    `samples` counts every sample read, `scored` those `mode` scores (see the module's docstring)."""
    if mode not in METRIC_MODES:
        raise ValueError(f"unknown metric mode {mode!r}; choose one of {', '.join(METRIC_MODES)}")

    def ratio(numerator: int, denominator: int) -> float:
        return numerator / denominator if denominator else 0.0

    samples, scored = counts["samples"], counts[f"scored_{mode}"]
    return {
        "samples": samples,
        "scored": scored,
        "accuracy": ratio(counts[f"correct_{mode}"], scored),
        **{f"accuracy_{each}": ratio(counts[f"correct_{each}"], counts[f"scored_{each}"]) for each in METRIC_MODES},
        "one_minus_ned": ratio(counts[f"ned_fixed_{mode}"], scored) / NED_SCALE,
        "char_precision": ratio(counts[f"matched_chars_{mode}"], counts[f"pred_chars_{mode}"]),
        "char_recall": ratio(counts[f"matched_chars_{mode}"], counts[f"label_chars_{mode}"]),
        "cer": ratio(counts[f"edit_distance_{mode}"], counts[f"label_chars_{mode}"]),
        # Float noise (batch composition, thread count) moves confidences and losses in their last
        # digits, so these two can differ there between runs with other batch sizes or process counts.
        "mean_confidence": ratio(counts["confidence_fixed"], samples) / NED_SCALE,
        "loss": ratio(counts["loss_fixed"], samples) / NED_SCALE,
    }
