"""A run resumed from state_dict mid-epoch yields exactly the batches of an uninterrupted run."""

import io

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from hasten.sifting import SiftingBatchTransform, SiftingDataloader, TensorBatch
from tests._helpers import PlantedDataset, planted_x, sift_config

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
    return torch.load(buf, weights_only=True)  # PyTorch's default, and Lightning's


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


def _assert_plain(obj, path="state"):
    """Only what weights_only=True restores as is: tensors, numbers, str, None, lists, dicts."""
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor)):
        return
    if type(obj) in (list, tuple):
        for i, x in enumerate(obj):
            _assert_plain(x, f"{path}[{i}]")
        return
    assert type(obj) is dict, f"{path} is a {type(obj).__name__}"
    for k, v in obj.items():
        assert isinstance(k, str), f"{path} has key {k!r}"
        _assert_plain(v, f"{path}[{k!r}]")


class _Record:
    """A batch type the built-in codec refuses: only a batch transform can sift it."""

    def __init__(self, x, labels):
        self.x, self.labels = x, labels


class _RecordTransform(SiftingBatchTransform):
    def transform(self, batch):
        return TensorBatch(batch.x, batch.labels)

    def reverse_transform(self, tb):
        return _Record(tb.inputs, tb.labels)


def _collate_record(samples):
    return _Record(
        torch.stack([s["x"] for s in samples]), torch.tensor([s["labels"] for s in samples])
    )


def _record_loader():
    ds = PlantedDataset(120, "dict")
    orig = DataLoader(
        ds,
        batch_size=8,
        shuffle=True,
        collate_fn=_collate_record,
        generator=torch.Generator().manual_seed(3),
    )
    torch.manual_seed(0)
    return SiftingDataloader(
        sift_config(beta=3.0, history=32, delay=1),  # keeps ~25 %: rows wait in the buffer
        orig,
        batch_transforms=_RecordTransform(),
        model=nn.Linear(4, 3),
        loss_impl=lambda m, b: b.inputs[:, 0] + 0.0 * m(b.inputs).sum(1),
        seed=11,
    )


def _dict_loader():
    return _build(delay=1)[0]


@pytest.mark.parametrize("kind", ["dict", "custom_transform"])
def test_state_with_buffered_rows_round_trips_with_weights_only(kind):
    """A mid-epoch state holding kept rows not yet yielded saves and loads with
    weights_only=True, and the resumed loader yields exactly the uninterrupted batches."""
    build = _dict_loader if kind == "dict" else _record_loader
    ids = (
        (lambda b: planted_x(b)[:, 1].long().tolist())
        if kind == "dict"
        else (lambda b: b.x[:, 1].long().tolist())
    )
    reference = [ids(b) for b in build()]

    sifted = build()
    it = iter(sifted)
    got = [ids(next(it)), ids(next(it))]  # past the delay
    while sifted.state_dict()["buffer"]["count"] == 0:  # stop with kept rows in flight
        got.append(ids(next(it)))
    state = sifted.state_dict()
    assert state["in_epoch"] and len(got) < len(reference) - 1
    _assert_plain(state)
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)

    resumed = build()
    resumed.load_state_dict(loaded)
    assert resumed.state_dict()["buffer"]["count"] == state["buffer"]["count"]  # before iterating
    n_before = len(got)
    got += [ids(b) for b in resumed]
    assert got == reference
    assert resumed.stats.num_samples_yielded == sifted.stats.num_samples_yielded + sum(
        len(b) for b in got[n_before:]
    )


def test_state_of_an_earlier_version_is_refused_with_the_fix():
    sifted, _, _ = _build()
    state = sifted.state_dict()
    state["version"] = 1
    with pytest.raises(ValueError, match=r"earlier hasten.*afresh"):
        sifted.load_state_dict(state)
    with pytest.raises(ValueError, match="state_dict"):
        sifted.load_state_dict({"history": {}})


def test_resume_with_different_data_says_so():
    sifted = _record_loader()
    it = iter(sifted)
    next(it)
    state = sifted.state_dict()
    # as if row 99 of the first batch had been kept: the replayed batch has only 8 rows
    chunk = {"batch": 0, "start": 0, "rows": torch.tensor([99]), "weights": None}
    state["buffer"] = {"count": 1, "chunks": [chunk]}
    resumed = _record_loader()
    resumed.load_state_dict(state)
    with pytest.raises(RuntimeError, match="same data"):
        next(iter(resumed))
