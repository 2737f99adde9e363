"""Dynamic padding: rows of batches padded to different lengths merge, padded per field."""

import io

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hasten.sifting import (
    SiftingDataloader,
    TensorBatch,
    UnsupportedDataFormatException,
    concat_batches,
)
from hasten.sifting.batch import SiftingBatchTransform, TreeBatch
from hasten.sifting.padding import Padding
from tests._helpers import sift_config

PAD = 1  # RoBERTa's pad id: not 0, so a guessed 0 would show


def _encoded(lengths, first_id=10, label_offset=0):
    """A batch as DataCollatorWithPadding makes it: padded to its own longest sequence."""
    width = max(lengths)
    n = len(lengths)
    ids = torch.full((n, width), PAD)
    mask = torch.zeros(n, width, dtype=torch.long)
    labels = torch.full((n, width), -100)
    for r, length in enumerate(lengths):
        ids[r, :length] = torch.arange(length) + first_id + 100 * r
        mask[r, :length] = 1
        labels[r, :length] = torch.arange(length) % 3 + label_offset
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "idx": torch.arange(n)}


def test_ragged_dict_batches_merge_padded_per_field():
    a, b = _encoded([3, 5]), _encoded([2, 7, 4], first_id=50)
    out = concat_batches([a, b], pad_values={"input_ids": PAD})
    assert out["input_ids"].shape == (5, 7)
    for r, (src, row) in enumerate([(a, 0), (a, 1), (b, 0), (b, 1), (b, 2)]):
        w = src["input_ids"].shape[1]
        torch.testing.assert_close(out["input_ids"][r, :w], src["input_ids"][row])
        assert out["input_ids"][r, w:].eq(PAD).all()  # the tokenizer's pad id, never 0
        assert out["attention_mask"][r, w:].eq(0).all()  # default 0
        assert out["labels"][r, w:].eq(-100).all()  # default -100: ignored by the loss
        torch.testing.assert_close(out["attention_mask"][r, :w], src["attention_mask"][row])
        torch.testing.assert_close(out["labels"][r, :w], src["labels"][row])
    assert out["idx"].tolist() == [0, 1, 0, 1, 2]  # agreeing fields: concatenated as they are
    # the pads land where the attention mask is 0, so the mask still tells tokens from pads
    assert out["input_ids"].ne(PAD).eq(out["attention_mask"].bool()).all()


def test_left_padding_and_explicit_values_override_defaults():
    a = {"input_ids": torch.tensor([[7, 8]]), "labels": torch.tensor([[1, 2]])}
    b = {"input_ids": torch.tensor([[4, 5, 6]]), "labels": torch.tensor([[3, 4, 5]])}
    out = concat_batches([a, b], pad_values={"input_ids": 0, "labels": -1}, padding_side="left")
    assert out["input_ids"].tolist() == [[0, 7, 8], [4, 5, 6]]
    assert out["labels"].tolist() == [[-1, 1, 2], [3, 4, 5]]


def test_several_ragged_dims_and_tuple_positions():
    a = (torch.ones(1, 2, 3), torch.zeros(1))
    b = (torch.ones(2, 4, 1) * 2, torch.zeros(2))
    out = concat_batches([a, b], pad_values={0: -1.0})  # a tuple batch: fields by position
    assert out[0].shape == (3, 4, 3)
    assert out[0][0, :2, :3].eq(1).all() and out[0][0, 2:].eq(-1).all()
    assert out[0][1:, :, :1].eq(2).all() and out[0][1:, :, 1:].eq(-1).all()


def test_ragged_input_ids_without_a_pad_value_name_the_fix():
    a, b = _encoded([3]), _encoded([5])
    with pytest.raises(UnsupportedDataFormatException) as err:
        concat_batches([a, b])
    msg = str(err.value)
    assert "['input_ids']" in msg and "pad_values" in msg and "pad_token_id" in msg
    assert "max_length" in msg
    # any other field without a default: named too
    with pytest.raises(UnsupportedDataFormatException, match=r"pad_values=\{'pixel_mask'"):
        concat_batches([{"pixel_mask": torch.ones(1, 2)}, {"pixel_mask": torch.ones(1, 3)}])


