"""Run under ``torchrun --nproc_per_node=2``: ``hasten.compile`` on FSDP2 (``fully_shard``) models
against the same models trained eagerly. Writes ``rank{r}.json`` into the directory given as the
first argument."""

from __future__ import annotations

import copy
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from _leave import leave
from torch import nn
from torch.distributed.fsdp import fully_shard

import hasten
from hasten.compiler.api import compile_report

STEPS = 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.norm(nn.functional.gelu(self.lin(x)))


class Net(nn.Module):
    """Embedding-like input layer, three identical blocks, a head: a transformer's layout."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def shard_blocks(model: nn.Module) -> None:
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)


def shard_linears(model: nn.Module) -> None:  # nn.Sequential: forward is torch's own code
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def train(model: nn.Module, rank: int) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()  # gradients reduce-scattered by FSDP's hooks
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():  # an eval forward: its own variant, no recompile, no warning
        model(torch.randn(6, 8, generator=g))
    model.train()
    return losses


def full(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor() for k, v in model.state_dict().items()}


def case(
    build: Callable[[], nn.Module],
    shard: Callable[[nn.Module], None],
    compile_first: bool,
    rank: int,
) -> dict:
    torch.manual_seed(0)
    eager_model = build()
    model = copy.deepcopy(eager_model)
    shard(eager_model)
    eager = train(eager_model, rank)
    if compile_first:
        hasten.compile(model, regions="whole")
        shard(model)
    else:
        shard(model)
        hasten.compile(model, regions="whole")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = train(model, rank)
    report = compile_report(model)
    a, b = full(eager_model), full(model)
    return {
        "eager": eager,
        "compiled": compiled,
        "max_param_diff": max((a[k] - b[k]).abs().max().item() for k in a),
        "graphs": report.graph_count,
        "variants": sorted({g.variant for g in report.graphs}),
        "recompiles": len(report.recompiles),
        "breaks": len(report.graph_breaks),
        "fallback": report.fallback,
        "fixes": list(report.fixes),
        "warnings": [
            str(w.message)
            for w in caught
            if issubclass(w.category, UserWarning) and "hasten" in str(w.message)
        ],
        "keys_equal": list(a) == list(b),
    }


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        result = {
            "blocks": case(Net, shard_blocks, compile_first=False, rank=rank),
            "sequential": case(mlp, shard_linears, compile_first=True, rank=rank),
            "root_only": case(mlp, fully_shard, compile_first=False, rank=rank),
        }
        (out / f"rank{rank}.json").write_text(json.dumps(result))
        leave()  # see _leave.py
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
