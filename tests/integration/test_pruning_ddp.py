"""PruningSampler under real torch.distributed (2 gloo processes): the ranks merge the losses they
fed back, take the same decision and get the same number of batches every epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from hasten.sifting import PruningSampler, UnbiasedPruningConfig
from tests._helpers import Planted

WORLD = 2
EPOCHS = 4


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        ds = Planted(203)
        sampler = PruningSampler(
            ds,
            UnbiasedPruningConfig(prune_ratio=0.7, anneal_fraction=0.25, guard=None),
            num_epochs=EPOCHS,
        )
        loader = DataLoader(ds, batch_size=16, sampler=sampler)
        epochs = []
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            ids = []
            for planted, idx in loader:
                sampler.update(planted + epoch)
                ids += idx.tolist()
                flag = torch.ones(1)
                dist.all_reduce(flag)  # a DDP step: hangs if the ranks disagree on the count
            epochs.append(ids)
        sampler.set_epoch(EPOCHS)  # merges the last epoch's losses
        table = sampler.table
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "epochs": epochs,
                    "losses": table.losses.tolist(),
                    "seen": table.epoch_seen.tolist(),
                    "planted": ds.planted.tolist(),
                }
            )
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ranks_agree_and_get_equal_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the spawned ranks'; not left to later tests
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert ranks[0]["losses"] == ranks[1]["losses"]  # the merged tables agree
    assert ranks[0]["seen"] == ranks[1]["seen"]
    planted = torch.tensor(ranks[0]["planted"])
    seen = torch.tensor(ranks[0]["seen"])
    losses = torch.tensor(ranks[0]["losses"])
    # each sample's loss is the one fed back (by whichever rank trained it) in its last epoch
    torch.testing.assert_close(losses, planted + seen.float())
    for e in range(EPOCHS):
        shards = [r["epochs"][e] for r in ranks]
        assert len(shards[0]) == len(shards[1])
        flat = shards[0] + shards[1]
        assert len(flat) - len(set(flat)) <= 1  # only the padding repeats
        if e in (0, EPOCHS - 1):  # first epoch (nothing seen) and the final full-data epoch
            assert set(flat) == set(range(203))
        else:
            assert len(set(flat)) < 203


GUARDED_EPOCHS = 5


def _learned(epoch: int, idx: torch.Tensor) -> torch.Tensor:
    """Losses of a run that learns: 1.6 in epoch 0; from epoch 1 on the even samples are
    learned (0.05) and the odd ones stay hard (1.0)."""
    if epoch == 0:
        return torch.full((len(idx),), 1.6)
    return torch.where(idx % 2 == 0, 0.05, 1.0)


def _guarded_worker(rank: int, init_file: str, out_dir: str) -> None:
    from hasten.sifting import StaleRelativePruningConfig

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        ds = Planted(203)
        # the README's recipe, guard left at its default
        config = StaleRelativePruningConfig(beta_value=1.0, max_loss_age=None)
        sampler = PruningSampler(ds, config, num_epochs=GUARDED_EPOCHS)
        loader = DataLoader(ds, batch_size=16, sampler=sampler)
        epochs = []
        for epoch in range(GUARDED_EPOCHS):
            sampler.set_epoch(epoch)
            ids = []
            for _planted, idx in loader:
                sampler.update(_learned(epoch, idx))
                ids += idx.tolist()
                flag = torch.ones(1)
                dist.all_reduce(flag)  # a DDP step: hangs if the ranks disagree on the count
            epochs.append(ids)
        Path(out_dir, f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "epochs": epochs,
                    "guard": sampler.guard.state.epochs,
                    "kept": sampler.stats.epoch_kept_fractions,
                    "summary": sampler.summary(),
                },
                default=float,
            )
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_guarded_ranks_take_the_same_decisions_and_get_equal_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    mp.spawn(_guarded_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert ranks[0]["guard"] == ranks[1]["guard"]  # one decision, from the merged table
    assert ranks[0]["kept"] == ranks[1]["kept"] and ranks[0]["summary"] == ranks[1]["summary"]
    assert min(ranks[0]["kept"]) < 1.0  # it pruned (the even samples are learned)
    for e in range(GUARDED_EPOCHS):
        shards = [r["epochs"][e] for r in ranks]
        assert len(shards[0]) == len(shards[1])
        flat = set(shards[0] + shards[1])
        skipped = set(range(203)) - flat
        assert all(i % 2 == 0 for i in skipped)  # only learned samples are left out
    assert "guard: pruned in epoch(s)" in ranks[0]["summary"]
