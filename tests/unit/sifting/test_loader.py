import logging
import math
import re
import sys
import warnings
from collections import UserDict

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from hasten.sifting import (
    ListBatch,
    LossImplementationNotProvidedException,
    SiftConfigValidationException,
    SiftingBatchTransform,
    SiftingDataloader,
    TensorBatch,
    UnbiasedPruningConfig,
    UnsupportedDataFormatException,
)
from tests._helpers import (
    PlantedDataset,
    RecordingDataset,
    complete_passes,
    ids_of,
    loader,
    planted_loss,
    planted_x,
    sift_config,
    tiny_model,
)


def _sift(orig, beta=1.0, delay=0, **kw):
    cfg = kw.pop("config", None) or sift_config(beta=beta, delay=delay)
    return SiftingDataloader(
        cfg,
        orig,
        model=kw.pop("model", None) or tiny_model(),
        loss_impl=kw.pop("loss_impl", planted_loss),
        seed=0,
        **kw,
    )


class FakeBatchEncoding(UserDict):
    pass


def _collate_batchencoding(samples):
    x = torch.stack([s[0] for s in samples])
    return FakeBatchEncoding({"x": x, "labels": torch.tensor([s[1] for s in samples])})


def _collate_tuple(samples):
    return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])


FORMATS = {
    "tensor": ("tensor", None),
    "list": ("tuple", None),  # default_collate turns tuple samples into a list
    "tuple": ("tuple", _collate_tuple),
    "dict": ("dict", None),
    "batchencoding": ("tuple", _collate_batchencoding),
    "nested": ("nested", None),
}


@pytest.mark.parametrize("kind", list(FORMATS))
@pytest.mark.parametrize("drop_last", [False, True])
def test_full_batches_same_structure_each_sample_once(kind, drop_last):
    fmt, collate = FORMATS[kind]
    orig = loader(n=300, batch_size=16, fmt=fmt, collate_fn=collate, drop_last=drop_last)
    first = next(iter(orig))
    sifted = _sift(orig, beta=1.0)
    for _ in range(2):
        seen: list[int] = []
        out = list(sifted)
        for i, batch in enumerate(out):
            assert type(batch) is type(first)
            if isinstance(first, (dict, UserDict)):
                assert list(batch.keys()) == list(first.keys())
            if i < len(out) - 1 or drop_last:
                assert len(planted_x(batch)) == 16
            ids = ids_of(batch)
            seen += ids
            labels = (
                batch["labels"]
                if isinstance(batch, (dict, UserDict))
                else (None if kind == "tensor" else batch[1])
            )
            if labels is not None:  # rows stay aligned across fields
                assert labels.tolist() == [i % 3 for i in ids]
            if kind == "nested":
                assert batch["name"] == [f"s{i}" for i in ids]
                assert batch["inputs"][1]["mask"][:, 0].long().tolist() == ids
                assert batch["task"] == ["cls"] * len(ids)  # default_collate makes a list
        assert len(seen) == len(set(seen)), "a sample was yielded twice in one epoch"
        assert set(seen) <= set(range(300))
        kept_epoch = len(seen)
        assert 0.35 * 300 < kept_epoch < 0.65 * 300
    if drop_last:
        assert sifted.stats.num_samples_dropped_at_epoch_end > 0
    else:
        assert sifted.stats.num_samples_yielded == sifted.stats.num_orig_samples_kept


@pytest.mark.parametrize("beta", [0.5, 1.0, 3.0])
def test_keep_rate_for_uniform_losses(beta):
    # 24 000 samples with i.i.d. uniform losses: keep rate 1/(1+beta) within 2 points
    orig = loader(n=24_000, batch_size=200, fmt="tensor")
    sifted = _sift(orig, beta=beta, config=sift_config(beta=beta, history=500))
    kept = sum(len(b) for b in sifted)
    expected = 1 / (1 + beta)
    assert abs(kept / 24_000 - expected) < 0.02
    assert abs(sifted.stats.keep_rate - expected) < 0.02


