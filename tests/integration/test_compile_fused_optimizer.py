"""The two lines train like eager with the optimizer on its fused kernel (Inductor, so slow)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hasten

pytestmark = pytest.mark.slow


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 4))


def test_compiled_model_with_default_adamw_trains_like_eager_on_the_fused_kernel():
    eager, model = _mlp(), hasten.compile(_mlp(), regions="whole", fallback="raise")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (eager, model)]
    g = torch.Generator().manual_seed(0)
    for _ in range(6):
        x, y = torch.randn(16, 12, generator=g), torch.randint(0, 4, (16,), generator=g)
        for m, opt in zip((eager, model), opts):
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
            opt.zero_grad()
    assert opts[1].param_groups[0]["fused"] is True and opts[0].param_groups[0]["fused"] is None
    assert hasten.compiler.compile_report(model).graph_count == 1
    for a, b in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
