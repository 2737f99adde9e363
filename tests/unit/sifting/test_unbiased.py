"""The unbiased rule keeps the expected gradient; its keep rates and weights are what it says."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten.sifting import PruningSampler, UnbiasedPruningConfig, loss_threshold, unbiased_select


def _linear_problem(n: int = 256, d: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = x @ torch.randn(d, generator=g) + 0.3 * torch.randn(n, generator=g)
    w = torch.zeros(d, requires_grad=True)  # a fixed, non-optimal point: gradients share a sign
    return x, y, w


def _per_sample_loss(w, x, y):
    return (x @ w - y) ** 2


def _draw_gradients(draws: int, prune_ratio: float, threshold="mean"):
    """Per draw (an epoch of the sampler with the model held fixed), the gradient of the
    reweighted summed loss over the kept samples divided by N, and the same without weights."""
    x, y, w = _linear_problem()
    n = len(y)
    ds = TensorDataset(torch.arange(n))
    sampler = PruningSampler(
        ds,
        UnbiasedPruningConfig(
            prune_ratio=prune_ratio, threshold=threshold, anneal_fraction=0.0, guard=None
        ),
        seed=1,
    )
    loader = DataLoader(ds, batch_size=128, sampler=sampler)
    for (idx,) in loader:  # epoch 0: nothing seen yet, everything kept; fills the loss table
        sampler.update(_per_sample_loss(w, x[idx], y[idx]).detach())
    weighted, plain = [], []
    for epoch in range(1, draws + 1):
        sampler.set_epoch(epoch)
        total_w = total_p = 0.0
        for (idx,) in loader:
            losses = _per_sample_loss(w, x[idx], y[idx])
            total_w = total_w + sampler.update(losses) * len(idx)  # sum of weight_i * loss_i
            total_p = total_p + losses.sum()
        gw, gp = (torch.autograd.grad(t / n, w, retain_graph=True)[0] for t in (total_w, total_p))
        weighted.append(gw)
        plain.append(gp)
    full = torch.autograd.grad(_per_sample_loss(w, x, y).mean(), w)[0]
    return torch.stack(weighted), torch.stack(plain), full, sampler


def _z_scores(estimates: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    se = estimates.std(0) / math.sqrt(len(estimates))
    return (estimates.mean(0) - target) / se


@pytest.mark.parametrize("threshold", ["mean", 0.7])
def test_reweighted_pruned_gradient_is_unbiased(threshold):
    # Tolerance: each draw is an independent epoch of fresh Bernoulli pruning, so the mean of
    # 120 draws has standard error std/sqrt(120), estimated from the draws; |z| < 5 on each of
    # the 5 coordinates fails by chance with probability < 3e-6 (and the seeds are fixed). The
    # unweighted estimate from the same draws must fail the same test (its bias sits at
    # |z| ~ 35 here): the test has the power to see a biased rule.
    weighted, plain, full, sampler = _draw_gradients(120, 0.5, threshold)
    frac = sampler.stats.epoch_kept_fractions[1:]
    assert 0.5 < sum(frac) / len(frac) < 0.95  # pruning really happened in every draw
    z = _z_scores(weighted, full)
    assert z.abs().max() < 5, z
    assert _z_scores(plain, full).abs().max() > 20


def test_keep_rate_and_weights_per_sample():
    history = torch.linspace(0, 1, 101)  # mean 0.5
    losses = torch.cat((torch.full((20000,), 0.25), torch.full((20000,), 0.75)))
    sel = unbiased_select(losses, history, torch.Generator().manual_seed(0), prune_ratio=0.7)
    low, high = sel.keep[:20000], sel.keep[20000:]
    assert high.all()
    assert abs(low.float().mean().item() - 0.3) < 0.01  # 4 sigma: sqrt(.21/20000) = 0.0032
    assert sel.weights is not None
    assert torch.allclose(sel.weights[:20000], torch.tensor(1 / 0.3))
    assert torch.equal(sel.weights[20000:], torch.ones(20000))
    # E[keep * weight] = 1 for every sample: the per-sample form of unbiasedness
    est = (sel.keep[:20000] * sel.weights[:20000]).float().mean().item()
    assert abs(est - 1.0) < 0.04


def test_nonfinite_and_empty_history():
    losses = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    for seed in range(10):
        sel = unbiased_select(
            losses, torch.tensor([1.0, 2.0]), torch.Generator().manual_seed(seed), prune_ratio=0.99
        )
        assert sel.keep[:3].all()
    sel = unbiased_select(torch.rand(50), torch.empty(0), None, prune_ratio=0.9)
    assert sel.keep.all() and torch.equal(sel.weights, torch.ones(50))


def test_threshold_mean_and_quantile_ignore_nonfinite():
    ref = torch.tensor([1.0, 2.0, 3.0, 10.0, float("inf"), float("nan")])
    assert loss_threshold(ref).item() == pytest.approx(4.0)
    assert loss_threshold(ref, 0.5).item() in (2.0, 3.0)
    assert loss_threshold(torch.arange(101.0), 0.25).item() == 25.0
    assert loss_threshold(torch.tensor([float("inf")])).item() == -math.inf
    assert loss_threshold(torch.empty(0), 0.3).item() == -math.inf


def test_same_generator_same_draw_and_global_rng_untouched():
    losses, history = torch.rand(100), torch.rand(300)
    state = torch.random.get_rng_state()
    a = unbiased_select(losses, history, torch.Generator().manual_seed(3), prune_ratio=0.5)
    b = unbiased_select(losses, history, torch.Generator().manual_seed(3), prune_ratio=0.5)
    assert torch.equal(a.keep, b.keep)
    assert torch.equal(state, torch.random.get_rng_state())
