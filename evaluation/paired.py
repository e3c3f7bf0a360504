"""Whether two models' word accuracies on the same samples differ by more than chance.

Two models read the same words, so their accuracies are paired: the words both read right or both
wrong say nothing about which is better, and only the words exactly one of them reads right do. The
test is McNemar's, exact (a two-sided binomial test of those words against an even split), and the
interval is the usual one for a difference of paired proportions (normal approximation). Two training
runs of one recipe read IIIT5K's 3,000 words up to a point apart (docs/real-text.md), so a table that
ranks models a few tenths apart says nothing without this.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z_95 = 1.959963984540054  # the standard normal's 97.5th percentile: a two-sided 95 % interval


@dataclass(frozen=True)
class PairedComparison:
    """Two models on the same `samples` words; accuracies and differences in percentage points."""

    samples: int
    first_correct: int
    second_correct: int
    first_only: int  # read right by the first model alone
    second_only: int  # read right by the second model alone

    @property
    def first_accuracy(self) -> float:
        return 100 * self.first_correct / self.samples if self.samples else 0.0

    @property
    def second_accuracy(self) -> float:
        return 100 * self.second_correct / self.samples if self.samples else 0.0

    @property
    def difference(self) -> float:
        """The second model's accuracy minus the first's."""
        return 100 * (self.second_only - self.first_only) / self.samples if self.samples else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        """The 95 % interval of `difference` (normal approximation for paired proportions)."""
        if not self.samples:
            return 0.0, 0.0
        n, first, second = self.samples, self.first_only, self.second_only
        variance = (first + second - (second - first) ** 2 / n) / n**2
        half_width = 100 * Z_95 * math.sqrt(max(variance, 0.0))
        return self.difference - half_width, self.difference + half_width

    @property
    def p_value(self) -> float:
        """Exact two-sided McNemar test: how likely a split of the discordant words at least this uneven
        is if both models were equally good. 1.0 when no word is read right by one model alone."""
        return mcnemar_exact(self.first_only, self.second_only)


def mcnemar_exact(first_only: int, second_only: int) -> float:
    """Two-sided exact binomial test of `first_only` against `second_only` words at even odds."""
    discordant = first_only + second_only
    fewer = min(first_only, second_only)
    tail, term = 0, 1  # term: C(discordant, k), each from the one before, exactly
    for k in range(fewer + 1):
        tail += term
        term = term * (discordant - k) // (k + 1)
    return min(1.0, 2 * tail / 2**discordant)  # integers: exact for any count, rounded once


def compare_paired(first: Sequence[bool], second: Sequence[bool]) -> PairedComparison:
    """The comparison of two models' right/wrong readings of the same samples, in the same order."""
    if len(first) != len(second):
        raise ValueError(f"the two models read {len(first)} and {len(second)} samples: compare the same samples")
    first_only = sum(a and not b for a, b in zip(first, second))
    second_only = sum(b and not a for a, b in zip(first, second))
    return PairedComparison(len(first), sum(first), sum(second), first_only, second_only)
