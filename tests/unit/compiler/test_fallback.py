"""Fallback: a compile failure never stops training. These failures happen while TorchDynamo traces
or in a pass, before Inductor generates code, so the tests stay quick."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import hasten
from hasten.compiler.passes import registry
from hasten.compiler.runtime import HastenCompileWarning


class GraphBreaker(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()  # cannot be one graph: fullgraph=True fails
        return self.lin(x).relu()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_uncompilable_model_runs_eagerly_with_a_warning_naming_the_cause():
    model = GraphBreaker()
    x = torch.randn(3, 4)
    expected = model.lin(x).relu()
    hasten.compile(model, fullgraph=True, regions="whole")
    with pytest.warns(HastenCompileWarning, match="runs eagerly.*Cause: .*graph_break"):
        out = model(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()  # training goes on
    assert model.lin.weight.grad is not None
    rep = hasten.compiler.compile_report(model)
    assert rep.fallback is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # later calls are quietly eager
        torch.testing.assert_close(model(x), expected)


def test_raise_mode_raises_the_compile_error():
    model = hasten.compile(GraphBreaker(), fullgraph=True, fallback="raise", regions="whole")
    with pytest.raises(torch._dynamo.exc.Unsupported):
        model(torch.randn(3, 4))


@pytest.fixture
def failing_pass(monkeypatch):
    def explode(gm, example_inputs):
        raise RuntimeError("planted pass failure")

    entry = registry.GraphPass("explode", "pre_grad", explode, True, "always fails")
    monkeypatch.setitem(registry._REGISTRY, "explode", entry)
    return "explode"


def test_backend_failure_at_first_call_falls_back(failing_pass):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(2, 4)
    expected = model(x)
    hasten.compile(model, regions="whole")
    with pytest.warns(HastenCompileWarning, match="planted pass failure"):
        out = model(x)
    torch.testing.assert_close(out, expected)


def test_backend_failure_raises_in_raise_mode(failing_pass):
    model = hasten.compile(nn.Sequential(nn.Linear(4, 4)), fallback="raise", regions="whole")
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="planted pass failure"):
        model(torch.randn(2, 4))


def test_user_errors_are_not_swallowed_and_do_not_disable_compilation(failing_pass):
    model = hasten.compile(nn.Sequential(nn.Linear(4, 4)), regions="whole")
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        model(torch.randn(2, 5))  # wrong width: eager raises the same error
    assert not model._compiled_call_impl.failed


class Disabled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @torch.compiler.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu()


def test_a_model_dynamo_skips_entirely_warns_that_nothing_was_compiled():
    model = hasten.compile(Disabled(), regions="whole")
    x = torch.randn(3, 4)
    with pytest.warns(HastenCompileWarning, match="captured no graph.*TorchDynamo skipped it"):
        out = model(x)
    torch.testing.assert_close(out, model.lin(x).relu())
    rep = hasten.compiler.compile_report(model)
    assert rep.graph_count == 0 and any("nothing was compiled" in f for f in rep.fixes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, at the first call
        model(x)


def test_nothing_compiled_names_a_disabled_dynamo():
    model = hasten.compile(nn.Linear(4, 4), regions="whole")
    with (
        torch._dynamo.config.patch(disable=True),
        pytest.warns(HastenCompileWarning, match="TorchDynamo is disabled"),
    ):
        model(torch.randn(2, 4))
