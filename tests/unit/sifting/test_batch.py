import collections
from collections import UserDict, namedtuple

import numpy as np
import pytest
import torch

from hasten.sifting import (
    ListBatch,
    TensorBatch,
    TreeBatch,
    UnsupportedDataFormatException,
    batch_size_of,
    concat_batches,
    select_rows,
    split_batch,
)

Pair = namedtuple("Pair", ["x", "y"])


class FakeBatchEncoding(UserDict):
    """Mimics transformers.BatchEncoding: a UserDict built from a dict, with extra state."""

    def __init__(self, data=None, encoding=None):
        super().__init__(data)
        self._encodings = encoding


def _batches(n=6):
    x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
    y = torch.arange(n)
    return {
        "tensor": x,
        "tuple": (x, y),
        "list": [x, y],
        "namedtuple": Pair(x, y),
        "dict": {"x": x, "labels": y},
        "ordered": collections.OrderedDict(x=x, labels=y),
        "batchencoding": FakeBatchEncoding({"input_ids": x.long(), "labels": y}),
        "nested": {
            "inputs": (x, {"mask": y.float()}),
            "labels": y,
            "names": [f"s{i}" for i in range(n)],
            "task": "cls",
            "none": None,
        },
    }


def _rows(batch):
    """Row ids recovered from any test batch (y, or x[:, 0] / 3)."""
    if isinstance(batch, torch.Tensor):
        return (batch[:, 0] / 3).long().tolist()
    if isinstance(batch, (dict, UserDict)):
        return batch["labels"].tolist()
    return batch[1].tolist()


@pytest.mark.parametrize("kind", list(_batches()))
def test_select_concat_split_keep_type_and_rows(kind):
    batch = _batches()[kind]
    assert batch_size_of(batch) == 6
    idx = torch.tensor([0, 2, 5])
    sel = select_rows(batch, idx)
    assert type(sel) is type(batch)
    assert _rows(sel) == [0, 2, 5]
    merged = concat_batches([sel, select_rows(batch, torch.tensor([1]))])
    assert type(merged) is type(batch) and _rows(merged) == [0, 2, 5, 1]
    head, tail = split_batch(merged, 3)
    assert _rows(head) == [0, 2, 5] and _rows(tail) == [1]
    if kind == "nested":
        assert sel["names"] == ["s0", "s2", "s5"]
        assert sel["task"] == "cls" and sel["none"] is None
        assert sel["inputs"][1]["mask"].tolist() == [0.0, 2.0, 5.0]
        assert isinstance(sel["inputs"], tuple)
        # every row of every field stays aligned
        torch.testing.assert_close(sel["inputs"][0][:, 0] / 3, sel["labels"].float())
    if kind == "batchencoding":
        assert sel._encodings is None  # per-sample tokenizer encodings are not carried over


def test_real_batch_encoding_round_trips():
    transformers = pytest.importorskip("transformers")
    enc = transformers.BatchEncoding(
        {"input_ids": torch.arange(8).reshape(4, 2), "attention_mask": torch.ones(4, 2)}
    )
    out = select_rows(enc, torch.tensor([1, 3]))
    assert isinstance(out, transformers.BatchEncoding)
    assert out["input_ids"].tolist() == [[2, 3], [6, 7]]
    assert out.to("cpu") is not None  # still a working BatchEncoding


def test_defaultdict_and_tuple_of_strings():
    d = collections.defaultdict(list, {"x": torch.arange(3), "ids": ("a", "b", "c")})
    out = select_rows(d, torch.tensor([2]))
    assert isinstance(out, collections.defaultdict) and out.default_factory is list
    assert out["ids"] == ("c",)


def test_feature_major_with_batch_format_index():
    x = torch.arange(12).reshape(3, 4)  # 3 features x 4 samples
    tb = TreeBatch.from_batch((x, x * 10), batch_format_index=1)
    assert len(tb) == 4
    out = tb.select(torch.tensor([1, 3])).to_batch()
    assert out[0].tolist() == [[1, 3], [5, 7], [9, 11]]


def test_ambiguous_size_raises_with_hint():
    with pytest.raises(UnsupportedDataFormatException, match="batch_format_index=1"):
        batch_size_of((torch.zeros(3, 4), torch.zeros(5, 4)))
    with pytest.raises(UnsupportedDataFormatException, match="ambiguous"):
        batch_size_of({"x": torch.zeros(3), "ids": ["a", "b"]})


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        (np.zeros((3, 2)), "numpy"),
        ((torch.zeros(3), object()), "object"),
        ({"x": torch.tensor(1.0)}, "0-d tensor"),
        ({"a": 1, "b": "s"}, "no tensor"),
    ],
)
def test_unsupported_batches_raise_naming_the_fix(batch, match):
    with pytest.raises(UnsupportedDataFormatException, match=match) as err:
        batch_size_of(batch)
    assert "batch_transforms" in str(err.value)


def test_concat_mismatched_shapes_names_the_field_and_padding():
    a = {"input_ids": torch.zeros(2, 7)}
    b = {"input_ids": torch.zeros(2, 9)}
    with pytest.raises(UnsupportedDataFormatException, match=r"\['input_ids'\].*max_length"):
        concat_batches([a, b])


def test_concat_different_constants_raises():
    with pytest.raises(UnsupportedDataFormatException, match="constant"):
        concat_batches([{"x": torch.zeros(2), "t": "a"}, {"x": torch.zeros(2), "t": "b"}])


def test_tensor_and_list_batch():
    tb = TensorBatch(torch.arange(5).float(), torch.arange(5) * 2)
    sel = tb.select(torch.tensor([1, 4]))
    assert sel.inputs.tolist() == [1.0, 4.0] and sel.labels.tolist() == [2, 8]
    both = TensorBatch.concat([sel, tb.select(torch.tensor([0]))])
    head, tail = both.split(2)
    assert head.inputs.tolist() == [1.0, 4.0] and tail.labels.tolist() == [0]
    lb = ListBatch([[1], [2], [3]], ["a", "b", "c"])
    sel = lb.select(torch.tensor([0, 2]))
    assert sel.inputs == [[1], [3]] and sel.labels == ["a", "c"]
    assert ListBatch.concat([sel, lb.select(torch.tensor([1]))]).labels == ["a", "c", "b"]
    assert ListBatch([1, 2]).select(torch.tensor([1])).labels is None
    with pytest.raises(UnsupportedDataFormatException, match="labels"):
        TensorBatch(torch.zeros(3), torch.zeros(2))
    with pytest.raises(UnsupportedDataFormatException, match="labels"):
        ListBatch([1, 2], [1])
    with pytest.raises(UnsupportedDataFormatException, match="same SiftingBatch type"):
        TensorBatch.concat([tb, lb])
