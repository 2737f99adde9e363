"""The pruning guard: it lets a rule skip only learned samples, within a loss budget, after the
loss flattened; it pauses pruning when an audit of the skipped samples fails; and it says so."""

from __future__ import annotations

import dataclasses
import logging
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from hasten.keras._plan import EpochPlanner
from hasten.sifting import PruningSampler, StaleRelativePruningConfig, UnbiasedPruningConfig
from hasten.sifting.exceptions import SiftConfigValidationException
from hasten.sifting.guard import DEFAULT_GUARD, PruningGuard

N = 400


def _drive(sampler, loss_of, epochs):
    """Run ``epochs`` epochs feeding ``loss_of(epoch, indices, positions)`` back by index;
    returns each epoch's order."""
    orders = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        order = torch.as_tensor(list(sampler))
        orders.append(order)
        pos = torch.arange(len(order), dtype=torch.float32) / max(1, len(order) - 1)
        losses = loss_of(epoch, order, pos)
        for lo in range(0, len(order), 50):
            sampler.update(losses[lo : lo + 50].clone(), indices=order[lo : lo + 50])
    return orders


def _learning(epoch, idx, pos):
    """A run that learns: everything starts at 1.6; from epoch 1 on, even samples are learned
    (loss 0.05), odd ones stay hard (1.0); no drift within an epoch after the first."""
    if epoch == 0:
        return 1.6 - 0.1 * pos  # the first epoch still falls a little
    return torch.where(idx % 2 == 0, 0.05, 1.0)


def test_prunes_learned_samples_only_and_within_the_loss_budget():
    sampler = PruningSampler(N, StaleRelativePruningConfig(beta_value=1.0), num_epochs=5, seed=0)
    orders = _drive(sampler, _learning, 5)
    kept = sampler.stats.epoch_kept_fractions
    assert kept[0] == 1.0 and min(kept[2:]) < 0.9  # it prunes once samples are learned
    records = sampler.guard.state.epochs
    for r in records[2:]:
        assert r["pruned"] > 0 and r["threshold"] == pytest.approx(0.3 * 1.6, rel=0.05)
    # only learned (even) samples are skipped, and their summed loss is within the budget
    order = set(orders[-1].tolist())
    skipped = set(range(N)) - order
    assert skipped and all(i % 2 == 0 for i in skipped)
    total = 0.05 * (N / 2) + 1.0 * (N / 2)
    assert 0.05 * len(skipped) <= DEFAULT_GUARD.loss_budget * total + 1e-6
    line = sampler.summary()
    assert "pruned in epoch(s)" in line and "saving" in line and "safe" in line


def test_nothing_learned_nothing_pruned_and_it_says_why():
    def unlearned(epoch, idx, pos):  # losses stay near the first loss: nothing is learned
        g = torch.Generator().manual_seed(epoch)
        return 1.5 + 0.2 * torch.rand(len(idx), generator=g)

    rule = StaleRelativePruningConfig(beta_value=1.0, max_loss_age=None)
    sampler = PruningSampler(N, rule, num_epochs=4, seed=0)
    _drive(sampler, unlearned, 4)
    assert sampler.stats.epoch_kept_fractions == [1.0] * 4
    assert "nothing pruned" in sampler.summary() and "no sample is learned" in sampler.summary()
    alone = PruningSampler(N, dataclasses.replace(rule, guard=None), num_epochs=4, seed=0)
    _drive(alone, unlearned, 4)
    assert max(alone.stats.epoch_kept_fractions[1:]) < 0.6  # the rule alone prunes anyway
    assert "guard off" in alone.summary()


def test_waits_while_the_loss_still_falls_within_an_epoch():
    def falling(epoch, idx, pos):  # each epoch falls steeply from its start to its end
        return torch.where(idx % 2 == 0, 1.6 * (1 - pos) + 0.01, 1.6)

    sampler = PruningSampler(N, StaleRelativePruningConfig(), num_epochs=3, seed=0)
    _drive(sampler, falling, 3)
    assert sampler.stats.epoch_kept_fractions == [1.0] * 3
    assert "warming up" in sampler.guard.state.epochs[-1]["reason"]


def _fine_tune(epoch, idx, pos):
    """A fine-tune: the fresh head learns in the first half of epoch 0 (1.6 -> 0.6, nothing
    learned yet), the loss is flat after that; even samples end learned (0.05), odd ones hard
    (0.6, above the learned threshold ~0.46)."""
    learned = torch.where(idx % 2 == 0, 0.05, 0.6)
    if epoch == 0:
        return torch.where(pos < 0.5, 1.6 - 2.0 * pos, learned)
    return learned


