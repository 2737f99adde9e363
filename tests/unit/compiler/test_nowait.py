"""No-wait start: eager steps while a helper process compiles, then compiled, numerics kept."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import hasten
from hasten.compiler.api import compile_report
from hasten.compiler.runtime import HastenCompileWarning
from tests.unit.compiler.test_regions import train_steps


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(self.norm(x)))


class Net(nn.Module):  # at module level: the helper process imports it by name
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.layers = nn.ModuleList(Layer() for _ in range(4))
        self.head = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x).mean(dim=1)


_steps = train_steps  # the same loop as the regions tests


def _code(model):
    for m in model.modules():
        impl = m.__dict__.get("_compiled_call_impl")
        if impl is not None:
            return impl.code
    raise AssertionError("no compiled region")


def test_start_is_validated():
    assert hasten.CompileConfig().start == "wait"
    with pytest.raises(ValueError, match="start"):
        hasten.CompileConfig(start="later")


@pytest.mark.slow
@pytest.mark.parametrize("regions", ["whole", "blocks"])
def test_no_wait_start_switches_to_compiled_with_eagers_numerics_fp32(
    regions, tmp_path, monkeypatch
):
    from torch._dynamo.utils import counters

    # An environment that disagrees with this process's thread count (a launcher's leftover):
    # the helper must still compile for this process's count, or its kernels are never found.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    torch.manual_seed(0)
    eager = Net()
    fast = copy.deepcopy(eager)
    hasten.compile(fast, start="eager", regions=regions, cache_dir=str(tmp_path / "cache"))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, fast)]
    gens = [torch.Generator().manual_seed(1) for _ in range(2)]
    ref = _steps(eager, opts[0], gens[0], 2)
    got = _steps(fast, opts[1], gens[1], 2)
    assert len(compile_report(fast).graphs) == 0  # the helper is still starting: eager steps
    helper = _code(fast)._helpers["train_grad"]
    assert helper.wait(timeout=400) == 0, helper.error()
    hits = (
        counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"]["fxgraph_cache_hit"]
    )
    ref += _steps(eager, opts[0], gens[0], 3)
    got += _steps(fast, opts[1], gens[1], 3)
    report = compile_report(fast)
    assert len(report.graphs) >= 1 and report.fallback is None  # compiled after the switch
    assert any("start='eager'" in f for f in report.fixes)
    # the training process compiled from the helper's cache, not from scratch
    assert (
        counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"]["fxgraph_cache_hit"]
        > hits
    )
    # fp32: eager and compiled steps compute the same function, up to kernel rounding
    assert got == pytest.approx(ref, rel=1e-5, abs=1e-6)
    for (n, p), (_, q) in zip(eager.named_parameters(), fast.named_parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.slow
def test_a_module_the_helper_cannot_import_compiles_in_process_with_a_warning():
    class Local(nn.Module):  # defined in a function: not importable by a helper process
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(x))

    model = hasten.compile(Local(), start="eager", regions="whole")
    with pytest.warns(HastenCompileWarning, match="helper process"):
        model(torch.randn(3, 4)).sum().backward()
    assert len(compile_report(model).graphs) == 1
