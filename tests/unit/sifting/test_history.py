import pytest
import torch

from hasten.sifting import LossHistory, percentile_of


def test_ring_buffer_keeps_newest():
    h = LossHistory(5)
    assert len(h) == 0 and h.values().numel() == 0
    h.add(torch.tensor([1.0, 2.0, 3.0]))
    assert sorted(h.values().tolist()) == [1, 2, 3]
    h.add(torch.tensor([4.0, 5.0, 6.0, 7.0]))
    assert len(h) == 5 and sorted(h.values().tolist()) == [3, 4, 5, 6, 7]
    h.add(torch.arange(10, 22, dtype=torch.float32))  # longer than capacity
    assert sorted(h.values().tolist()) == list(range(17, 22))
    h.add(torch.tensor([30.0]))
    assert sorted(h.values().tolist()) == [18, 19, 20, 21, 30]
    assert h.total_added == 20


def test_nonfinite_stored_as_inf():
    h = LossHistory(4)
    h.add(torch.tensor([float("nan"), -float("inf"), 1.0]))
    assert h.values().tolist().count(float("inf")) == 2


def test_percentile_matches_brute_force_with_ties():
    g = torch.Generator().manual_seed(0)
    ref = torch.randint(0, 10, (200,), generator=g).float()
    x = torch.randint(-1, 12, (64,), generator=g).float()
    p = percentile_of(x, ref)
    brute = ((ref[None, :] < x[:, None]).sum(1) + 0.5 * (ref[None, :] == x[:, None]).sum(1)) / 200
    torch.testing.assert_close(p, brute.float())
    assert percentile_of(torch.tensor([0.3]), torch.empty(0)).item() == 1.0


def test_state_round_trip():
    h = LossHistory(8)
    h.add(torch.arange(11, dtype=torch.float32))
    h2 = LossHistory(8)
    h2.load_state_dict(h.state_dict())
    torch.testing.assert_close(h2.values(), h.values())
    h.add(torch.tensor([100.0, 200.0]))
    h2.add(torch.tensor([100.0, 200.0]))
    torch.testing.assert_close(h2.values(), h.values())
    with pytest.raises(ValueError, match="same config"):
        LossHistory(4).load_state_dict(h.state_dict())


def test_half_precision_losses_rank_in_float32():
    ref = torch.linspace(0, 1, 1001)
    x = torch.tensor([0.25, 0.5], dtype=torch.bfloat16)
    p = percentile_of(x, ref)
    assert p.dtype == torch.float32
    torch.testing.assert_close(p, torch.tensor([0.25, 0.5]), atol=2e-3, rtol=0)