def test_the_warm_up_window_judges_the_end_of_the_previous_epoch():
    whole = PruningSampler(N, StaleRelativePruningConfig(), num_epochs=4, seed=0)
    _drive(whole, _fine_tune, 3)
    assert whole.stats.epoch_kept_fractions[1] == 1.0  # epoch 0 fell: epoch 1 waits
    assert "within epoch 0" in whole.guard.state.epochs[1]["reason"]
    assert whole.stats.epoch_kept_fractions[2] < 1.0
    late = PruningSampler(
        N, StaleRelativePruningConfig(guard={"drift_window": 0.5}), num_epochs=4, seed=0
    )
    orders = _drive(late, _fine_tune, 3)
    assert late.stats.epoch_kept_fractions[1] < 1.0  # epoch 0 ended flat: epoch 1 prunes
    skipped = set(range(N)) - set(orders[1].tolist())
    assert skipped and all(i % 2 == 0 for i in skipped)  # learned ones only
    falling = PruningSampler(
        N, StaleRelativePruningConfig(guard={"drift_window": 0.5}), num_epochs=3, seed=0
    )
    _drive(falling, lambda e, i, p: 1.6 * (1 - p) + 0.01, 3)  # still falling at each end
    assert falling.stats.epoch_kept_fractions == [1.0] * 3
    assert "over the last 50% of epoch 1" in falling.guard.state.epochs[-1]["reason"]


def _forgetting(climb_to):
    def loss_of(epoch, idx, pos, state={}):  # noqa: B006 - the audited set, seen in epoch 3
        base = _learning(epoch, idx, pos)
        if epoch == 3:  # the skipped samples that ride along (weight 0) come back high
            audited = torch.as_tensor(list(state["audit"]))
            return torch.where(torch.isin(idx, audited), climb_to, base)
        return base

    return loss_of


def test_forgetting_pauses_pruning_deterministically():
    sampler = PruningSampler(N, StaleRelativePruningConfig(), num_epochs=6, seed=0)
    loss_of = _forgetting(0.9)
    original = sampler.guard.apply

    def spy(*a, **kw):
        out = original(*a, **kw)
        audit = sampler.guard.state.audit
        loss_of.__defaults__[0]["audit"] = [] if audit is None else audit.tolist()
        return out

    sampler.guard.apply = spy
    _drive(sampler, loss_of, 6)
    kept = sampler.stats.epoch_kept_fractions
    assert kept[2] < 1.0 and kept[3] < 1.0  # pruning, with an audit in epoch 3
    assert kept[4] == 1.0  # paused after the failed audit
    assert kept[5] < 1.0  # and resumed once the losses say it is safe again
    verdict = sampler.guard.state.epochs[4]["verdict"]
    assert "pruning paused from epoch 4" in verdict and "climbed back" in verdict
    assert "pruning paused from epoch 4" in sampler.summary()
    assert sampler.stats.samples_audited > 0


def test_pruned_not_below_kept_pauses_pruning():
    sampler = PruningSampler(N, StaleRelativePruningConfig(), num_epochs=5, seed=0)
    audits: list[torch.Tensor] = []
    original = sampler.guard.apply

    def spy(*a, **kw):
        out = original(*a, **kw)
        audits.append(sampler.guard.state.audit)
        return out

    sampler.guard.apply = spy

    def loss_of(epoch, idx, pos):
        base = _learning(epoch, idx, pos)
        if epoch == 2 and audits[-1] is not None:  # audited stay learned, but so is the rest
            return torch.where(torch.isin(idx, audits[-1]), 0.3, 0.2)
        return base

    _drive(sampler, loss_of, 5)
    record = sampler.guard.state.epochs[3]
    assert "not below the kept samples'" in record["verdict"]
    assert sampler.stats.epoch_kept_fractions[3] == 1.0


def test_audited_samples_are_forwarded_with_weight_zero():
    sampler = PruningSampler(N, StaleRelativePruningConfig(), num_epochs=4, seed=0)
    _drive(sampler, _learning, 3)
    sampler.set_epoch(3)
    audit = sampler.guard.state.audit
    assert audit is not None and len(audit) >= DEFAULT_GUARD.min_audit
    order = torch.as_tensor(list(sampler))
    assert torch.isin(audit, order).all()  # they are in the epoch
    losses = torch.ones(len(order), requires_grad=True)
    sampler.update(losses, indices=order).backward()
    grad = losses.grad
    assert (grad[torch.isin(order, audit)] == 0).all()  # but not trained on
    assert (grad[~torch.isin(order, audit)] > 0).all()


def test_unbiased_rule_stays_unbiased_among_the_cleared_samples():
    cfg = UnbiasedPruningConfig(prune_ratio=0.5, anneal_fraction=0.0, guard={"audit_fraction": 0})
    cfg = dataclasses.replace(cfg, guard=dataclasses.replace(cfg.guard, min_audit=0))
    sampler = PruningSampler(N, cfg, num_epochs=4, seed=0)
    _drive(sampler, _learning, 3)
    sampler.set_epoch(3)
    plan = sampler._plan
    weights = dict(zip(plan.order.tolist(), plan.weights.tolist(), strict=True))
    for i, w in weights.items():
        if i % 2:  # hard samples are never cleared: kept, weight 1
            assert w == 1.0
        else:  # cleared learned ones the rule kept carry its weight 1 / (1 - r)
            assert w in (1.0, 2.0)
    assert all(i in weights for i in range(1, N, 2))
    assert any(w == 2.0 for w in weights.values())


