"""The training order: global batches that depend on the step alone, with or without dataset ratios."""

from __future__ import annotations

from collections import Counter

import pytest

from data.samplers import GlobalBatchSampler


def global_pairs(
    world_size: int,
    start: int = 0,
    end: int = 12,
    sizes: tuple[int, ...] = (50,),
    batch: int = 8,
    ratios: list[float] | None = None,
) -> list[list[tuple[int, int]]]:
    """Global batches `start .. end - 1` as (index, augment seed) pairs: each step's slices of all
    ranks, joined in rank order."""
    per_rank = []
    for rank in range(world_size):
        sampler = GlobalBatchSampler(list(sizes), batch, rank, world_size, seed=3, ratios=ratios)
        sampler.set_steps(start, end)
        per_rank.append(list(sampler))
    return [sum(slices, []) for slices in zip(*per_rank)]


def global_batches(*args, **kwargs) -> list[list[int]]:
    return [[index for index, _ in batch] for batch in global_pairs(*args, **kwargs)]


def test_augment_seeds_depend_on_the_step_and_place_alone():
    one = global_pairs(1, 0, 12)
    assert global_pairs(2, 0, 12) == one and global_pairs(4, 3, 12) == one[3:]
    seeds = [seed for batch in one for _, seed in batch]
    assert len(set(seeds)) == len(seeds)  # every sample of every step its own draw, repeats of an index too


def test_global_batches_do_not_depend_on_the_number_of_processes():
    one = global_batches(1)
    assert len(one) == 12 and all(len(batch) == 8 for batch in one)
    assert global_batches(2) == one and global_batches(4) == one and global_batches(8) == one
    first_epoch = sum(one[:6], [])  # 50 // 8 = 6 batches per epoch
    assert len(set(first_epoch)) == 48  # no sample twice in an epoch; the 2 left over wait for another
    assert one[6:] != one[:6]  # each epoch its own order


def test_a_resumed_run_continues_with_the_batches_it_would_have_seen():
    whole = global_batches(2, 0, 12)
    assert global_batches(2, 5, 12) == whole[5:]
    assert global_batches(1, 7, 12) == whole[7:]  # and after a change of world size


def test_ratios_fix_each_batch_s_share_of_each_dataset():
    sizes = (10, 1000)  # a small set is repeated, a large one is sampled, as the ratios say
    batches = global_batches(2, 0, 20, sizes=sizes, ratios=[0.5, 0.5])
    assert batches == global_batches(1, 0, 20, sizes=sizes, ratios=[0.5, 0.5])
    for batch in batches:
        assert Counter(index < 10 for index in batch) == {True: 4, False: 4}
    small = sum((batch for batch in batches), [])
    assert Counter(index for index in small if index < 10) == {i: 8 for i in range(10)}  # 80 draws: 8 full passes
    sampler = GlobalBatchSampler(list(sizes), 8, 0, 1, seed=3, ratios=[1, 3])
    assert sampler.drawn_per_dataset(range(5)) == [10, 30]
    plain = GlobalBatchSampler(list(sizes), 8, 0, 1, seed=3)
    assert sum(plain.drawn_per_dataset(range(50))) == 400


def test_bad_batches_and_ratios_are_errors():
    with pytest.raises(ValueError, match="does not split into 3"):
        GlobalBatchSampler([50], 8, 0, 3, seed=0)
    with pytest.raises(ValueError, match="1 ratios for 2 datasets"):
        GlobalBatchSampler([50, 50], 8, 0, 1, seed=0, ratios=[1.0])
    with pytest.raises(ValueError, match="has a ratio but no usable samples"):
        GlobalBatchSampler([50, 0], 8, 0, 1, seed=0, ratios=[0.5, 0.5])
