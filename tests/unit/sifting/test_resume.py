"""A run resumed from state_dict mid-epoch yields exactly the batches of an uninterrupted run."""

import io

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from hasten.sifting import SiftingDataloader
from tests.unit.sifting._helpers import PlantedDataset, planted_x, sift_config

EPOCHS = 3


def _build(sampler_kind="generator", num_workers=0, delay=2, drop_last=False):
    ds = PlantedDataset(200, "dict")
    if sampler_kind == "generator":
        orig = DataLoader(
            ds,
            batch_size=16,
            shuffle=True,
            drop_last=drop_last,
            generator=torch.Generator().manual_seed(5),
            num_workers=num_workers,
        )
    else:
        sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=5)
        orig = DataLoader(ds, batch_size=16, sampler=sampler, num_workers=num_workers)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss(m, batch):
        return nn.functional.cross_entropy(m(batch["x"]), batch["labels"], reduction="none")

    sifted = SiftingDataloader(
        sift_config(beta=1.0, history=64, delay=delay), orig, model=model, loss_impl=loss, seed=7
    )
    return sifted, model, opt


def _train_step(model, opt, batch):
    opt.zero_grad()
    nn.functional.cross_entropy(model(batch["x"]), batch["labels"]).backward()
    opt.step()


def _run(sifted, model, opt, first_epoch, stop_after=None, record=None):
    """Train epochs [first_epoch, EPOCHS); returns (epoch, steps) if stopped early."""
    steps = 0
    for epoch in range(first_epoch, EPOCHS):
        sifted.set_epoch(epoch)
        for batch in sifted:
            record.append(planted_x(batch)[:, 1].long().tolist())
            _train_step(model, opt, batch)
            steps += 1
            if steps == stop_after:
                return epoch
    return None


def _checkpoint(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize(
    ("stop_after", "sampler_kind", "drop_last"),
    [
        (1, "generator", False),  # inside the delay
        (9, "generator", False),  # mid first epoch, partial buffer
        (10, "generator", True),  # mid second epoch
        (13, "distributed", False),
    ],
)
def test_resume_mid_epoch_yields_identical_batches(stop_after, sampler_kind, drop_last):
    reference: list[list[int]] = []
    sifted, model, opt = _build(sampler_kind, drop_last=drop_last)
    _run(sifted, model, opt, 0, record=reference)

    resumed: list[list[int]] = []
    sifted, model, opt = _build(sampler_kind, drop_last=drop_last)
    epoch = _run(sifted, model, opt, 0, stop_after=stop_after, record=resumed)
    assert epoch is not None
    ckpt = _checkpoint(
        {
            "sift": sifted.state_dict(),
            "model": model.state_dict(),
            "opt": opt.state_dict(),
            "epoch": epoch,
        }
    )
    del sifted, model, opt

    sifted, model, opt = _build(sampler_kind, drop_last=drop_last)
    sifted.load_state_dict(ckpt["sift"])
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    for batch in sifted:  # the rest of the interrupted epoch
        resumed.append(planted_x(batch)[:, 1].long().tolist())
        _train_step(model, opt, batch)
    _run(sifted, model, opt, ckpt["epoch"] + 1, record=resumed)
    assert resumed == reference
    assert sifted.stats.num_orig_samples_seen == (192 if drop_last else 200) * EPOCHS


def test_resume_at_epoch_boundary_starts_next_epoch():
    sifted, model, _ = _build()
    first = [planted_x(b)[:, 1].long().tolist() for b in sifted]
    state = _checkpoint(sifted.state_dict())
    second = [planted_x(b)[:, 1].long().tolist() for b in sifted]
    fresh, _, _ = _build()
    fresh.model.load_state_dict(model.state_dict())
    fresh.load_state_dict(state)
    assert [planted_x(b)[:, 1].long().tolist() for b in fresh] == second
    assert first != second


def test_resume_warns_when_order_cannot_be_replayed():
    ds = PlantedDataset(64, "dict")
    orig = DataLoader(ds, batch_size=8, shuffle=True)  # global RNG
    sifted = SiftingDataloader(
        sift_config(), orig, model=nn.Linear(4, 3), loss_impl=lambda m, b: b["x"][:, 0]
    )
    it = iter(sifted)
    next(it)
    state = sifted.state_dict()
    with pytest.warns(UserWarning, match="cannot be replayed"):
        SiftingDataloader(
            sift_config(), orig, model=nn.Linear(4, 3), loss_impl=lambda m, b: b["x"][:, 0]
        ).load_state_dict(state)


def test_num_workers_two_full_batches_each_sample_once_and_exact_resume():
    sifted, _, _ = _build(num_workers=2, delay=0)
    for _ in range(2):
        out = [planted_x(b)[:, 1].long().tolist() for b in sifted]
        ids = [i for b in out for i in b]
        assert len(ids) == len(set(ids)) and set(ids) <= set(range(200))
        assert all(len(b) == 16 for b in out[:-1])

    reference: list[list[int]] = []
    sifted, model, opt = _build(num_workers=2)
    _run(sifted, model, opt, 0, record=reference)
    resumed: list[list[int]] = []
    sifted, model, opt = _build(num_workers=2)
    epoch = _run(sifted, model, opt, 0, stop_after=11, record=resumed)
    ckpt = _checkpoint(
        {"sift": sifted.state_dict(), "model": model.state_dict(), "opt": opt.state_dict()}
    )
    sifted, model, opt = _build(num_workers=2)
    sifted.load_state_dict(ckpt["sift"])
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    for batch in sifted:
        resumed.append(planted_x(batch)[:, 1].long().tolist())
        _train_step(model, opt, batch)
    _run(sifted, model, opt, epoch + 1, record=resumed)
    assert resumed == reference
