"""Losses fed back from the training step land on the samples they belong to."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from hasten.sifting import (
    PruningSampler,
    SampleLosses,
    StaleRelativePruningConfig,
    UnbiasedPruningConfig,
)
from tests._helpers import Planted


def _cfg(**kw):
    return UnbiasedPruningConfig(
        **{"prune_ratio": 0.5, "anneal_fraction": 0.0, "guard": None, **kw}
    )


@pytest.mark.parametrize(
    ("workers", "drop_last", "batch_size"), [(0, False, 16), (0, True, 24), (2, False, 32)]
)
def test_planted_losses_are_attributed_to_their_samples(workers, drop_last, batch_size):
    ds = Planted(200)
    sampler = PruningSampler(ds, _cfg(), seed=3)
    loader = DataLoader(
        ds, batch_size=batch_size, sampler=sampler, num_workers=workers, drop_last=drop_last
    )
    for epoch in range(3):
        sampler.set_epoch(epoch)
        fed = []
        for planted, idx in loader:
            # the "per-sample loss" is the planted value, shifted by the epoch so stale values
            # are told apart from fresh ones; attribution is by position only (no indices=)
            sampler.update(planted + epoch)
            fed.append(idx)
        fed = torch.cat(fed)
        table = sampler.table
        assert torch.equal(table.losses[fed], ds.planted[fed] + epoch)
        assert (table.epoch_seen[fed] == epoch).all()
        untouched = torch.ones(len(ds), dtype=torch.bool)
        untouched[fed] = False
        assert (table.epoch_seen[untouched] < epoch).all()
    assert sampler.stats.samples_fed_back + sampler.stats.samples_not_fed_back >= 200


def test_explicit_indices_attribute_in_any_order():
    ds = Planted(64)
    sampler = PruningSampler(ds, _cfg(), seed=0)
    loader = DataLoader(ds, batch_size=16, sampler=sampler)
    for planted, idx in loader:
        perm = torch.randperm(len(idx))  # the loop reorders the batch: indices travel along
        sampler.update(planted[perm] * 2, indices=idx[perm])
    assert torch.equal(sampler.table.losses, ds.planted * 2)


def test_update_returns_the_weighted_mean():
    ds = Planted(400)
    sampler = PruningSampler(ds, _cfg(prune_ratio=0.75), seed=0)
    loader = DataLoader(ds, batch_size=50, sampler=sampler)
    for planted, _ in loader:
        sampler.update(planted)
    sampler.set_epoch(1)
    seen_weights = []
    threshold = ds.planted.mean()
    for planted, idx in loader:
        losses = planted.clone().requires_grad_()
        out = sampler.update(losses)
        expected_w = torch.where(ds.planted[idx] < threshold, 4.0, 1.0)
        torch.testing.assert_close(out, (losses * expected_w).mean())
        out.backward()
        torch.testing.assert_close(losses.grad, expected_w / len(idx))  # gradient reaches losses
        seen_weights.append(expected_w)
    assert (torch.cat(seen_weights) == 4.0).any()


def test_update_misuse_raises():
    ds = Planted(20)
    sampler = PruningSampler(ds, _cfg(), seed=0)
    with pytest.raises(RuntimeError, match="before the sampler was iterated"):
        sampler.update(torch.ones(4))
    list(iter(sampler))
    with pytest.raises(ValueError, match="one loss per sample"):
        sampler.update(torch.ones(4, 2))
    with pytest.raises(ValueError, match="indices holds 3 entries"):
        sampler.update(torch.ones(4), indices=torch.arange(3))
    sampler.update(torch.ones(15))
    with pytest.raises(RuntimeError, match="received 25 losses"):
        sampler.update(torch.ones(10))


def test_no_feedback_warns_once():
    sampler = PruningSampler(30, _cfg(), seed=0)
    list(iter(sampler))
    with pytest.warns(RuntimeWarning, match="no losses came back"):
        list(iter(sampler))
    assert sampler.stats.samples_not_fed_back == 30


def test_table_records_nonfinite_as_inf_and_round_trips():
    table = SampleLosses(6)
    assert not table.seen.any()
    table.record(torch.tensor([4, 1, 2]), torch.tensor([0.5, float("nan"), -float("inf")]), 2)
    assert table.losses[4] == 0.5 and torch.isinf(table.losses[[1, 2]]).all()
    assert table.epoch_seen.tolist() == [-1, 2, 2, -1, 2, -1]
    other = SampleLosses(6)
    other.load_state_dict(table.state_dict())
    assert torch.equal(other.losses, table.losses)
    assert torch.equal(other.epoch_seen, table.epoch_seen)
    with pytest.raises(ValueError, match="same dataset"):
        SampleLosses(7).load_state_dict(table.state_dict())


def test_feedback_keeps_the_bf16_loss_graph():
    ds = Planted(8)
    sampler = PruningSampler(ds, StaleRelativePruningConfig(guard=None), seed=0)
    (batch,) = list(DataLoader(ds, batch_size=8, sampler=sampler))
    w = torch.ones(8, requires_grad=True)
    loss = sampler.update((batch[0] * w).bfloat16())
    assert loss.dtype == torch.bfloat16
    loss.backward()
    assert w.grad is not None
    assert sampler.table.losses.dtype == torch.float32


def test_no_host_read_per_step_and_a_few_per_epoch(monkeypatch):
    # CPU proxy for "no host sync in the feedback path": count the Tensor methods that read
    # device memory back to the host, by the hasten function that calls them
    import sys

    calls: list[str] = []
    for name in ("tolist", "item", "cpu", "numpy", "__bool__"):
        original = getattr(torch.Tensor, name)

        def spy(self, *a, _orig=original, **k):
            frame = sys._getframe(1)
            if "hasten" in frame.f_code.co_filename:
                calls.append(frame.f_code.co_name)
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    ds = Planted(160)
    sampler = PruningSampler(ds, _cfg(), seed=0)
    loader = DataLoader(ds, batch_size=16, sampler=sampler)
    steps = 0
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for planted, idx in loader:
            sampler.update(planted)
            sampler.update(torch.zeros(0), indices=idx[:0])  # explicit-index path too
            steps += 1
    assert steps > 20
    assert not [c for c in calls if c in ("update", "record", "place", "on")], calls
    assert len(calls) <= 3 * 6  # planning and iteration: a handful per epoch, none per step


def _table(sampler):
    t = sampler.table
    return (
        t.losses.clone(),
        t.epoch_seen.clone(),
        sampler._plan.cursor,
        sampler.stats.samples_fed_back,
    )


def _unchanged(sampler, before):
    after = _table(sampler)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    assert before[2:] == after[2:]


@pytest.mark.parametrize("batch_size", [8, None])  # told, or learned from the first update
def test_each_update_misuse_raises_at_the_call_with_the_table_unchanged(batch_size):
    ds = Planted(256)
    sampler = PruningSampler(ds, _cfg(), seed=0, batch_size=batch_size)
    it = iter(DataLoader(ds, batch_size=8, sampler=sampler))
    x, _ = next(it)
    if batch_size is not None:  # the very first call is checked against the batch size
        before = _table(sampler)
        with pytest.raises(ValueError, match=r"received 4 losses, but batch 1 .* has 8 samples"):
            sampler.update(x[:4].requires_grad_())  # half a batch
        _unchanged(sampler, before)
    tokens = x.repeat_interleave(16)  # token-level losses: 16 per sample
    before = _table(sampler)
    with pytest.raises(ValueError, match=r"received 128 losses"):
        sampler.update(tokens)
    _unchanged(sampler, before)
    with pytest.raises(TypeError, match="floating-point"):
        sampler.update(torch.arange(8))  # integer "losses" (labels, say)
    _unchanged(sampler, before)

    losses = x.clone().requires_grad_()
    sampler.update(losses)  # the right call
    before = _table(sampler)
    with pytest.raises(RuntimeError, match="same losses tensor"):
        sampler.update(losses)  # a second update for the same batch
    _unchanged(sampler, before)
    with pytest.raises(ValueError, match=r"only 0 samples were drawn"):
        sampler.update(x.clone())  # same batch again, recomputed: nothing new was drawn
    _unchanged(sampler, before)
    x2, _ = next(it)
    with pytest.raises(ValueError, match=r"received 4 losses, but batch 2 .* has 8 samples"):
        sampler.update(x2[:4])  # half of the next batch
    _unchanged(sampler, before)
    sampler.update(x2)
    assert sampler._plan.cursor == 16
    order = sampler._plan.order[:16]
    torch.testing.assert_close(sampler.table.losses[order], ds.planted[order])


def test_len_after_a_skipped_set_epoch_warns():
    ds = Planted(64)
    sampler = PruningSampler(ds, _cfg(), seed=0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    for i, (x, _) in enumerate(loader):
        if i < 7:  # the last batch's losses never come back: the epoch is not over
            sampler.update(x)
    stale = len(loader)  # epoch 0's length: set_epoch(1) was skipped
    with pytest.warns(RuntimeWarning, match=r"set_epoch\(\) was not called after epoch 0"):
        batches = list(loader)
    assert len(batches) < stale
    sampler.set_epoch(2)
    assert len(loader) == len(list(loader))  # with set_epoch, len() is exact
