"""Recognition metrics as sums, so that shards from several processes add up exactly."""
from __future__ import annotations

import editdistance
import torch
from torch import Tensor

# Per-sample 1-NED is summed in fixed point (units of 1e-9) as an integer: integer sums do not depend
# on the order of addition, so the result is identical for any number of processes or batch size.
NED_SCALE = 10**9

COUNT_KEYS = ("samples", "correct", "correct_ignore_case", "edit_distance", "label_chars", "ned_fixed",
              "confidence_fixed", "loss_fixed")


def new_counts() -> dict[str, int]:
    return dict.fromkeys(COUNT_KEYS, 0)


def update_counts(counts: dict[str, int], predictions: list[str], labels: list[str],
                  confidences: list[float] | None = None, losses: list[float] | None = None) -> None:
    confidences = confidences or [1.0] * len(predictions)
    losses = losses or [0.0] * len(predictions)
    for prediction, label, confidence, loss in zip(predictions, labels, confidences, losses, strict=True):
        distance = editdistance.eval(prediction, label)
        counts["samples"] += 1
        counts["correct"] += prediction == label
        counts["correct_ignore_case"] += prediction.lower() == label.lower()
        counts["edit_distance"] += distance
        counts["label_chars"] += len(label)
        # 1 - normalised edit distance (ICDAR 2019): distance over the longer of the two strings.
        longer = max(len(prediction), len(label))
        counts["ned_fixed"] += round(NED_SCALE * (1 - distance / longer)) if longer else NED_SCALE
        counts["confidence_fixed"] += round(NED_SCALE * confidence)
        counts["loss_fixed"] += round(NED_SCALE * loss)


def counts_to_tensor(counts: dict[str, int]) -> Tensor:
    return torch.tensor([counts[key] for key in COUNT_KEYS], dtype=torch.int64)


def tensor_to_counts(tensor: Tensor) -> dict[str, int]:
    return dict(zip(COUNT_KEYS, tensor.tolist()))


def summarize(counts: dict[str, int]) -> dict[str, float | int]:
    """Word accuracy, case-insensitive word accuracy, character error rate and 1-NED, from sums."""
    samples = counts["samples"]
    return {
        "samples": samples,
        "accuracy": counts["correct"] / samples if samples else 0.0,
        "accuracy_ignore_case": counts["correct_ignore_case"] / samples if samples else 0.0,
        "cer": counts["edit_distance"] / counts["label_chars"] if counts["label_chars"] else 0.0,
        "one_minus_ned": counts["ned_fixed"] / NED_SCALE / samples if samples else 0.0,
        # Float noise (batch composition, thread count) moves confidences and losses in their last
        # digits, so these two can differ there between runs with other batch sizes or process counts.
        "mean_confidence": counts["confidence_fixed"] / NED_SCALE / samples if samples else 0.0,
        "loss": counts["loss_fixed"] / NED_SCALE / samples if samples else 0.0,
    }
