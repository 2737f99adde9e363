"""The fused LM-head cross-entropy against eager, chunked and not, forward and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hasten.compiler.passes import linear_ce
from hasten.compiler.passes.linear_ce import linear_cross_entropy

# fp32: the same sums in another order (chunked log-sum-exp, gradient accumulated by chunk)
RTOL, ATOL = 1e-5, 1e-6


def _loss_and_grads(fused, h, w, b, target, reduction):
    ts = [t for t in (h, w, b) if t is not None]
    if fused:
        out = linear_cross_entropy(h, w, b, target, reduction=reduction)
    else:
        out = F.cross_entropy(F.linear(h, w, b), target, reduction=reduction)
    return [out, *torch.autograd.grad(out, ts)]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("chunk_bytes", [4 * 300 * 16, linear_ce.CHUNK_BYTES])
def test_as_accurate_as_eager_forward_and_gradients(monkeypatch, reduction, bias, chunk_bytes):
    """Against a float64 reference, the fused fp32 loss and gradients err no more than eager
    fp32's (+ 1e-6 relative): reordered sums, not changed ones."""
    monkeypatch.setattr(linear_ce, "CHUNK_BYTES", chunk_bytes)  # 16 rows a chunk, or one chunk
    g = torch.Generator().manual_seed(0)
    h = torch.randn(70, 24, generator=g, requires_grad=True)
    w = (0.3 * torch.randn(300, 24, generator=g)).requires_grad_()
    b = torch.randn(300, generator=g, requires_grad=True) if bias else None
    target = torch.randint(0, 300, (70,), generator=g)
    target[::7] = -100
    d = [t.detach().double().requires_grad_() if t is not None else None for t in (h, w, b)]
    ref = _loss_and_grads(False, *d, target, reduction)
    eager = _loss_and_grads(False, h, w, b, target, reduction)
    fused = _loss_and_grads(True, h, w, b, target, reduction)
    for r, e, f in zip(ref, eager, fused):
        scale = r.abs().max()
        eager_err = (e.double() - r).abs().max() / scale
        fused_err = (f.double() - r).abs().max() / scale
        assert fused_err <= eager_err + 1e-6, (fused_err, eager_err)
        torch.testing.assert_close(f, e, rtol=RTOL, atol=ATOL * scale.item())


def test_scales_by_the_incoming_gradient_and_skips_work_without_grad():
    h, w = torch.randn(5, 4, requires_grad=True), torch.randn(9, 4, requires_grad=True)
    t = torch.randint(0, 9, (5,))
    (3.0 * linear_cross_entropy(h, w, None, t)).backward()
    h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    (3.0 * F.cross_entropy(h2 @ w2.t(), t)).backward()
    torch.testing.assert_close(h.grad, h2.grad, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(w.grad, w2.grad, rtol=RTOL, atol=ATOL)
    with torch.no_grad():
        out = linear_cross_entropy(h, w, None, t)
    torch.testing.assert_close(out, F.cross_entropy(h @ w.t(), t), rtol=RTOL, atol=ATOL)


def test_rejects_reduction_none():
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(
            torch.randn(2, 3), torch.randn(4, 3), None, torch.zeros(2).long(), reduction="none"
        )


@pytest.mark.slow
def test_hasten_compile_fuses_a_loss_only_lm_and_trains_like_eager():
    """Through AOTAutograd and Inductor: parameters after 3 AdamW steps match eager (fp32)."""
    import copy

    import hasten
    from hasten.compiler import compile_report

    from ._pass_cases import LossOnlyLM, _lm_rows

    torch.manual_seed(0)
    eager = LossOnlyLM()
    compiled = hasten.compile(
        copy.deepcopy(eager),
        fallback="raise",
        passes={"fused_linear_cross_entropy": True},
        regions="whole",
    )
    x, labels = _lm_rows(torch.Generator().manual_seed(1))
    x = x.detach()
    for model in (eager, compiled):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(3):
            opt.zero_grad()
            model(x, labels).backward()
            opt.step()
    stats = [
        s for s in compile_report(compiled).pass_stats if s.name == "fused_linear_cross_entropy"
    ]
    assert sum(s.changes["lm_head_cross_entropy_fused"] for s in stats) == 1
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
