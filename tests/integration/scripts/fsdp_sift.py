"""Run under ``torchrun --nproc_per_node=2``: FSDP2 (``fully_shard``) training on sifted batches,
the sharded model also scoring; checked against a replica trained on the gathered batches.
Writes ``rank{r}.json`` into the directory given as the first argument."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from _leave import leave
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

from hasten.sifting import PerSampleCrossEntropy, RelativeProbabilisticSiftConfig, SiftingDataloader


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        torch.manual_seed(0)
        model = net()
        replica = net()
        replica.load_state_dict(model.state_dict())
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)

        g = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(
            torch.randn(256, 4, generator=g), torch.arange(256) % 3
        )
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
        config = RelativeProbabilisticSiftConfig(
            beta_value=1.0,
            loss_history_length=64,
            loss_based_sift_config={"sift_config": {"sift_delay": 2}},
        )
        # the sharded model scores: its forward all-gathers parameters, in step on every rank
        loader = SiftingDataloader(
            config,
            DataLoader(data, batch_size=8, sampler=sampler),
            model=model,
            loss_impl=PerSampleCrossEntropy(),
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(replica.parameters(), lr=0.1)
        counts = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            n = 0
            for x, y in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()  # gradients reduce-scattered
                opt.step()
                # the replica takes the same step on every rank's batch: mean of the rank means
                # (the last batch of an epoch may differ in size between ranks)
                batches: list = [None] * world
                dist.all_gather_object(batches, (x, y))
                ref_opt.zero_grad()
                loss = sum(nn.functional.cross_entropy(replica(a), b) for a, b in batches)
                (loss / world).backward()
                ref_opt.step()
                n += 1
            counts.append(n)
        full = {k: v.full_tensor() for k, v in model.state_dict().items()}
        diff = max((full[k] - v).abs().max().item() for k, v in replica.state_dict().items())
        result = {"counts": counts, "max_abs_diff": diff, "stats": loader.stats.as_dict()}
        (out / f"rank{rank}.json").write_text(json.dumps(result))
        leave()  # see _leave.py
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
