"""Run under ``torchrun --nproc_per_node=2``: ``hasten.compile`` with DistributedDataParallel
against eager DDP, and the ``torch.compile(DDP(nn.Sequential))`` trap. Writes ``rank{r}.json``
into the directory given as the first argument."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch._dynamo
import torch.distributed as dist
from _leave import leave
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hasten
from hasten.compiler.api import compile_report

STEPS = 4


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))


def train(ddp: nn.Module, rank: int) -> list[float]:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()  # gradients all-reduced by DDP's hooks
        opt.step()
        losses.append(loss.item())
    return losses


class TinyLM(nn.Module):
    """Returns the loss and the 2**20 logits it came from: hasten splits the graph there."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 64)
        self.head = nn.Linear(64, 4096)  # 1 MiB of weights: past DDP's first bucket (1 MiB)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(torch.tanh(self.body(x)))
        return nn.functional.cross_entropy(logits, labels), logits


def train_lm(ddp: nn.Module, rank: int) -> list[float]:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(200 + rank)
    losses = []
    for _ in range(3):
        x, y = torch.randn(256, 8, generator=g), torch.randint(0, 4096, (256,), generator=g)
        opt.zero_grad()
        loss, _ = ddp(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def split_under_ddp_buckets(rank: int) -> dict:
    """A graph hasten splits, inside DDPOptimizer's buckets (two: the head, then the body).

    With DDPOptimizer's own part compiler nested inside, GPT-2 compiled whole under DDP fell back
    to eager (FakeTensorDeviceMismatchError, meta and cpu)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager_model = TinyLM()
    compiled_model = copy.deepcopy(eager_model)
    eager = train_lm(DDP(eager_model, bucket_cap_mb=1), rank)
    wrapper = DDP(compiled_model, bucket_cap_mb=1)
    hasten.compile(wrapper, regions="whole")
    compiled = train_lm(wrapper, rank)
    report = compile_report(wrapper)
    return {
        "eager": eager,
        "compiled": compiled,
        "fallback": report.fallback,
        "graphs": report.graph_count,
        "split": any(s.changes.get("graphs_split") for s in report.pass_stats),
        "max_param_diff": max(
            (a - b).abs().max().item()
            for a, b in zip(eager_model.parameters(), compiled_model.parameters())
        ),
    }


def unique_graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        torch.manual_seed(0)
        eager_model = net()
        compiled_model = copy.deepcopy(eager_model)

        eager = train(DDP(eager_model), rank)

        # compile inside the wrapper: hasten.compile(DDP(m)) compiles m in place, keeps the wrapper
        wrapper = DDP(compiled_model)
        assert hasten.compile(wrapper, regions="whole") is wrapper
        compiled = train(wrapper, rank)
        report = compile_report(wrapper)

        # the trap: torch.compile around DDP(nn.Sequential) captures no graph at all
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        trap = torch.compile(DDP(net()))
        trap(torch.randn(8, 16)).sum().backward()
        trap_graphs = unique_graphs()

        diff = max(
            (a - b).abs().max().item()
            for a, b in zip(eager_model.state_dict().values(), compiled_model.state_dict().values())
        )
        result = {
            "eager": eager,
            "compiled": compiled,
            "max_param_diff": diff,
            "graphs": report.graph_count,
            "breaks": len(report.graph_breaks),
            "fallback": report.fallback,
            "state_dict_keys_equal": list(compiled_model.state_dict())
            == list(eager_model.state_dict()),
            "trap_graphs": trap_graphs,
            "split_lm": split_under_ddp_buckets(rank),
        }
        (out / f"rank{rank}.json").write_text(json.dumps(result))
        leave()  # see _leave.py
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