def test_high_losses_are_kept_more():
    sifted = _sift(loader(n=4000, batch_size=50, fmt="tensor"), beta=1.0)
    kept_losses = torch.cat([b[:, 0] for b in sifted])
    assert kept_losses.mean() > 0.6  # uniform mean is 0.5; p**1 weighting gives 2/3


def test_delay_passes_batches_through_and_repeats_per_epoch():
    orig = loader(n=160, batch_size=16, fmt="tensor")
    sifted = SiftingDataloader(
        sift_config(delay=3, repeat=True), orig, model=tiny_model(), loss_impl=planted_loss
    )
    for _ in range(2):
        out = list(sifted)
        assert [ids_of(b) for b in out[:3]] == [list(range(i * 16, i * 16 + 16)) for i in range(3)]
        assert len(out) < 10  # sifting after the delay
    assert sifted.stats.num_orig_samples_scored == 2 * (160 - 48)
    once = SiftingDataloader(sift_config(delay=3), orig, model=tiny_model(), loss_impl=planted_loss)
    list(once)
    list(once)
    assert once.stats.num_orig_samples_scored == 2 * 160 - 48


def test_scoring_leaves_model_untouched_and_yields_trainable_tensors():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 3))
    model.train()
    model[3].eval()  # mixed modes inside a training model must come back exactly
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    modes = [m.training for m in model.modules()]
    during = []

    def loss(m, batch):
        during.append((m.training, m[1].training, m[2].training, torch.is_inference_mode_enabled()))
        return nn.functional.cross_entropy(m(batch[0]), batch[1], reduction="none")

    sifted = SiftingDataloader(
        sift_config(), loader(n=96, batch_size=16), model=model, loss_impl=loss
    )
    it = iter(sifted)
    while True:
        state = {k: v.clone() for k, v in model.state_dict().items()}
        grads = [p.grad.clone() for p in model.parameters()]
        try:
            batch = next(it)  # scores one or more incoming batches
        except StopIteration:
            break
        assert [m.training for m in model.modules()] == modes
        for k, v in model.state_dict().items():  # params and BatchNorm buffers
            assert torch.equal(v, state[k]), k
        for p, g in zip(model.parameters(), grads):
            assert torch.equal(p.grad, g)
        assert all(not t.is_inference() for t in batch)
        model(batch[0]).sum().backward()  # yielded tensors work with autograd
    assert during and all(d == (False, False, False, True) for d in during)


def test_stats_and_logging(caplog):
    sifted = _sift(
        loader(n=320, batch_size=16, fmt="tensor"), delay=2, log_interval=3, log_batch_data=True
    )
    with caplog.at_level(logging.INFO, logger="hasten.sifting"):
        out = list(sifted)
    s = sifted.stats
    assert s.num_orig_samples_seen == 320 and s.num_batches_in == 20
    assert s.num_orig_samples_scored == 320 - 32
    assert s.num_orig_samples_kept == 32 + (
        s.num_orig_samples_scored - s.num_orig_samples_sifted_out
    )
    assert s.num_batches_out == len(out) and s.num_samples_yielded == sum(len(b) for b in out)
    assert 0.3 < s.keep_rate < 0.7
    assert s.wall_seconds > 0 and 0 < s.scoring_share < 1 and 0 < s.sifting_share < 1
    assert set(s.stage_latency_ms()) == set(s.stage_seconds)
    d = s.as_dict()
    assert d["keep_rate"] == s.keep_rate and "stage_latency_ms" in d
    lines = [r.getMessage() for r in caplog.records]
    # scraped as the SageMaker example notebooks do (their metric regexes, line by line)
    seen = [m.group(1) for line in lines if (m := re.search(r"num_orig_samples_seen: (\S+)", line))]
    kept = [m.group(1) for line in lines if (m := re.search(r"num_orig_samples_kept: (\S+)", line))]
    size = [
        m.group(1)
        for line in lines
        if (m := re.search(r"Batch size for next sifted batch: (\S+)", line))
    ]
    # a line at every 3rd yielded batch, the first sifted batch (the 3rd) and the pass's end
    assert len(seen) == len(kept) == len(size) == len(out) // 3 + (len(out) % 3 != 0)
    assert int(seen[-1]) == 320 and int(kept[-1]) == s.num_orig_samples_kept
    assert all(int(v) == 16 for v in size)
    for stage in s.stage_seconds:
        assert float(re.search(rf" {stage}: (\S+)", lines[-1]).group(1)) >= 0
    values = [
        m.group(1) for line in lines if (m := re.search(r"relevance_values: \[(.*?)\]", line))
    ]
    assert len(values) == 18  # log_batch_data: one line per scored batch
    assert all(len(v.split(",")) == 16 for v in values)
    # SageMaker's metric regex for the kept samples' values, and hasten's 0/1 mask beside it
    for line in (x for x in lines if x.startswith("sifting batch ")):
        every = [
            float(v) for v in re.search(r"relevance_values: \[(.*?)\]", line).group(1).split(",")
        ]
        got = re.search(r"relevance_values_kept: \[(.*?)\]", line).group(1)
        mask = [int(v) for v in re.search(r" kept: \[(.*?)\]", line).group(1).split(",")]
        assert [float(v) for v in got.split(",") if v] == [
            v for v, k in zip(every, mask, strict=True) if k
        ]


