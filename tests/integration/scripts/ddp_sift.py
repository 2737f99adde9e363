"""Run under ``torchrun --nproc_per_node=2``: DDP training on sifted batches, ranks keeping very
different fractions; then a mid-epoch checkpoint and a per-rank resume. Writes ``rank{r}.json``
into the directory given as the first argument."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from _leave import leave
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from hasten.integrations import SiftedEpochs, sifting_metrics
from hasten.sifting import RelativeProbabilisticSiftConfig, SiftingDataloader

EPOCHS = 3
BATCH = 8
N = 320  # 160 samples a rank, 20 incoming batches a rank per epoch


class Planted(torch.utils.data.Dataset):
    """Sample i: x = [i, noise...], y = i % 3."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(n, 4, generator=g)
        self.x[:, 0] = torch.arange(n, dtype=torch.float32)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], i % 3


def build(rank: int, world: int) -> tuple[SiftingDataloader, DistributedSampler]:
    sampler = DistributedSampler(Planted(N), num_replicas=world, rank=rank, shuffle=True, seed=1)
    orig = DataLoader(Planted(N), batch_size=BATCH, sampler=sampler)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    config = RelativeProbabilisticSiftConfig(
        beta_value=3.0,
        loss_history_length=64,
        loss_based_sift_config={"sift_config": {"sift_delay": 2}},
    )
    # Planted losses. Rank 0's are i.i.d. uniform (a random feature): at beta 3 it keeps about a
    # quarter. Rank 1's rise with every sample it scores, so each new loss tops its history and
    # it keeps nearly all. Both are functions of the sample and of the loader's own counters, so
    # a resumed loader plants the same losses.

    def loss(model: nn.Module, batch) -> torch.Tensor:
        x = batch[0]
        if rank == 0:
            planted = x[:, 1]
        else:
            planted = loader.stats.num_orig_samples_scored + torch.arange(len(x)).float()
        return planted + 0.0 * model(x).sum(1)

    loader = SiftingDataloader(config, orig, model=model, loss_impl=loss, seed=rank)
    return loader, sampler


def train(loader, sampler, ddp, opt, out, first=0, resuming=False, stop=None) -> bool:
    """Epochs ``first``.. of DDP training on ``loader``; True when stopped at ``stop``."""
    for epoch in range(first, EPOCHS):
        if not (resuming and epoch == first):  # a resumed epoch keeps its restored sampler epoch
            loader.set_epoch(epoch)
            out["epochs"].append({"sizes": [], "ids": []})
        out["sampler_epochs"].append([epoch, sampler.epoch])
        rec = out["epochs"][epoch]
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()  # DDP all-reduce: hangs if ranks disagree on the batch count
            opt.step()
            rec["sizes"].append(len(x))
            rec["ids"].extend(x[:, 0].long().tolist())
            if stop == (epoch, i):
                return True
    return False


def _fresh() -> dict:
    return {"epochs": [], "sampler_epochs": []}


def main() -> None:
    out_dir = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    try:
        # uninterrupted run
        loader, sampler = build(rank, world)
        ddp = DDP(loader.model)
        full = _fresh()
        train(loader, sampler, ddp, torch.optim.SGD(ddp.parameters(), lr=0.05), full)
        stats = loader.stats.as_dict()

        # interrupted in epoch 1 after 2 batches, state saved per rank, resumed by a new loader
        loader, sampler = build(rank, world)
        ddp = DDP(loader.model)
        resumed = _fresh()
        stopped = train(
            loader, sampler, ddp, torch.optim.SGD(ddp.parameters(), lr=0.05), resumed, stop=(1, 1)
        )
        ckpt = out_dir / f"sift_rank{rank}.pt"
        saved = loader.state_dict()
        torch.save(saved, ckpt)
        loader, sampler = build(rank, world)
        loader.load_state_dict(torch.load(ckpt, weights_only=True))
        ddp = DDP(loader.model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        train(loader, sampler, ddp, opt, resumed, first=1, resuming=True)
        resumed_stats = loader.stats.as_dict()
        # fixed-length epochs over the same stream (what the HF and Lightning integrations use),
        # crossing data-pass boundaries in step on both ranks; metrics summed over ranks
        loader, sampler = build(rank, world)
        stream = SiftedEpochs(loader)
        ddp = DDP(loader.model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        stream_counts = []
        for _ in range(4):
            n = 0
            for x, y in stream:
                opt.zero_grad()
                nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
                n += 1
            stream_counts.append(n)
        metrics = sifting_metrics(loader)

        result = {
            "stream_counts": stream_counts,
            "stream_length": len(stream),
            "stream_data_epoch": stream.data_epoch,
            "metrics": metrics,
            "own_stats": loader.stats.as_dict(),
            "rank": rank,
            "full": full,
            "stats": stats,
            "stopped": stopped,
            "buffered_at_stop": saved["buffer"]["count"],
            "resumed": resumed,
            "resumed_stats": resumed_stats,
        }
        (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
        leave()  # see _leave.py
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
