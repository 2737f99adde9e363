"""PruningSampler knows the DataLoader's batches: every update() is checked against the next
batch the DataLoader yielded (without ``batch_size=``, with workers prefetching ahead), and
``len()`` read between epochs is the next epoch's."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader

from hasten.sifting import PruningSampler, UnbiasedPruningConfig
from tests._helpers import Planted


def _sampler(n: int, **kw) -> tuple[Planted, PruningSampler]:
    ds = Planted(n)
    cfg = UnbiasedPruningConfig(prune_ratio=0.5, anneal_fraction=0.0, guard=None)
    return ds, PruningSampler(ds, cfg, seed=0, **kw)


def _snapshot(sampler: PruningSampler) -> tuple:
    t = sampler.table
    return t.losses.clone(), t.epoch_seen.clone(), sampler._plan.cursor


def _same(a: tuple, b: tuple) -> bool:
    return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2]


@pytest.mark.parametrize("workers", [0, 2])
def test_half_batches_fed_back_raise_at_the_first_update_without_batch_size(workers):
    # the issue: a batch of 8, update(losses[:4]) every step, no batch_size=: accepted, and
    # 28 of 32 stored losses landed on the wrong samples
    ds, sampler = _sampler(32)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=workers)
    it = iter(loader)
    x, _ = next(it)  # with workers, every batch of the epoch was drawn ahead (prefetch)
    before = _snapshot(sampler)
    with pytest.raises(ValueError) as err:
        sampler.update(x[:4])
    assert _same(before, _snapshot(sampler))
    msg = str(err.value)
    assert "received 4 losses, but batch 1 of epoch 0" in msg
    assert "has 8 samples (batch size from the DataLoader's batch_size=8)" in msg
    assert "per sample" in msg and "indices=" in msg  # the two fixes
    # the right calls go through, and every loss lands on its own sample
    sampler.update(x)
    for x, _ in it:
        sampler.update(x)
    assert torch.equal(sampler.table.losses, ds.planted)


@pytest.mark.parametrize("drop_last", [False, True])
def test_the_last_short_batch_and_drop_last(drop_last):
    ds, sampler = _sampler(20)  # batches of 8, 8 and a short one of 4
    loader = DataLoader(ds, batch_size=8, sampler=sampler, drop_last=drop_last)
    batches = [x for x, _ in loader]
    assert [len(x) for x in batches] == ([8, 8] if drop_last else [8, 8, 4])
    for x in batches[:2]:
        sampler.update(x)
    before = _snapshot(sampler)
    if drop_last:  # the DataLoader drew the last 4 indices but yields no batch for them
        with pytest.raises(RuntimeError, match=r"drops the epoch's last 4 samples"):
            sampler.update(torch.ones(4))
    else:
        with pytest.raises(ValueError, match=r"received 2 losses, but batch 3 .* has 4 samples"):
            sampler.update(torch.ones(2))
        with pytest.raises(RuntimeError, match=r"received 24 losses this epoch .* only 20"):
            sampler.update(torch.ones(8))  # a full batch's worth for the short one
    assert _same(before, _snapshot(sampler))
    if not drop_last:
        sampler.update(batches[2])
    # all the epoch's batches came back, the dropped tail aside: len() is the next epoch's
    n = len(sampler)
    assert sampler.epoch == 1 and n < 20
    assert len(loader) == len(list(loader)) == (n // 8 if drop_last else -(-n // 8))


def test_a_batch_sampler_passed_to_the_dataloader_is_read_too():
    ds, sampler = _sampler(24)
    loader = DataLoader(ds, batch_sampler=BatchSampler(sampler, 6, drop_last=False))
    it = iter(loader)
    x, _ = next(it)
    with pytest.raises(ValueError, match=r"has 6 samples \(batch size from the DataLoader's"):
        sampler.update(x[:3])


def test_batch_size_that_differs_from_the_dataloaders_raises_when_the_epoch_starts():
    ds, sampler = _sampler(24, batch_size=16)
    with pytest.raises(ValueError, match=r"batch_size=16\), but the DataLoader .* batches of 8"):
        next(iter(DataLoader(ds, batch_size=8, sampler=sampler)))
    ds, sampler = _sampler(24, batch_size=8)  # the same: fine
    for x, _ in DataLoader(ds, batch_size=8, sampler=sampler):
        sampler.update(x)
    assert torch.equal(sampler.table.losses, ds.planted)


def test_out_of_order_workers_need_indices():
    ds, sampler = _sampler(64)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2, in_order=False)
    it = iter(loader)
    x, idx = next(it)
    with pytest.raises(ValueError, match=r"in_order=False.*indices="):
        sampler.update(x)
    sampler.update(x, indices=idx)
    for x, idx in it:
        sampler.update(x, indices=idx)
    assert torch.equal(sampler.table.losses, ds.planted)


def test_a_loop_over_the_sampler_itself_learns_the_batch_from_the_first_update():
    # nothing batches the indices where the sampler can see it: the first update's length is
    # the batch size (pass batch_size= to have the first one checked too)
    ds, sampler = _sampler(20)
    order = torch.tensor(list(sampler))
    sampler.update(ds.planted[order[:5]])
    with pytest.raises(ValueError, match=r"has 5 samples \(batch size from the epoch's first"):
        sampler.update(ds.planted[order[5:9]])
    ds, sampler = _sampler(20, batch_size=5)
    list(sampler)
    with pytest.raises(ValueError, match=r"has 5 samples \(batch size from PruningSampler\("):
        sampler.update(torch.ones(4))


def test_resumed_mid_epoch_the_batches_are_checked_from_where_it_stopped():
    ds, sampler = _sampler(40)
    it = iter(DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2))
    for _ in range(2):
        x, _ = next(it)
        sampler.update(x)
    state = sampler.state_dict()
    del it
    ds, restored = _sampler(40)
    restored.load_state_dict(state)
    it = iter(DataLoader(ds, batch_size=8, sampler=restored))
    x, _ = next(it)
    with pytest.raises(ValueError, match=r"received 4 losses, but batch 3 of epoch 0"):
        restored.update(x[:4])
    restored.update(x)
    for x, _ in it:
        restored.update(x)
    assert torch.equal(restored.table.losses, ds.planted)
    assert len(restored) < 40 and restored.epoch == 1  # over: len() planned the next epoch


@pytest.mark.parametrize("workers", [0, 2])
def test_len_before_during_and_between_epochs_without_set_epoch(workers):
    ds, sampler = _sampler(64)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=workers)
    assert len(sampler) == 64 and len(loader) == 8  # epoch 0: all data
    for epoch in range(4):
        expected = len(loader)  # read before each epoch, with no set_epoch anywhere
        got = 0
        for x, _ in loader:
            assert len(sampler) == len(sampler._plan.order)  # the epoch in progress
            assert sampler.epoch == epoch
            sampler.update(x)
            got += 1
        assert got == expected, epoch
    assert len(sampler) < 64


def test_len_after_set_epoch_is_the_planned_epoch_and_iteration_keeps_it():
    ds, sampler = _sampler(64)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    for x, _ in loader:
        sampler.update(x)
    sampler.set_epoch(1)
    n = len(sampler)
    assert n < 64 and len(sampler) == n  # reading it again plans nothing
    sampler.set_epoch(1)  # already planned, also when len() planned it
    assert len(sampler) == n
    assert sum(len(x) for x, _ in loader) == n


def test_len_after_the_last_planned_epoch_plans_nothing_more():
    ds = Planted(32)
    cfg = UnbiasedPruningConfig(prune_ratio=0.5, anneal_fraction=0.0, guard=None)
    sampler = PruningSampler(ds, cfg, seed=0, num_epochs=2)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    for _ in range(2):
        for x, _ in loader:
            sampler.update(x)
        len(loader)  # between epochs 0 and 1: plans epoch 1; after epoch 1: the run is over
    assert sampler.epoch == 1 and sampler.stats.epochs == 2  # no third epoch in the stats
    assert len(sampler) == len(sampler._plan.order)
