"""The Keras sifting planner follows PruningSampler's law exactly (no Keras needed here)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from hasten.keras._plan import EpochPlanner
from hasten.sifting.pruning import PruningSampler
from hasten.sifting.pruning_config import StaleRelativePruningConfig, UnbiasedPruningConfig

CONFIGS = [
    UnbiasedPruningConfig(prune_ratio=0.5, anneal_fraction=0.25),
    StaleRelativePruningConfig(beta_value=1.0),
]


def _losses(size: int, epoch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + epoch)
    return torch.rand(size, generator=g).pow(3)  # skewed, like training losses


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: type(c).__name__)
def test_plans_equal_pruning_sampler(config):
    size, epochs = 97, 8
    planner = EpochPlanner(size, config, num_epochs=epochs, seed=3)
    sampler = PruningSampler(size, config, num_epochs=epochs, seed=3)
    for epoch in range(epochs):
        planner.plan(epoch)
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert planner.order.tolist() == order
        losses = _losses(size, epoch)[torch.as_tensor(order)]
        # the weighted mean PruningSampler returns is the mean of the planner's weights x losses
        expected = sampler.update(losses, indices=torch.as_tensor(order))
        w = np.ones(len(order)) if planner.weights is None else planner.weights
        assert float((losses.numpy() * w).mean()) == pytest.approx(float(expected), rel=1e-6)
        planner.record(planner.order, losses.numpy())
    assert planner.stats.epoch_kept_fractions == sampler.stats.epoch_kept_fractions


@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "rule-alone"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: type(c).__name__)
def test_no_sample_lost(config, guarded):
    if not guarded:
        config = dataclasses.replace(config, guard=None)
    size, epochs = 200, 8
    planner = EpochPlanner(size, config, num_epochs=epochs, seed=0)
    assert sorted(planner.order.tolist()) == list(range(size))  # epoch 0: everything
    for epoch in range(epochs):
        planner.plan(epoch)
        order = planner.order
        assert len(set(order.tolist())) == len(order)  # each kept sample once
        assert ((order >= 0) & (order < size)).all()
        # the first half is fed back each epoch: never-seen samples of the rest stay kept
        half = order[: len(order) // 2] if epoch == 0 else order
        planner.record(half, _losses(size, epoch).numpy()[half])
        if epoch == 0:
            unseen = set(range(size)) - set(half.tolist())
        elif epoch == 1:
            assert unseen <= set(order.tolist())
    if isinstance(config, UnbiasedPruningConfig):  # anneal: the last 2 of 8 epochs train on all
        assert planner.stats.epoch_kept_fractions[-2:] == [1.0, 1.0]
        if not guarded:  # the guard prunes nothing here: these random losses are never learned
            assert min(planner.stats.epoch_kept_fractions) < 0.9
    assert planner.stats.samples_not_fed_back == size - size // 2


def test_anneal_needs_epochs():
    with pytest.raises(ValueError, match="num_epochs"):
        EpochPlanner(10, UnbiasedPruningConfig(anneal_fraction=0.2))