def test_resume_plans_as_an_uninterrupted_run():
    cfg = StaleRelativePruningConfig()
    whole = PruningSampler(N, cfg, num_epochs=6, seed=1)
    orders = _drive(whole, _learning, 6)
    first = PruningSampler(N, cfg, num_epochs=6, seed=1)
    _drive(first, _learning, 3)
    state = first.state_dict()
    resumed = PruningSampler(N, cfg, num_epochs=6, seed=1)
    resumed.load_state_dict(state)
    later = []
    for epoch in range(3, 6):
        resumed.set_epoch(epoch)
        order = torch.as_tensor(list(resumed))
        later.append(order)
        for lo in range(0, len(order), 50):
            part = order[lo : lo + 50]
            resumed.update(_learning(epoch, part, part.float()), indices=part)
    for a, b in zip(orders[3:], later, strict=True):
        assert torch.equal(a, b)
    assert resumed.guard.state.epochs == whole.guard.state.epochs
    assert resumed.stats.epoch_kept_fractions == whole.stats.epoch_kept_fractions
    assert resumed.stats.samples_audited == whole.stats.samples_audited > 0


def test_ranks_get_equal_counts_and_the_same_decisions():
    ranks = [
        PruningSampler(N + 1, StaleRelativePruningConfig(), num_epochs=4, num_replicas=2, rank=r)
        for r in range(2)
    ]
    for epoch in range(4):
        orders = []
        for s in ranks:
            s.set_epoch(epoch)
            orders.append(torch.as_tensor(list(s)))
        assert len(orders[0]) == len(orders[1])
        every = torch.arange(N + 1)
        pos = every.float() / N
        for s, order in zip(ranks, orders, strict=True):  # each rank records every loss
            s.update(_learning(epoch, every, pos)[order], indices=order)
            s.table.record(every, _learning(epoch, every, pos), epoch)
    assert ranks[0].guard.state.epochs == ranks[1].guard.state.epochs
    assert ranks[0].stats.epoch_kept_fractions[-1] < 1.0


def test_keras_planner_runs_the_same_guard():
    cfg = StaleRelativePruningConfig()
    sampler = PruningSampler(N, cfg, num_epochs=5, seed=2)
    planner = EpochPlanner(N, cfg, num_epochs=5, seed=2)
    for epoch in range(5):
        sampler.set_epoch(epoch)
        planner.plan(epoch)
        order = torch.as_tensor(list(sampler))
        assert planner.order.tolist() == order.tolist()
        pos = torch.arange(len(order), dtype=torch.float32) / max(1, len(order) - 1)
        losses = _learning(epoch, order, pos)
        sampler.update(losses, indices=order)
        planner.record(order.numpy(), losses.numpy())
    assert planner.summary() == sampler.summary()
    assert planner.stats.samples_audited == sampler.stats.samples_audited > 0


def test_the_run_ends_with_one_line(caplog):
    x = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))
    ds = TensorDataset(x, (x[:, 0] > 0).long())
    sampler = PruningSampler(ds, StaleRelativePruningConfig(max_loss_age=None), num_epochs=2)
    model = torch.nn.Linear(8, 2)
    loader = DataLoader(ds, batch_size=64, sampler=sampler)
    with caplog.at_level(logging.INFO, logger="hasten"):
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for xb, yb in loader:
                sampler.update(F.cross_entropy(model(xb), yb, reduction="none"))
    lines = [r.getMessage() for r in caplog.records if r.name == "hasten"]
    assert len(lines) == 1 and lines[0].startswith("hasten sifting: trained on 1024 of 1024")
    assert sampler.report() is None  # once


def test_config_field_validation_and_round_trip():
    cfg = StaleRelativePruningConfig(guard={"loss_budget": 0.2})
    assert cfg.guard == PruningGuard(loss_budget=0.2)
    data = cfg.to_dict()
    assert data["guard"]["loss_budget"] == 0.2
    from hasten.sifting import coerce_pruning_config

    assert coerce_pruning_config(data) == cfg
    assert coerce_pruning_config({"policy": "unbiased", "guard": None}).guard is None
    assert UnbiasedPruningConfig().guard == DEFAULT_GUARD
    for bad in (
        {"learned_below": 0},
        {"loss_budget": 1.5},
        {"max_drift": -1},
        {"audit_x": 1},
        {"drift_window": 0},
        {"drift_window": 1.5},
    ):
        with pytest.raises(SiftConfigValidationException):
            StaleRelativePruningConfig(guard=bad)
    with pytest.raises(SiftConfigValidationException, match="guard=None"):
        PruningGuard(max_drift=math.inf)
    with pytest.raises(SiftConfigValidationException, match="PruningGuard"):
        StaleRelativePruningConfig(guard=0.3)
