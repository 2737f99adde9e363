import torch

from hasten.sifting import (
    RelativeProbabilisticSiftConfig,
    Selection,
    policy_for,
    relative_probabilistic_select,
)


def test_keep_probability_is_percentile_to_the_beta():
    history = torch.linspace(0, 1, 1001)
    losses = torch.full((40000,), 0.3)
    sel = relative_probabilistic_select(
        losses, history, torch.Generator().manual_seed(0), beta_value=2.0
    )
    assert sel.keep.dtype == torch.bool and sel.weights is None
    assert abs(sel.keep.float().mean().item() - 0.3**2) < 0.01


def test_seeded_generator_reproduces_and_global_rng_untouched():
    losses, history = torch.rand(100), torch.rand(300)
    state = torch.random.get_rng_state()
    a = relative_probabilistic_select(
        losses, history, torch.Generator().manual_seed(1), beta_value=1
    )
    b = relative_probabilistic_select(
        losses, history, torch.Generator().manual_seed(1), beta_value=1
    )
    assert torch.equal(a.keep, b.keep)
    assert torch.equal(state, torch.random.get_rng_state())


def test_nonfinite_losses_always_kept():
    losses = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    history = torch.tensor([1.0, 2.0, float("inf")])
    for seed in range(20):
        sel = relative_probabilistic_select(
            losses, history, torch.Generator().manual_seed(seed), beta_value=10.0
        )
        assert sel.keep[:3].all()


def test_empty_history_keeps_everything():
    sel = relative_probabilistic_select(torch.rand(50), torch.empty(0), None, beta_value=5.0)
    assert sel.keep.all()


def test_policy_for_config():
    policy = policy_for(RelativeProbabilisticSiftConfig(beta_value=1.0, loss_history_length=8))
    sel = policy(torch.rand(10), torch.rand(8), torch.Generator().manual_seed(0))
    assert isinstance(sel, Selection) and sel.keep.shape == (10,)
