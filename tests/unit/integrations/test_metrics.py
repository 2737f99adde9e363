"""Trainer-log statistics of the pruning front-end, and finding its sampler in a trainer's loader."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from hasten import PruningSampler, UnbiasedPruningConfig
from hasten.integrations.metrics import find_pruning_sampler, front_end_metrics, pruning_metrics
from tests._helpers import Planted


def test_pruning_metrics_report_the_share_of_data_trained_on():
    ds = Planted(40)
    config = UnbiasedPruningConfig(prune_ratio=0.9, anneal_fraction=0.0, guard=None)
    sampler = PruningSampler(ds, config)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    assert "sift/keep_rate" not in pruning_metrics(sampler)  # nothing planned yet
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for planted, _ in loader:
            sampler.update(planted.requires_grad_())
    m = pruning_metrics(sampler)
    s = sampler.stats
    assert m["sift/samples_seen"] == 80 and m["sift/samples_kept"] == s.samples_kept < 80
    assert m["sift/keep_rate"] == pytest.approx(s.samples_kept / 80)
    assert m["sift/epoch_keep_rate"] == pytest.approx(s.epoch_kept_fractions[-1])
    assert m["sift/epoch_keep_rate"] < 1.0
    assert m["sift/samples_fed_back"] == s.samples_kept  # every batch fed back
    assert m["sift/data_epoch"] == 1.0


def test_the_sampler_is_found_through_loaders_and_their_wrappers():
    ds = Planted(16)
    sampler = PruningSampler(ds, UnbiasedPruningConfig(anneal_fraction=0.0))
    loader = DataLoader(ds, batch_size=4, sampler=sampler)
    assert find_pruning_sampler(loader) is sampler
    assert find_pruning_sampler({"train": [loader]}) is sampler  # combined loaders
    batched = DataLoader(ds, batch_sampler=torch.utils.data.BatchSampler(sampler, 4, False))
    assert find_pruning_sampler(batched) is sampler
    assert find_pruning_sampler(DataLoader(ds)) is None
    assert front_end_metrics([1, 2]) is None
    assert "sift/samples_seen" in front_end_metrics(loader)
