"""Compiled training matches eager training (hasten.verify) on the tiny benchmark models, and
compile_step's compiled optimizer update survives an LR scheduler without recompiling. Slow:
every test compiles forward + backward with Inductor."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import hasten
from hasten.bench.models import get_model_spec
from hasten.compiler.verify import TOLERANCES
from tests._helpers import NEEDS_NATIVE_BF16

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.slow


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-3)


@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt2", "bert"])
def test_compiled_training_matches_eager_fp32(name):
    if name in ("gpt2", "bert"):
        pytest.importorskip("transformers")
    spec = get_model_spec(name, "tiny")
    model = spec.build(seed=0)
    batch = spec.make_batch(torch.Generator().manual_seed(0))
    result = hasten.verify(model, batch, spec.loss, _adamw, steps=5)
    # fp32 tolerances: loss 1e-4 relative per step, parameters 1e-2 of the update's norm
    assert (result.loss_tol, result.param_tol) == TOLERANCES["fp32"]
    assert result.passed, str(result)
    assert result.report.fallback is None
    assert result.report.graph_count >= 1
    if name == "gpt2":  # the loss_type trap is fixed: one graph, loss inside it
        assert result.report.graph_count == 1, str(result.report)


@NEEDS_NATIVE_BF16
@pytest.mark.parametrize("name", ["mlp", "gpt2"])
def test_bf16_training_tracks_fp32_within_bf16_tolerance(name):
    if name == "gpt2":
        pytest.importorskip("transformers")
    spec = get_model_spec(name, "tiny")
    model = spec.build(seed=0)
    batch = spec.make_batch(torch.Generator().manual_seed(0))
    result = hasten.verify(
        model, batch, spec.loss, _adamw, steps=5, config=hasten.CompileConfig(precision="bf16")
    )
    # bf16 tolerances: loss 3e-2 relative per step, parameters 2e-1 of the update's norm
    assert (result.precision, result.loss_tol, result.param_tol) == ("bf16", *TOLERANCES["bf16"])
    assert result.passed, str(result)


def test_inductor_update_with_lr_scheduler_never_recompiles():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    opt = torch.optim.RMSprop(model.parameters(), lr=1e-2)  # no fused kernel: compiled update
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    ref_model = nn.Linear(4, 4)
    ref_model.load_state_dict(model.state_dict())
    ref_opt = torch.optim.RMSprop(ref_model.parameters(), lr=1e-2)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)

    @hasten.compile_step(optimizers=opt)
    def step(x):
        model(x).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        sched.step()

    assert step.optimizer_updates == ("inductor",)
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)
    from torch._dynamo.utils import counters

    counters.clear()
    for i in range(4):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
        step(x)
        ref_model(x).pow(2).sum().backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_sched.step()
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])  # no per-LR recompile
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(1e-2 * 0.5**4)
    for a, b in zip(ref_model.parameters(), model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)  # fp32
