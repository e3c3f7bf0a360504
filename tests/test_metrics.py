from __future__ import annotations

import pytest

from utils.metrics import new_counts, summarize, update_counts


def test_metrics_on_hand_computed_examples():
    counts = new_counts()
    predictions = ["hello", "Word", "abd", ""]
    labels = ["hello", "word", "abcd", "xy"]
    update_counts(counts, predictions, labels)
    # edit distances: 0, 1 (W/w), 1 (missing c), 2 (both missing); label chars 5 + 4 + 4 + 2 = 15
    assert counts["edit_distance"] == 4 and counts["label_chars"] == 15
    metrics = summarize(counts)
    assert metrics["samples"] == 4
    assert metrics["accuracy"] == pytest.approx(1 / 4)
    assert metrics["accuracy_ignore_case"] == pytest.approx(2 / 4)
    assert metrics["cer"] == pytest.approx(4 / 15)
    # 1-NED per sample: 1, 1 - 1/4, 1 - 1/4, 0
    assert metrics["one_minus_ned"] == pytest.approx((1 + 0.75 + 0.75 + 0) / 4, abs=1e-9)


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
