from __future__ import annotations

import random

import pytest

from evaluation.metrics import (
    MAX_SAMPLE_LOSS,
    counts_to_tensor,
    lcs_length,
    new_counts,
    summarize,
    tensor_to_counts,
    update_counts,
)


def test_metrics_on_hand_computed_examples():
    counts = new_counts()
    predictions = ["hello", "Word", "abd", ""]
    labels = ["hello", "word", "abcd", "xy"]
    update_counts(counts, predictions, labels)
    # edit distances: 0, 1 (W/w), 1 (missing c), 2 (both missing); label chars 5 + 4 + 4 + 2 = 15
    assert counts["edit_distance_exact"] == 4 and counts["label_chars_exact"] == 15
    metrics = summarize(counts)
    assert metrics["samples"] == 4
    assert metrics["accuracy"] == pytest.approx(1 / 4)
    assert metrics["accuracy_ignore_case"] == pytest.approx(2 / 4)
    assert metrics["cer"] == pytest.approx(4 / 15)
    # 1-NED per sample: 1, 1 - 1/4, 1 - 1/4, 0
    assert metrics["one_minus_ned"] == pytest.approx((1 + 0.75 + 0.75 + 0) / 4, abs=1e-9)
    # matched characters (LCS): 5 + 3 (ord) + 3 + 0, of 5 + 4 + 3 + 0 predicted and 15 label characters
    assert metrics["char_precision"] == 11 / 12 and metrics["char_recall"] == 11 / 15


def lcs_by_table(first: str, second: str) -> int:
    table = [[0] * (len(second) + 1) for _ in range(len(first) + 1)]
    for i, a in enumerate(first):
        for j, b in enumerate(second):
            table[i + 1][j + 1] = table[i][j] + 1 if a == b else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def test_bit_parallel_lcs_equals_the_textbook_table():
    rng = random.Random(0)
    pairs = [("", ""), ("abc", ""), ("", "abc"), ("abcbdab", "bdcaba"), ("aaaa", "aa"), ("中文字", "文中字")]
    pairs += [
        ("".join(rng.choices("abc", k=rng.randint(0, 70))), "".join(rng.choices("abc", k=rng.randint(0, 70))))
        for _ in range(300)
    ]
    for first, second in pairs:
        assert lcs_length(first, second) == lcs_by_table(first, second) == lcs_length(second, first), (first, second)


def test_sums_from_shards_equal_the_whole():
    predictions = ["a", "bb", "ccc", "dd", "e"]
    labels = ["a", "b", "cc", "dd", "f"]
    whole = new_counts()
    update_counts(whole, predictions, labels)
    shard_a, shard_b = new_counts(), new_counts()
    update_counts(shard_a, predictions[0::2], labels[0::2])
    update_counts(shard_b, predictions[1::2], labels[1::2])
    assert {k: shard_a[k] + shard_b[k] for k in whole} == whole


def test_empty_evaluation_is_zero_not_an_error():
    assert summarize(new_counts())["accuracy"] == 0.0


def test_a_diverged_models_losses_sum_without_overflow():
    # Before: a fine-tune at a learning rate that wrecked the model stopped its validation with
    # `Overflow when unpacking long long` (a loss of 10^12 in the fixed-point sum); NaN was `cannot convert
    # float NaN to integer`.
    counts = new_counts()
    update_counts(counts, ["a", "b", "c"], ["a", "b", "c"], losses=[1e15, float("nan"), float("inf")])
    totals = tensor_to_counts(counts_to_tensor(counts))
    assert summarize(totals)["loss"] == MAX_SAMPLE_LOSS
