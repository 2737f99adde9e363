"""Which parts of a model hasten compiles (regions) and which variant a call belongs to."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hasten.compiler.regions import plan_regions
from hasten.compiler.runtime import grad_variant


def test_grad_variant_names_train_eval_and_the_autograd_mode():
    assert grad_variant(True) == "train_grad"
    assert grad_variant(False) == "eval_grad"
    with torch.no_grad():
        assert grad_variant(True) == "train_no_grad"
    with torch.inference_mode():
        assert grad_variant(False) == "eval_inference"


def test_a_plain_model_is_one_region():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert plan_regions(model) == [(model, "call")]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.drop = nn.Dropout(0.1)  # no parameters: not worth a region of its own
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 3))


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_fsdp2_units_are_compiled_by_region(one_rank):
    from torch.distributed.fsdp import fully_shard

    net = Net()
    for block in net.blocks:
        fully_shard(block)
    fully_shard(net)
    regions = plan_regions(net)
    assert regions == [
        (net.emb, "call"),  # parameters outside every leaf unit: whole call
        (net.blocks[0], "forward"),  # leaf units: forward only, FSDP's hooks stay eager
        (net.blocks[1], "forward"),
        (net.head, "call"),
    ]

    root_only = Net()
    fully_shard(root_only)
    assert plan_regions(root_only) == [(root_only, "forward")]