def test_nonfinite_losses_kept_counted_warned_once():
    def loss(model, batch):
        x = batch[0]
        return torch.where(x[:, 1] % 10 == 0, float("nan"), x[:, 0])

    sifted = _sift(loader(n=200, batch_size=20), loss_impl=loss, beta=3.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = [i for b in sifted for i in ids_of(b)]
    assert sum("NaN" in str(w.message) for w in caught) == 1
    assert set(range(0, 200, 10)) <= set(seen)
    assert sifted.stats.num_nonfinite_losses == 20


def test_len_fixes_the_length_of_every_loop_and_loses_no_sample():
    ds = RecordingDataset(1600, "tensor")
    sifted = _sift(DataLoader(ds, batch_size=16, shuffle=True), beta=1.0, delay=10)
    assert len(sifted) == 55  # 10 passed through + 0.5 * 1440 / 16, fixed from here on
    kept: list[int] = []
    for _ in range(4):
        out = list(sifted)
        assert len(out) == len(sifted) == 55  # exact: a trainer stopping at len() cuts nothing
        kept += [i for b in out for i in ids_of(b)]
    passes = complete_passes(ds.drawn, 1600)
    assert passes >= 3 and sifted.stats.num_orig_samples_seen == len(ds.drawn)
    # every kept sample was yielded; only the pass still running holds rows not yielded yet
    s = sifted.stats
    assert s.num_orig_samples_kept - s.num_samples_yielded == sifted._buffer.count
    assert s.num_samples_dropped_at_epoch_end == 0 and len(kept) == s.num_samples_yielded
    assert s.num_batches_out == 4 * 55


def test_len_inside_a_loop_is_an_estimate_and_fixes_nothing():
    sifted = _sift(loader(n=320, batch_size=16, fmt="tensor"), beta=1.0)
    for _ in range(2):
        it = iter(sifted)
        assert len(sifted) == 10  # list() asks here, between iter() and the first batch
        out = [next(it)]
        assert 5 <= len(sifted) <= 20  # inside a started loop: at the rate observed so far
        out += list(it)
        assert 5 <= len(out) <= 15
    assert sifted.stats.num_orig_samples_seen == 640  # two whole passes
    assert len(sifted) == 10  # read outside a loop: fixed from now on
    assert [len(list(sifted)) for _ in range(2)] == [10, 10]

    probed = _sift(loader(n=320, batch_size=16, fmt="tensor"), beta=1.0)
    iter(probed)  # Lightning checks the loader is iterable, then plans by len()
    assert len(probed) == 10
    assert [len(list(probed)) for _ in range(3)] == [10, 10, 10]


class _SizedBatches:
    """A custom batch sampler: fixed-size batches of consecutive indices."""

    def __init__(self, n, size, with_size=True):
        self.n, self.size = n, size
        if with_size:
            self.batch_size = size

    def __iter__(self):
        return iter(
            [list(range(i, min(i + self.size, self.n))) for i in range(0, self.n, self.size)]
        )

    def __len__(self):
        return math.ceil(self.n / self.size)


def test_len_with_the_batch_size_on_the_batch_sampler():
    ds = PlantedDataset(320, "tensor")
    orig = DataLoader(ds, batch_sampler=_SizedBatches(320, 16))
    assert orig.batch_size is None  # as under Accelerate (DataLoaderShard)
    assert len(_sift(orig, beta=1.0)) == 10
    unsized = DataLoader(ds, batch_sampler=_SizedBatches(320, 16, with_size=False))
    with pytest.raises(TypeError, match=r"batch_size=N"):
        len(_sift(unsized, beta=1.0))
    assert len(_sift(unsized, beta=1.0, batch_size=16)) == 10

    class Stream(IterableDataset):
        def __iter__(self):
            yield from (torch.zeros(2) for _ in range(4))

    with pytest.raises(TypeError, match="__len__"):
        len(_sift(DataLoader(Stream(), batch_size=2)))


def test_len_under_accelerate_prepared_loader():
    accelerate = pytest.importorskip("accelerate")
    prepared = accelerate.Accelerator(cpu=True).prepare(loader(n=320, batch_size=16, fmt="tensor"))
    assert prepared.batch_size is None
    sifted = _sift(prepared, beta=1.0)
    assert len(sifted) == 10 and len(list(sifted)) == 10


def test_meta_device_model_names_to_empty():
    with torch.device("meta"):
        model = tiny_model()
    sifted = _sift(loader(n=32, batch_size=8, fmt="tensor"), model=model)
    with pytest.raises(RuntimeError, match=r"to_empty\(\)|to_empty"):
        next(iter(sifted))


def test_warns_once_when_the_delay_is_never_reached():
    sifted = _sift(loader(n=96, batch_size=16, fmt="tensor"), delay=1000)
    with pytest.warns(RuntimeWarning, match=r"sift_delay=1000 but only 6 batches"):
        list(sifted)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(sifted)  # once only
    fixed = _sift(loader(n=96, batch_size=16, fmt="tensor"), delay=1000)
    len(fixed)
    with pytest.warns(RuntimeWarning, match=r"sift_delay=1000 but only 6 batches"):
        list(fixed)  # the pass's last batch, even when the loop ends with it


def test_set_epoch_reaches_distributed_sampler():
    ds = PlantedDataset(64)
    sampler = DistributedSampler(ds, num_replicas=2, rank=0, shuffle=True, seed=0)
    sifted = _sift(DataLoader(ds, batch_size=8, sampler=sampler))
    sifted.set_epoch(3)
    assert sampler.epoch == 3


def test_attributes_delegate_to_wrapped_loader():
    orig = loader(n=32, batch_size=8)
    sifted = _sift(orig)
    assert sifted.dataset is orig.dataset and sifted.batch_size == 8
    with pytest.raises(AttributeError):
        sifted.no_such_attribute


def test_custom_batch_transform_sagemaker_style():
    class ToTensorBatch(SiftingBatchTransform):
        def transform(self, batch):
            return TensorBatch(batch[0], batch[1])

        def reverse_transform(self, tb):
            return [tb.inputs, tb.labels]

    class ToListBatch(SiftingBatchTransform):
        def transform(self, batch):
            return ListBatch(batch[0].tolist(), batch[1].tolist())

        def reverse_transform(self, lb):
            return [torch.tensor(lb.inputs), torch.tensor(lb.labels)]

    for transform, get_x in (
        (ToTensorBatch(), lambda b: b.inputs),
        (ToListBatch(), lambda b: torch.tensor(b.inputs)),
    ):

        def loss(model, transformed, original, get_x=get_x):
            assert original is not transformed
            return get_x(transformed)[:, 0].to(original[0].device)

        class L:
            def __init__(self, f):
                self.f = f

            def loss(self, model, transformed_batch, original_batch=None):
                return self.f(model, transformed_batch, original_batch)

        sifted = SiftingDataloader(
            sift_config(),
            loader(n=160, batch_size=16),
            batch_transforms=transform,
            model=tiny_model(),
            loss_impl=L(loss),
        )
        out = list(sifted)
        seen = [i for b in out for i in ids_of(b)]
        assert len(seen) == len(set(seen)) and all(len(b[0]) == 16 for b in out[:-1])
        assert all(b[1].tolist() == [i % 3 for i in ids_of(b)] for b in out)


def test_stale_iterator_raises():
    sifted = _sift(loader(n=64, batch_size=8))
    it = iter(sifted)
    next(it)
    iter(sifted)
    with pytest.raises(RuntimeError, match="stale"):
        next(it)


def test_sample_ids_point_at_stream_positions():
    sifted = _sift(loader(n=96, batch_size=16, fmt="tensor"))  # unshuffled: position == id
    for batch in sifted:
        assert sifted.last_sample_ids.tolist() == ids_of(batch)


def test_loader_names_the_sampler_for_sampler_only_rules():
    orig = loader(n=32, batch_size=8)
    for config in (UnbiasedPruningConfig(), {"policy": "stale_relative", "beta_value": 1.0}):
        with pytest.raises(SiftConfigValidationException, match="PruningSampler"):
            SiftingDataloader(config, orig, model=tiny_model(), loss_impl=planted_loss)


# ---------------------------------------------------------------- bad input


def test_missing_or_wrong_loss_and_model():
    orig, cfg = loader(), sift_config()
    with pytest.raises(LossImplementationNotProvidedException, match="loss_impl"):
        SiftingDataloader(cfg, orig, model=tiny_model())
    with pytest.raises(LossImplementationNotProvidedException, match="model="):
        SiftingDataloader(cfg, orig, loss_impl=planted_loss)
    with pytest.raises(LossImplementationNotProvidedException, match=r"nn\.Module"):
        SiftingDataloader(cfg, orig, model="m", loss_impl=planted_loss)
    with pytest.raises(LossImplementationNotProvidedException, match="instance"):
        SiftingDataloader(cfg, orig, model=tiny_model(), loss_impl=ListBatch)
    with pytest.raises(LossImplementationNotProvidedException, match="Wrap it"):
        SiftingDataloader(cfg, orig, model=tiny_model(), loss_impl=nn.CrossEntropyLoss())
    with pytest.raises(LossImplementationNotProvidedException, match="implement loss"):
        SiftingDataloader(cfg, orig, model=tiny_model(), loss_impl=3)
    with pytest.raises(SiftConfigValidationException, match="unknown key"):
        SiftingDataloader(
            {"beta_value": 1, "loss_history_length": 5, "x": 1},
            orig,
            model=tiny_model(),
            loss_impl=planted_loss,
        )


@pytest.mark.parametrize(
    ("loss", "match"),
    [
        (lambda m, b: b[0][:, 0].mean(), r"shape \[\].*reduction='none'"),
        (lambda m, b: b[0][:3, 0], r"shape \[3\].*shape \[16\].*batch order"),
        (lambda m, b: b[0][:, :2], r"shape \[16, 2\]"),
        (lambda m, b: 0.5, "returned float"),
        (lambda m, b: b[1], "floating point"),
    ],
)
def test_bad_loss_outputs_raise(loss, match):
    sifted = _sift(loader(n=64, batch_size=16), loss_impl=loss)
    with pytest.raises(LossImplementationNotProvidedException, match=match):
        next(iter(sifted))


def test_bad_batches_raise():
    def collate(samples):
        return torch.stack([s[0] for s in samples]).numpy()

    with pytest.raises(UnsupportedDataFormatException, match="collate_fn"):
        next(iter(_sift(loader(n=32, batch_size=8, collate_fn=collate))))

    def ambiguous(samples):
        return torch.stack([s[0] for s in samples]), torch.zeros(3)

    with pytest.raises(UnsupportedDataFormatException, match="ambiguous"):
        next(iter(_sift(loader(n=32, batch_size=8, collate_fn=ambiguous))))

    def per_sample_list(samples):  # un-collated: a list of per-sample feature vectors
        return [s[0] for s in samples]

    with pytest.raises(UnsupportedDataFormatException, match="batch_format_index"):
        next(iter(_sift(loader(n=32, batch_size=2, collate_fn=per_sample_list))))


def test_bad_arguments_raise():
    orig, cfg = loader(), sift_config()
    kw = {"model": tiny_model(), "loss_impl": planted_loss}
    with pytest.raises(ValueError, match="batch_format_index"):
        SiftingDataloader(cfg, orig, batch_format_index=-1, **kw)
    with pytest.raises(TypeError, match="SiftingBatchTransform"):
        SiftingDataloader(cfg, orig, batch_transforms=lambda b: b, **kw)
    with pytest.raises(ValueError, match="seed or generator"):
        SiftingDataloader(cfg, orig, seed=1, generator=torch.Generator(), **kw)


def test_one_host_read_per_scored_batch(monkeypatch):
    # CPU proxy for "at most one host sync per incoming batch": count the Tensor methods that
    # read device memory back to the host while the loader runs on a tensor-only batch
    calls = []
    for name in ("tolist", "item", "cpu", "numpy", "__bool__"):
        original = getattr(torch.Tensor, name)

        def spy(self, *a, _name=name, _orig=original, **k):
            caller = sys._getframe(1).f_code.co_filename
            if "hasten" in caller and "sifting" in caller:  # not the DataLoader's own seed read
                calls.append(_name)
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    sifted = _sift(loader(n=320, batch_size=16, fmt="tensor"), delay=2)
    for _ in sifted:
        pass
    assert sifted.stats.num_batches_scored == 18
    assert calls == ["tolist"] * 18


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_scoring_moves_batches_and_accumulates_on_device():
    model = tiny_model().cuda()
    sifted = _sift(loader(n=320, batch_size=16), model=model, delay=1)
    out = list(sifted)
    assert out[0][0].device.type == "cpu"  # the delay passes batches through untouched
    assert all(b[0].device.type == "cuda" and b[1].device.type == "cuda" for b in out[1:])
    ids = [i for b in out for i in ids_of(b)]
    assert len(ids) == len(set(ids))

    # mid-pass: the state holds the buffer by position, on the host, and resumes on CUDA
    again = _sift(loader(n=320, batch_size=16), model=model, delay=1)
    it = iter(again)
    head = [ids_of(next(it)) for _ in range(6)]
    state = again.state_dict()
    assert state["generator"]["device"] == "cuda"
    chunks = state["buffer"]["chunks"]
    assert all(c["rows"].device.type == "cpu" for c in chunks)
    assert sum(c["rows"].numel() for c in chunks) == state["buffer"]["count"]
    resumed = _sift(loader(n=320, batch_size=16), model=model, delay=1)
    resumed.load_state_dict(state)
    rest = [ids_of(b) for b in resumed]
    assert head + rest == [ids_of(b) for b in out]


def test_sagemaker_logger_name_quiets_or_raises_the_progress_lines(caplog):
    name = "hasten.smart_sifting.dataloader.sift_dataloader"
    sm = logging.getLogger(name)
    try:
        caplog.set_level(logging.INFO, logger=name)  # as a SageMaker client raises its logger
        list(_sift(loader(n=64, batch_size=16, fmt="tensor")))
        lines = [r for r in caplog.records if "num_orig_samples_seen: " in r.getMessage()]
        assert lines and {r.name for r in lines} == {name}
        caplog.clear()
        sm.setLevel(logging.WARNING)  # ... or quiets it
        list(_sift(loader(n=64, batch_size=16, fmt="tensor")))
        assert not [r for r in caplog.records if "num_orig_samples_seen" in r.getMessage()]
    finally:
        sm.setLevel(logging.NOTSET)
