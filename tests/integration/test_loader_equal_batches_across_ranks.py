"""Under torch.distributed every rank yields the same number of sifted batches per epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, DistributedSampler

from hasten.sifting import SiftingDataloader
from tests._helpers import (
    PlantedDataset,
    ids_of,
    planted_loss,
    sift_config,
    tiny_model,
)

WORLD = 2


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        ds = PlantedDataset(400, "tuple")
        sampler = DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=0)
        orig = DataLoader(ds, batch_size=16, sampler=sampler)
        # very different keep rates per rank (beta 0.25 keeps 80 %, beta 4 keeps 20 %): without
        # balancing, rank 0 would yield about four times as many batches as rank 1
        beta = 0.25 if rank == 0 else 4.0
        sifted = SiftingDataloader(
            sift_config(beta=beta, delay=2), orig, model=tiny_model(), loss_impl=planted_loss
        )
        epochs = []
        for epoch in range(2):
            sifted.set_epoch(epoch)
            sizes, ids = [], []
            for batch in sifted:
                sizes.append(len(batch[0]))
                ids += ids_of(batch)
                flag = torch.ones(1)
                dist.all_reduce(flag)  # a DDP step: hangs if ranks disagree on the count
            epochs.append({"sizes": sizes, "ids": ids})
        stats = sifted.stats.as_dict()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"epochs": epochs, "stats": stats}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ranks_yield_equal_batch_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the spawned ranks'; not left to later tests
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for e in range(2):
        counts = [len(r["epochs"][e]["sizes"]) for r in ranks]
        assert counts[0] == counts[1], counts
        for r in ranks:
            sizes, ids = r["epochs"][e]["sizes"], r["epochs"][e]["ids"]
            assert all(s == 16 for s in sizes[:-1])
            assert len(ids) == len(set(ids))
    # the generous rank had rows left over that no other rank could match: counted, not lost
    assert ranks[0]["stats"]["num_samples_dropped_at_epoch_end"] > 0
    assert ranks[0]["stats"]["num_orig_samples_kept"] > ranks[1]["stats"]["num_orig_samples_kept"]
