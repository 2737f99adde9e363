"""PruningSampler: full-data phase, never-seen samples, equal shards per rank, exact resume,
stale rescoring, config validation."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader

from hasten.sifting import (
    PruningSampler,
    SiftConfigValidationException,
    StaleRelativePruningConfig,
    UnbiasedPruningConfig,
    coerce_pruning_config,
)
from tests._helpers import Planted


def _loss_of(ds: Planted, idx: torch.Tensor, epoch: int) -> torch.Tensor:
    """A deterministic stand-in for a training loss that drifts with the epoch."""
    return ds.planted[idx] * (1.0 + 0.1 * torch.cos(idx.float() + epoch))


def _train_epoch(sampler, loader, ds, epoch, steps=None):
    """One epoch of a fake training loop; returns the indices yielded and the losses returned."""
    ids, outs = [], []
    for step, (_, idx) in enumerate(loader):
        if steps is not None and step == steps:
            break
        outs.append(sampler.update(_loss_of(ds, idx, epoch)))
        ids.append(idx)
    return torch.cat(ids).tolist(), torch.stack(outs)


def test_final_full_data_phase_never_drops_a_sample():
    ds = Planted(300)
    epochs = 8  # anneal 0.25: epochs 6 and 7 train on all data
    sampler = PruningSampler(
        ds, UnbiasedPruningConfig(prune_ratio=0.9, anneal_fraction=0.25), num_epochs=epochs
    )
    loader = DataLoader(ds, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        ids, outs = _train_epoch(sampler, loader, ds, epoch)
        if epoch in (0, 6, 7):
            assert sorted(ids) == list(range(300))  # every sample, once
            assert not sampler.pruning or epoch == 0
        else:
            assert sampler.pruning and len(ids) < 300
    # in the full phase the returned loss is the plain mean: weights reset to 1
    _, idx = next(iter(DataLoader(ds, batch_size=300)))
    assert sampler.stats.epoch_kept_fractions[-2:] == [1.0, 1.0]
    assert sampler.stats.kept_fraction < 1.0
    # running past num_epochs keeps training on all data
    sampler.set_epoch(epochs)
    assert len(sampler) == 300 and not sampler.pruning
    del idx, outs


def test_full_phase_weights_are_one():
    ds = Planted(100)
    sampler = PruningSampler(
        ds, UnbiasedPruningConfig(prune_ratio=0.5, anneal_fraction=0.5), num_epochs=2
    )
    loader = DataLoader(ds, batch_size=100, sampler=sampler)
    _train_epoch(sampler, loader, ds, 0)
    sampler.set_epoch(1)
    (_, idx) = next(iter(loader))
    losses = _loss_of(ds, idx, 1)
    assert torch.equal(sampler.update(losses), losses.mean())


def test_never_seen_samples_are_always_kept():
    ds = Planted(200)
    sampler = PruningSampler(
        ds, UnbiasedPruningConfig(prune_ratio=0.99, anneal_fraction=0.0, guard=None)
    )
    loader = DataLoader(ds, batch_size=20, sampler=sampler)
    # epoch 0: feed back only the first half of the batches; the rest stays unseen
    ids, _ = _train_epoch(sampler, loader, ds, 0, steps=5)
    unseen = set(range(200)) - set(ids)
    sampler.set_epoch(1)
    planned = set(iter(sampler))  # iterated without feedback: still unseen afterwards
    assert unseen <= planned and len(planned) < 200
    with pytest.warns(RuntimeWarning, match="no losses came back"):
        sampler.set_epoch(2)
    assert unseen <= set(iter(sampler))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ranks_get_equal_counts_and_disjoint_shards(world):
    ds = Planted(203)
    cfg = UnbiasedPruningConfig(prune_ratio=0.6, anneal_fraction=0.0)
    samplers = [PruningSampler(ds, cfg, seed=7, num_replicas=world, rank=r) for r in range(world)]
    every = torch.arange(203)
    pruned_epochs = 0
    for epoch in range(4):
        shards = []
        for s in samplers:
            s.set_epoch(epoch)
            shards.append(list(iter(s)))
            # the ranks' tables agree (torch.distributed would merge them; here each rank
            # records every sample, as the merged table would hold)
            s.update(torch.zeros(len(shards[-1])))  # feedback of this rank's share...
            s.table.record(every, _loss_of(ds, every, epoch), epoch)  # ...then the merged table
        assert len({len(sh) for sh in shards}) == 1, [len(sh) for sh in shards]
        flat = [i for sh in shards for i in sh]
        kept = set(flat)
        pad = len(flat) - len(kept)
        assert 0 <= pad < world  # only padding repeats a sample
        if epoch > 0:
            pruned_epochs += len(kept) < 203
        else:
            assert kept == set(range(203))
    # the guard lets only learned samples be candidates, so an epoch may keep all by chance;
    # the counts above must have been tested on pruned epochs too
    assert pruned_epochs >= 2


def test_distributed_plan_equals_single_process_plan():
    ds = Planted(100)
    cfg = UnbiasedPruningConfig(prune_ratio=0.5, anneal_fraction=0.0)
    single = PruningSampler(ds, cfg, seed=1, shuffle=False)
    ranks = [PruningSampler(ds, cfg, seed=1, shuffle=False, num_replicas=2, rank=r) for r in (0, 1)]
    every = torch.arange(100)
    for s in (single, *ranks):
        s.set_epoch(0)
        s.table.record(every, ds.planted, 0)
        s.set_epoch(1)
    merged = [i for s in ranks for i in iter(s)]
    planned = list(iter(single))
    assert sorted(set(merged)) == planned  # the same decision ...
    assert len(merged) - len(planned) == len(planned) % 2  # ... padded to equal shards


@pytest.mark.parametrize("cut_steps", [None, 3])
def test_state_dict_round_trip_continues_identically(cut_steps):
    """A run checkpointed after epoch 1 (or 3 steps into epoch 2) and resumed into a fresh
    sampler and DataLoader yields the same indices and returns the same losses as an
    uninterrupted run."""
    ds = Planted(150)
    cfg = UnbiasedPruningConfig(prune_ratio=0.7, anneal_fraction=0.2)

    def make():
        s = PruningSampler(ds, cfg, num_epochs=5, seed=11)
        return s, DataLoader(ds, batch_size=16, sampler=s, num_workers=0)

    ref, ref_loader = make()
    ref_log = []
    for epoch in range(5):
        ref.set_epoch(epoch)
        ref_log.append(_train_epoch(ref, ref_loader, ds, epoch))

    run, loader = make()
    log = []
    for epoch in range(2):
        run.set_epoch(epoch)
        log.append(_train_epoch(run, loader, ds, epoch))
    if cut_steps is not None:
        run.set_epoch(2)
        partial = _train_epoch(run, loader, ds, 2, steps=cut_steps)
    state = run.state_dict()
    del run, loader

    resumed, loader = make()
    resumed.load_state_dict(state)
    start = 2
    if cut_steps is not None:
        resumed.set_epoch(2)  # a no-op: epoch 2 is in progress
        rest = _train_epoch(resumed, loader, ds, 2)
        log.append((partial[0] + rest[0], torch.cat((partial[1], rest[1]))))
        start = 3
    for epoch in range(start, 5):
        resumed.set_epoch(epoch)
        log.append(_train_epoch(resumed, loader, ds, epoch))
    for (ids_a, out_a), (ids_b, out_b) in zip(ref_log, log):
        assert ids_a == ids_b
        assert torch.equal(out_a, out_b)
    assert torch.equal(resumed.table.losses, ref.table.losses)
    counts = ("epochs", "samples_total", "samples_kept", "samples_fed_back", "epoch_kept_fractions")
    for name in counts:
        assert getattr(resumed.stats, name) == getattr(ref.stats, name), name


def test_resume_between_epochs_without_set_epoch():
    ds = Planted(90)
    cfg = UnbiasedPruningConfig(prune_ratio=0.7, anneal_fraction=0.0)

    def make():
        s = PruningSampler(ds, cfg, seed=5)
        return s, DataLoader(ds, batch_size=16, sampler=s)

    ref, ref_loader = make()
    ref_log = [_train_epoch(ref, ref_loader, ds, e)[0] for e in range(3)]
    run, loader = make()
    _train_epoch(run, loader, ds, 0)
    state = run.state_dict()
    resumed, loader = make()
    resumed.load_state_dict(state)
    assert [_train_epoch(resumed, loader, ds, e)[0] for e in (1, 2)] == ref_log[1:]


def test_load_state_dict_checks_what_must_match():
    s = PruningSampler(10, {"policy": "unbiased", "anneal_fraction": 0.0})
    state = s.state_dict()
    with pytest.raises(ValueError, match="same dataset"):
        PruningSampler(11, {"policy": "unbiased", "anneal_fraction": 0.0}).load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        s.load_state_dict({**state, "version": 99})
    other = PruningSampler(10, {"policy": "unbiased", "prune_ratio": 0.3, "anneal_fraction": 0})
    with pytest.warns(UserWarning, match="different settings"):
        other.load_state_dict(state)


def test_stale_relative_rescores_only_stale_samples():
    ds = Planted(120)
    calls: list[list[int]] = []

    def scorer(idx: torch.Tensor) -> torch.Tensor:
        calls.append(sorted(idx.tolist()))
        return ds.planted[idx] * 0.5

    sampler = PruningSampler(
        ds, StaleRelativePruningConfig(beta_value=2.0, max_loss_age=1), scorer=scorer, seed=0
    )
    loader = DataLoader(ds, batch_size=10, sampler=sampler)
    trained: list[set[int]] = []
    for epoch in range(5):
        sampler.set_epoch(epoch)
        ids, _ = _train_epoch(sampler, loader, ds, epoch)
        trained.append(set(ids))
    assert calls, "samples left out for two epochs must have been rescored"
    # at the start of epoch e, exactly the samples not updated in epochs e-1 (trained) or
    # e-1's rescoring... i.e. last recorded before e-1, were rescored
    assert all(len(c) == len(set(c)) for c in calls)
    assert sampler.stats.samples_scored == sum(len(c) for c in calls)
    assert trained[0] == set(range(120))
    assert all(len(t) < 120 for t in trained[1:])


@pytest.mark.parametrize(("age", "expect_all"), [(0, True), (None, False)])
def test_stale_relative_age_zero_rescores_all_and_none_never(age, expect_all):
    ds = Planted(50)
    scored: list[int] = []

    def scorer(idx: torch.Tensor) -> torch.Tensor:
        scored.append(len(idx))
        return ds.planted[idx]

    sampler = PruningSampler(
        ds, StaleRelativePruningConfig(max_loss_age=age), scorer=scorer, seed=0
    )
    loader = DataLoader(ds, batch_size=10, sampler=sampler)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        _train_epoch(sampler, loader, ds, epoch)
    assert scored == ([50, 50] if expect_all else [])


def test_len_is_the_planned_epoch_and_set_epoch_is_idempotent():
    ds = Planted(100)
    sampler = PruningSampler(
        ds, UnbiasedPruningConfig(prune_ratio=0.8, anneal_fraction=0.0, guard=None)
    )
    loader = DataLoader(ds, batch_size=10, sampler=sampler)
    assert len(sampler) == 100 and len(loader) == 10
    _train_epoch(sampler, loader, ds, 0)
    sampler.set_epoch(1)
    n = len(sampler)
    assert n < 100
    sampler.set_epoch(1)  # idempotent: the plan is not redrawn
    assert len(sampler) == n
    ids, _ = _train_epoch(sampler, loader, ds, 1)
    assert len(ids) == n
    # without set_epoch, iterating again plans the next epoch
    ids2, _ = _train_epoch(sampler, loader, ds, 2)
    assert sampler.epoch == 2
    # and len() read after an epoch whose batches all came back is the next epoch's
    n3 = len(sampler)
    assert sampler.epoch == 3
    ids3, _ = _train_epoch(sampler, loader, ds, 3)
    assert len(ids3) == n3 != len(ids2)


def test_bad_arguments_raise_with_the_fix():
    with pytest.raises(ValueError, match="num_epochs"):
        PruningSampler(10, UnbiasedPruningConfig())  # anneals by default
    with pytest.raises(SiftConfigValidationException, match="prune_ratio"):
        UnbiasedPruningConfig(prune_ratio=1.0)
    with pytest.raises(SiftConfigValidationException, match="threshold"):
        UnbiasedPruningConfig(threshold="median")
    with pytest.raises(SiftConfigValidationException, match="max_loss_age"):
        StaleRelativePruningConfig(max_loss_age=-1)
    with pytest.raises(SiftConfigValidationException, match="beta_value"):
        StaleRelativePruningConfig(beta_value=0)
    with pytest.raises(SiftConfigValidationException, match="'policy'"):
        coerce_pruning_config({"prune_ratio": 0.5})
    with pytest.raises(SiftConfigValidationException, match="unknown key"):
        coerce_pruning_config({"policy": "unbiased", "ratio": 0.5})
    with pytest.raises(SiftConfigValidationException, match="pruning config"):
        coerce_pruning_config(0.5)
    with pytest.raises(ValueError, match="rank"):
        PruningSampler(10, StaleRelativePruningConfig(), num_replicas=2, rank=2)
    with pytest.raises(TypeError, match="length"):
        PruningSampler(iter([]), StaleRelativePruningConfig())
    cfg = coerce_pruning_config({"policy": "stale_relative", "beta_value": 3, "max_loss_age": 2})
    assert cfg == StaleRelativePruningConfig(beta_value=3.0, max_loss_age=2)
    assert coerce_pruning_config(cfg.to_dict()) == cfg


def test_progress_runs_from_zero_to_one_over_the_planned_epochs():
    ds = Planted(100)
    sampler = PruningSampler(
        ds, UnbiasedPruningConfig(prune_ratio=0.8, anneal_fraction=0.0), num_epochs=4
    )
    loader = DataLoader(ds, batch_size=10, sampler=sampler)
    seen = [sampler.progress]
    for epoch in range(4):
        sampler.set_epoch(epoch)
        for planted, _ in loader:
            sampler.update(planted)
            seen.append(sampler.progress)
    assert seen[0] == 0.0 and seen[-1] == 1.0
    assert all(
        b >= a for a, b in itertools.pairwise(seen)
    )  # monotone, though epochs differ in length
    assert seen[10] == pytest.approx(0.25)  # end of epoch 0 (10 full batches)
    with pytest.raises(ValueError, match="num_epochs"):
        PruningSampler(10, StaleRelativePruningConfig()).progress


def test_order_depends_only_on_the_seed_while_nothing_is_pruned():
    # prune_ratio=0: the rule draws its random numbers every epoch but keeps everything; the
    # shuffle has a generator of its own, so each epoch is the seeded randperm stream's next
    # permutation, the order a full-data run shuffled that way sees (paired comparisons)
    ds = Planted(70)
    sampler = PruningSampler(
        ds, UnbiasedPruningConfig(prune_ratio=0.0, anneal_fraction=0.0), seed=3
    )
    loader = DataLoader(ds, batch_size=16, sampler=sampler)
    stream = torch.Generator().manual_seed(3)
    for epoch in range(4):
        sampler.set_epoch(epoch)
        ids, _ = _train_epoch(sampler, loader, ds, epoch)
        assert ids == torch.randperm(70, generator=stream).tolist(), epoch
    assert sampler.pruning  # the rule ran (from epoch 1), it just kept every sample
    # a rule that prunes draws from its own generator, yet the first epoch is the same
    pruned = PruningSampler(ds, UnbiasedPruningConfig(prune_ratio=0.9, anneal_fraction=0.0), seed=3)
    first, _ = _train_epoch(pruned, DataLoader(ds, batch_size=16, sampler=pruned), ds, 0)
    assert first == torch.randperm(70, generator=torch.Generator().manual_seed(3)).tolist()


def test_state_of_version_1_still_loads():
    # version 1 (one generator for the draws and the shuffle) resumes: the shuffle continues
    # from the saved generator's state, the plan and the losses are kept
    ds = Planted(60)
    cfg = UnbiasedPruningConfig(prune_ratio=0.5, anneal_fraction=0.0, guard=None)
    run = PruningSampler(ds, cfg, seed=1)
    _train_epoch(run, DataLoader(ds, batch_size=16, sampler=run), ds, 0)
    state = run.state_dict()
    assert state["version"] == 2
    old = {k: v for k, v in state.items() if k != "shuffle_generator"}
    old["version"] = 1
    resumed = PruningSampler(ds, cfg, seed=1)
    resumed.load_state_dict(old)
    assert torch.equal(resumed._shuffle_generator.get_state(), state["generator"])
    ids, _ = _train_epoch(resumed, DataLoader(ds, batch_size=16, sampler=resumed), ds, 1)
    assert len(ids) == len(set(ids)) and len(ids) < 60  # a pruned epoch, nothing duplicated
