"""Scorer: losses aligned with the indices asked for, the model left as it was, bf16 close."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from hasten.sifting import LossImplementationNotProvidedException, Scorer


def _setup(n: int = 300):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 12, generator=g), torch.randint(0, 3, (n,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(12, 32), nn.BatchNorm1d(32), nn.Dropout(0.5), nn.ReLU(), nn.Linear(32, 3)
    )
    return TensorDataset(x, y), model


def _loss(model, batch):
    return F.cross_entropy(model(batch[0]), batch[1], reduction="none")


def test_losses_follow_the_indices_and_the_model_is_untouched():
    ds, model = _setup()
    model.train()
    model[2].eval()  # a mixed mode must come back exactly
    before = {k: v.clone() for k, v in model.state_dict().items()}
    scorer = Scorer(model, ds, _loss, batch_size=64)
    idx = torch.tensor([299, 0, 17, 17, 150, 3])
    got = scorer(idx)
    model.eval()
    with torch.no_grad():
        want = F.cross_entropy(model(ds.tensors[0][idx]), ds.tensors[1][idx], reduction="none")
    model.train()
    model[2].eval()
    torch.testing.assert_close(got, want)  # eval mode: dropout off, BatchNorm running stats
    assert [m.training for m in model] == [True, True, False, True, True]
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # BatchNorm running statistics untouched
    assert scorer.stats.samples_scored == 6 and scorer.stats.passes == 1
    assert scorer(torch.empty(0, dtype=torch.int64)).numel() == 0


def test_bf16_autocast_scores_close_to_fp32():
    ds, model = _setup()
    idx = torch.arange(300)
    fp32 = Scorer(model, ds, _loss, batch_size=128)(idx)
    bf16 = Scorer(model, ds, _loss, batch_size=128, autocast_dtype=torch.bfloat16)(idx)
    assert bf16.dtype == torch.float32
    # bf16 keeps 8 bits of mantissa: losses of order 1 agree to a few hundredths, and the
    # ranking the policies use is nearly the same
    torch.testing.assert_close(bf16, fp32, atol=0.05, rtol=0.05)
    rank_fp32 = fp32.argsort().argsort().float()
    rank_bf16 = bf16.argsort().argsort().float()
    assert torch.corrcoef(torch.stack((rank_fp32, rank_bf16)))[0, 1] > 0.99


@pytest.mark.parametrize("flags", ["avx512f avx512bw", "avx512f avx512bw avx512_bf16"])
def test_bf16_scoring_on_a_cpu_that_emulates_it_warns_once(monkeypatch, flags):
    from hasten import machine

    monkeypatch.setattr(machine, "_cpuinfo_field", lambda f: flags if f == "flags" else None)
    ds, model = _setup(10)
    scorer = Scorer(model, ds, _loss, autocast_dtype=torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scorer(torch.arange(10))
        scorer(torch.arange(10))
    emulated = [w for w in caught if "emulated" in str(w.message)]
    assert len(emulated) == (0 if "avx512_bf16" in flags else 1)


def test_bad_scorer_arguments():
    ds, model = _setup(10)
    with pytest.raises(LossImplementationNotProvidedException, match="loss_impl"):
        Scorer(model, ds, None)
    with pytest.raises(ValueError, match="batch_size"):
        Scorer(model, ds, _loss, batch_size=0)
    with pytest.raises(TypeError, match="autocast_dtype"):
        Scorer(model, ds, _loss, autocast_dtype="bf16")
    with pytest.raises(LossImplementationNotProvidedException, match="one loss per sample"):
        Scorer(model, ds, lambda m, b: _loss(m, b).mean())(torch.arange(4))
