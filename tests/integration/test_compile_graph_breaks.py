"""The report's graph breaks agree with TorchDynamo's own count, and image classifiers compile once.

Slow: Inductor compiles tiny models.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import hasten
from tests._models import tiny_vit_config

pytestmark = pytest.mark.slow
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _dynamo_breaks() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


class EmptyGraphBreaks(nn.Module):
    """Breaks with nothing traced before them: TorchDynamo calls no backend for those graphs."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()  # the first thing: an empty graph (and, again, in forward's frame)
        h = self.a(x)
        print("", end="")  # a break after an op: a graph the backend compiles
        return self.b(h)


def test_graph_breaks_in_empty_graphs_are_counted_as_torchdynamo_counts_them():
    model = hasten.compile(EmptyGraphBreaks(), regions="whole", fallback="raise")
    before = _dynamo_breaks()
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()
    counted = _dynamo_breaks() - before
    report = hasten.compiler.compile_report(model)
    assert counted == 3  # graph_break() twice (hasten_forward's frame, then forward's), print once
    assert len(report.graph_breaks) == counted, str(report)
    reasons = [gb.reason for gb in report.graph_breaks]
    assert (
        sum("graph_break()" in r for r in reasons) == 2 and sum("print" in r for r in reasons) == 1
    )
    assert all(gb.location.startswith(__file__) for gb in report.graph_breaks)
    text = str(report)
    assert "3 graph break(s)" in text and "(2 times)" in text  # the same line listed once


def test_counted_again_after_torchdynamo_reset_cleared_its_callbacks():
    hasten.compile(EmptyGraphBreaks(), regions="whole")(torch.randn(4, 8))
    torch._dynamo.reset()  # clears Dynamo's compile callbacks and its list of break reasons
    model = hasten.compile(EmptyGraphBreaks(), regions="whole", fallback="raise")
    before = _dynamo_breaks()
    model(torch.randn(4, 8))
    assert len(hasten.compiler.compile_report(model).graph_breaks) == _dynamo_breaks() - before == 3


def test_breaks_of_other_compiles_are_not_in_the_report():
    model = hasten.compile(EmptyGraphBreaks(), regions="whole", fallback="raise")
    model(torch.randn(4, 8))

    def other(x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return x + 1

    breaks = len(hasten.compiler.compile_report(model).graph_breaks)
    torch.compile(other, backend="eager")(torch.randn(2))
    assert len(hasten.compiler.compile_report(model).graph_breaks) == breaks


def test_vit_sets_problem_type_before_its_loss_does_and_compiles_once():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tiny_vit_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.ViTForImageClassification(cfg)
    hasten.compile(model, regions="whole", fallback="raise", warn_recompiles=1)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        pixels = torch.randn(4, 3, 16, 16, generator=g)
        labels = torch.randint(0, 2, (4,), generator=g)
        model(pixel_values=pixels, labels=labels).loss.backward()
    report = hasten.compiler.compile_report(model)
    assert report.recompiles == (), str(report)
    assert report.graph_count == 1, str(report)
    assert model.config.problem_type == "single_label_classification"
    assert any("problem_type was None" in f and "loss_function" in f for f in report.fixes)