def test_bad_pad_values_raise():
    with pytest.raises(ValueError, match="pad token"):
        Padding({"input_ids": None})  # e.g. GPT-2's tokenizer.pad_token_id
    with pytest.raises(TypeError, match="dict"):
        Padding([("input_ids", 0)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keys"):
        Padding({True: 0})
    with pytest.raises(TypeError, match="number"):
        Padding({"input_ids": "0"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="padding_side"):
        Padding(padding_side="center")

    class T(SiftingBatchTransform):
        def transform(self, batch):
            return TensorBatch(batch)

        def reverse_transform(self, tb):
            return tb.inputs

    with pytest.raises(ValueError, match="pad_values"):
        SiftingDataloader(
            sift_config(), [], batch_transforms=T(), model=nn.Linear(2, 1),
            loss_impl=lambda m, b: b, pad_values={"input_ids": 0},
        )  # fmt: skip


def test_fixed_length_fields_take_the_plain_path(monkeypatch):
    import hasten.sifting.batch as batch_mod

    def fail(*args, **kwargs):
        raise AssertionError("padding path taken for tensors that agree")

    monkeypatch.setattr(batch_mod, "pad_concat", fail)
    a, b = _encoded([4, 4]), _encoded([4, 4, 4])
    out = concat_batches([a, b])
    torch.testing.assert_close(out["input_ids"], torch.cat([a["input_ids"], b["input_ids"]]))


def _length(i: int) -> int:
    return 12 if i % 16 == 0 else 2 + i % 4  # a few long ones: batch widths differ


class Sentences(Dataset):
    """Sample i: tokens [1000 + i, i + 2, ...] (its id first, never the pad) of length _length(i)."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int):
        n = _length(i)
        return {"input_ids": torch.tensor([1000 + i] + [i + 2] * (n - 1)), "label": i % 2}


def _collate_longest(samples):
    """DataCollatorWithPadding(tokenizer) for a tokenizer whose pad id is 1."""
    width = max(len(s["input_ids"]) for s in samples)
    ids = torch.full((len(samples), width), PAD)
    mask = torch.zeros(len(samples), width, dtype=torch.long)
    for r, s in enumerate(samples):
        ids[r, : len(s["input_ids"])] = s["input_ids"]
        mask[r, : len(s["input_ids"])] = 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": torch.tensor([s["label"] for s in samples]),
    }


def _loss(model, batch):
    # planted: a pseudo-random function of the sample id (first token)
    first = batch["input_ids"][:, 0].float()
    return torch.sin(first * 12.9898).abs() + 0.0 * model(
        batch["attention_mask"].float()[:, :1]
    ).sum(1)


def _ragged_loader(**kw):
    orig = DataLoader(
        Sentences(),
        batch_size=8,
        shuffle=True,
        collate_fn=_collate_longest,
        generator=torch.Generator().manual_seed(0),
    )
    return SiftingDataloader(
        sift_config(beta=1.0, history=32, delay=1),
        orig,
        model=nn.Linear(1, 1),
        loss_impl=_loss,
        seed=0,
        pad_values={"input_ids": PAD},
        **kw,
    )


def _check_rows(batch):
    ids, mask = batch["input_ids"], batch["attention_mask"]
    out = []
    for r in range(len(ids)):
        i = int(ids[r, 0]) - 1000
        n = _length(i)
        assert ids[r, :n].tolist() == [1000 + i] + [i + 2] * (n - 1)  # the sample, intact
        assert ids[r, n:].eq(PAD).all() and mask[r, :n].eq(1).all() and mask[r, n:].eq(0).all()
        assert int(batch["labels"][r]) == i % 2
        out.append(i)
    return out


def test_sifting_a_dynamically_padded_loader(monkeypatch):
    import hasten.sifting.batch as batch_mod

    padded = []
    real = batch_mod.pad_concat
    monkeypatch.setattr(batch_mod, "pad_concat", lambda *a: padded.append(a[-1]) or real(*a))
    sifted = _ragged_loader()
    seen, widths = [], set()
    for batch in sifted:
        seen += _check_rows(batch)
        widths.add(batch["input_ids"].shape[1])
    assert len(seen) == len(set(seen)) and set(seen) <= set(range(96))
    assert 12 in widths and min(widths) < 12  # each batch padded to its own pieces' longest
    assert ("input_ids",) in padded and ("attention_mask",) in padded  # rows of mixed widths
    assert 0.2 < sifted.stats.keep_rate < 0.8


def test_resume_of_a_dynamically_padded_loader_is_exact():
    reference = [_check_rows(b) for b in _ragged_loader()]
    sifted = _ragged_loader()
    it = iter(sifted)
    got = [_check_rows(next(it)) for _ in range(2)]
    while sifted.state_dict()["buffer"]["count"] == 0:
        got.append(_check_rows(next(it)))
    buf = io.BytesIO()
    torch.save(sifted.state_dict(), buf)
    buf.seek(0)
    resumed = _ragged_loader()
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    got += [_check_rows(b) for b in resumed]
    assert got == reference


def test_tree_batch_keeps_its_padding_through_select_split_and_to():
    padding = Padding({"input_ids": PAD})
    tb = TreeBatch.from_batch(_encoded([2, 3, 4]), padding=padding)
    for part in (tb.select(torch.tensor([0, 2])), *tb.split(1), tb.to("cpu")):
        assert part.padding is padding
