"""compile_step: optimizers found and prepared; the fused update matches the default one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hasten
from hasten.compiler.step import find_optimizers, fused_supported, prepare_optimizer

# fp32: the fused kernel reorders the same arithmetic
RTOL, ATOL = 1e-5, 1e-7


def _train(opt_kwargs: dict, prepare: str | None, steps: int = 3) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))
    opt = torch.optim.AdamW(model.parameters(), **opt_kwargs)
    if prepare:
        prepare_optimizer(opt, prepare)
    x = torch.randn(7, 6, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def test_fused_update_matches_the_default_adamw():
    ref = _train({"lr": 1e-2, "weight_decay": 0.1}, None)
    got = _train({"lr": 1e-2, "weight_decay": 0.1}, "fused")
    for a, b in zip(ref, got):
        torch.testing.assert_close(b, a, rtol=RTOL, atol=ATOL)


def test_auto_picks_fused_where_available_and_is_idempotent():
    opt = torch.optim.AdamW(nn.Linear(2, 2).parameters(), lr=1e-3)
    assert fused_supported(opt)
    assert prepare_optimizer(opt) == "fused"
    assert all(g["fused"] for g in opt.param_groups)
    assert prepare_optimizer(opt, "inductor") == "fused"  # already prepared: left alone


def test_optimizers_without_a_fused_kernel():
    opt = torch.optim.RMSprop(nn.Linear(2, 2).parameters(), lr=1e-3)
    assert not fused_supported(opt)
    with pytest.raises(ValueError, match="update='inductor'"):
        prepare_optimizer(opt, "fused")


def test_switching_after_steps_keeps_state():
    torch.manual_seed(0)
    model = nn.Linear(3, 3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    prepare_optimizer(opt, "fused")
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    assert all(float(opt.state[p]["step"]) == 2 for p in model.parameters())


def test_compile_step_finds_optimizers_by_name():
    model = nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_step(x):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    assert find_optimizers(train_step) == [opt]
    step = hasten.compile_step(train_step)
    assert step.optimizer_updates == ("fused",)
    step(torch.randn(3, 2))
    assert step.__name__ == "train_step"


def test_compile_step_as_decorator_with_arguments():
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @hasten.compile_step(optimizers=opt)
    def train_step(x, net=model):
        net(x).sum().backward()

    assert train_step.optimizer_updates == ("fused",)


def test_compile_step_without_an_optimizer_says_how_to_pass_one():
    with pytest.raises(ValueError, match="optimizers=optimizer"):
        hasten.compile_step(lambda: None)
    with pytest.raises(ValueError, match="choose one of"):
        hasten.compile_step(lambda: None, update="magic")
    with pytest.raises(TypeError):
        prepare_optimizer(object())  # type: ignore[arg-type]
