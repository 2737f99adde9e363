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
