"""The training order: the same global batches for any number of processes, resumable mid-epoch."""
from __future__ import annotations

import pytest

from data.sampler import GlobalBatchSampler


def epoch_batches(world_size: int, epoch: int = 0, position: int = 0, num_samples: int = 50, batch: int = 8) -> list[list[int]]:
    """The global batches of one epoch: each step's slices of all ranks, joined in rank order."""
    per_rank = []
    for rank in range(world_size):
        sampler = GlobalBatchSampler(num_samples, batch, rank, world_size, seed=3)
        sampler.set_position(epoch, position)
        per_rank.append(list(sampler))
    return [sum(slices, []) for slices in zip(*per_rank)]


def test_global_batches_do_not_depend_on_the_number_of_processes():
    one = epoch_batches(1)
    assert len(one) == 50 // 8 and all(len(batch) == 8 for batch in one)
    assert epoch_batches(2) == one and epoch_batches(4) == one and epoch_batches(8) == one
    assert len(set(sum(one, []))) == 48  # no sample twice in an epoch; the 2 left over wait for another epoch


def test_each_epoch_has_its_own_order_and_a_seed_fixes_it():
    assert epoch_batches(2, epoch=1) != epoch_batches(2, epoch=0)
    assert epoch_batches(2, epoch=1) == epoch_batches(2, epoch=1)


def test_a_resumed_epoch_continues_where_the_stopped_one_was():
    whole = epoch_batches(2, epoch=2)
    assert epoch_batches(2, epoch=2, position=4) == whole[4:]
    assert epoch_batches(1, epoch=2, position=4) == whole[4:]  # and after a change of world size
    sampler = GlobalBatchSampler(50, 8, 0, 2, seed=3)
    sampler.set_position(0, 6)
    assert len(sampler) == 0 and list(sampler) == []


def test_bad_positions_and_batches_are_errors():
    with pytest.raises(ValueError, match="does not split into 3"):
        GlobalBatchSampler(50, 8, 0, 3, seed=0)
    with pytest.raises(ValueError, match="outside an epoch of 6 batches"):
        GlobalBatchSampler(50, 8, 0, 2, seed=0).set_position(0, 7)
