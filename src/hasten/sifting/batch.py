"""Split, select and concatenate batches of any common structure, keeping their type.

Sifting drops rows of incoming batches and refills full batches from the rows kept, so it must
take batches apart by sample and put them back together. The built-in codec handles:

- tensors (samples along dimension ``batch_format_index``, 0 by default);
- tuples, lists, namedtuples, dicts and other mappings, nested to any depth, including Hugging
  Face ``BatchEncoding`` (recognised as a mapping; ``transformers`` is never imported);
- per-sample lists of strings or numbers (what ``default_collate`` makes of string fields);
- constants (``None``, numbers, strings in a container): copied as they are, and required to be
  equal in batches whose rows are merged.

Anything else (NumPy arrays, custom classes) raises
:class:`~hasten.sifting.exceptions.UnsupportedDataFormatException` naming the fix: convert it in
the ``collate_fn``, or pass a :class:`SiftingBatchTransform` that turns the batch into a
:class:`TensorBatch` or :class:`ListBatch` (SageMaker's protocol, kept as is).

Functions for your own loop::

    n = batch_size_of(batch)
    kept = select_rows(batch, torch.tensor([0, 2, 5]))
    merged = concat_batches([kept, other])
    head, tail = split_batch(merged, 4)
"""

from __future__ import annotations

import collections
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from hasten.sifting.exceptions import UnsupportedDataFormatException
from hasten.sifting.padding import Padding, pad_concat

__all__ = [
    "DefaultBatchTransform",
    "ListBatch",
    "SiftingBatch",
    "SiftingBatchTransform",
    "TensorBatch",
    "TreeBatch",
    "batch_size_of",
    "concat_batches",
    "move_to_device",
    "select_rows",
    "split_batch",
]

_SCALARS = (str, bytes, int, float, bool, complex, type(None))
_FIX = (
    "Fix: convert it to tensors in your collate_fn, or pass batch_transforms=<a "
    "SiftingBatchTransform returning a TensorBatch or ListBatch>"
)


# --------------------------------------------------------------------------- SageMaker protocol


class SiftingBatch(ABC):
    """A batch sifting can count, select rows of, concatenate and split.

    Implement this only for a batch format the built-in codec does not cover (most users return a
    :class:`TensorBatch` or :class:`ListBatch` from their :class:`SiftingBatchTransform`).
    """

    @abstractmethod
    def __len__(self) -> int:
        """Number of samples."""

    @abstractmethod
    def select(self, indices: Tensor) -> SiftingBatch:
        """The samples at ``indices`` (1-D int64 tensor, ascending), in that order."""

    @classmethod
    @abstractmethod
    def concat(cls, batches: Sequence[SiftingBatch]) -> SiftingBatch:
        """The samples of ``batches`` one after the other."""

    def split(self, n: int) -> tuple[SiftingBatch, SiftingBatch]:
        """The first ``n`` samples and the rest."""
        idx = torch.arange(len(self))
        return self.select(idx[:n]), self.select(idx[n:])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SiftingBatch:
        """The batch on ``device``; the default leaves it where it is."""
        return self


class SiftingBatchTransform(ABC):
    """Converts a batch to a :class:`SiftingBatch` and back (SageMaker's protocol)."""

    @abstractmethod
    def transform(self, batch: Any) -> SiftingBatch:
        """The loader's batch as a :class:`SiftingBatch`."""

    @abstractmethod
    def reverse_transform(self, sifting_batch: SiftingBatch) -> Any:
        """A sifted :class:`SiftingBatch` back in the form the training loop expects."""


class TensorBatch(SiftingBatch):
    """Inputs and optional labels, each a tensor with samples along dimension 0."""

    def __init__(self, inputs: Tensor, labels: Tensor | None = None) -> None:
        if not isinstance(inputs, Tensor) or inputs.ndim == 0:
            raise UnsupportedDataFormatException(
                f"TensorBatch inputs must be a tensor with a batch dimension, got "
                f"{_describe(inputs)}; use ListBatch for Python lists"
            )
        if labels is not None and (
            not isinstance(labels, Tensor) or labels.shape[:1] != inputs.shape[:1]
        ):
            raise UnsupportedDataFormatException(
                f"TensorBatch labels must be a tensor with {inputs.shape[0]} rows like inputs, got "
                f"{_describe(labels)}"
            )
        self.inputs = inputs
        self.labels = labels

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def select(self, indices: Tensor) -> TensorBatch:
        idx = indices.to(self.inputs.device)
        labels = None if self.labels is None else self.labels.index_select(0, idx)
        return TensorBatch(self.inputs.index_select(0, idx), labels)

    @classmethod
    def concat(cls, batches: Sequence[SiftingBatch]) -> TensorBatch:
        tb = _same_type(batches, TensorBatch)
        labels = None if tb[0].labels is None else torch.cat([b.labels for b in tb])  # type: ignore[misc]
        return TensorBatch(torch.cat([b.inputs for b in tb]), labels)

    def split(self, n: int) -> tuple[TensorBatch, TensorBatch]:
        lab = self.labels
        return (
            TensorBatch(self.inputs[:n], None if lab is None else lab[:n]),
            TensorBatch(self.inputs[n:], None if lab is None else lab[n:]),
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TensorBatch:
        lab = self.labels
        return TensorBatch(
            self.inputs.to(device, non_blocking=non_blocking),
            None if lab is None else lab.to(device, non_blocking=non_blocking),
        )


class ListBatch(SiftingBatch):
    """Inputs and optional labels as Python lists, one entry per sample.

    Selecting rows of Python lists loops over the kept samples in Python; prefer
    :class:`TensorBatch` (or no transform at all) where the data are tensors.
    """

    def __init__(self, inputs: Sequence[Any], labels: Sequence[Any] | None = None) -> None:
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
            raise UnsupportedDataFormatException(
                f"ListBatch inputs must be a list with one entry per sample, got {_describe(inputs)}"
            )
        if labels is not None and (not isinstance(labels, Sequence) or len(labels) != len(inputs)):
            raise UnsupportedDataFormatException(
                f"ListBatch labels must be a list of {len(inputs)} entries like inputs, got "
                f"{_describe(labels)}"
            )
        self.inputs = list(inputs)
        self.labels = None if labels is None else list(labels)

    def __len__(self) -> int:
        return len(self.inputs)

    def select(self, indices: Tensor) -> ListBatch:
        idx = indices.tolist()  # host copy: lists live on the host
        labels = None if self.labels is None else [self.labels[i] for i in idx]
        return ListBatch([self.inputs[i] for i in idx], labels)

    @classmethod
    def concat(cls, batches: Sequence[SiftingBatch]) -> ListBatch:
        lb = _same_type(batches, ListBatch)
        labels = None if lb[0].labels is None else [x for b in lb for x in b.labels]  # type: ignore[union-attr]
        return ListBatch([x for b in lb for x in b.inputs], labels)

    def split(self, n: int) -> tuple[ListBatch, ListBatch]:
        lab = self.labels
        return (
            ListBatch(self.inputs[:n], None if lab is None else lab[:n]),
            ListBatch(self.inputs[n:], None if lab is None else lab[n:]),
        )


def _same_type(batches: Sequence[SiftingBatch], cls: type) -> list[Any]:
    if not batches:
        raise ValueError("cannot concatenate an empty list of batches")
    for b in batches:
        if not isinstance(b, cls):
            raise UnsupportedDataFormatException(
                f"cannot concatenate {cls.__name__} with {type(b).__name__}: a batch transform "
                "must return the same SiftingBatch type for every batch"
            )
    return list(batches)


# --------------------------------------------------------------------------- built-in codec
#
# A batch is flattened into a spec (its structure, hashable and comparable) plus two leaf lists:
# tensors (split along `dim`) and per-sample Python lists. Spec nodes:
#   ("t", i)                      tensor leaf i
#   ("l", i, type)                per-sample list leaf i, rebuilt as `type`
#   ("c", value)                  constant
#   ("s", type, children)         tuple / list / namedtuple
#   ("m", type, extra, keys, children)   mapping (extra: defaultdict's default_factory)


class TreeBatch(SiftingBatch):
    """Any supported nested batch, flattened for sifting (see the module docstring)."""

    __slots__ = ("dim", "lists", "padding", "size", "spec", "tensors")

    def __init__(
        self,
        spec: tuple,
        tensors: list[Tensor],
        lists: list[list[Any]],
        size: int,
        dim: int,
        padding: Padding | None = None,
    ) -> None:
        self.spec, self.tensors, self.lists, self.size, self.dim = spec, tensors, lists, size, dim
        self.padding = padding

    @classmethod
    def from_batch(
        cls, batch: Any, batch_format_index: int | None = None, padding: Padding | None = None
    ) -> TreeBatch:
        """Flatten ``batch`` and find its number of samples.

        ``padding`` says how :meth:`concat` pads fields whose lengths differ between batches
        (see :mod:`hasten.sifting.padding`); without it only the defaults apply.

        Raises:
            UnsupportedDataFormatException: unsupported leaf type, no splittable leaf, or leaves
                that disagree on the number of samples.
        """
        dim = 0 if batch_format_index is None else batch_format_index
        tensors: list[Tensor] = []
        lists: list[list[Any]] = []
        spec = _flatten(batch, (), tensors, lists)
        size = _infer_size(spec, tensors, lists, dim, batch_format_index)
        return cls(spec, tensors, lists, size, dim, padding)

    def to_batch(self) -> Any:
        """Rebuild the original structure around the current leaves."""
        return _unflatten(self.spec, self.tensors, self.lists)

    def __len__(self) -> int:
        return self.size

    def select(self, indices: Tensor) -> TreeBatch:
        dim = self.dim
        by_device: dict[torch.device, Tensor] = {}
        tensors = []
        for t in self.tensors:
            idx = by_device.get(t.device)
            if idx is None:
                idx = by_device[t.device] = indices.to(t.device)
            tensors.append(t.index_select(dim, idx))
        lists = []
        if self.lists:
            host = indices.tolist()  # host copy, only for batches carrying Python lists
            lists = [[leaf[i] for i in host] for leaf in self.lists]
        return TreeBatch(self.spec, tensors, lists, indices.numel(), dim, self.padding)

    @classmethod
    def concat(cls, batches: Sequence[SiftingBatch]) -> TreeBatch:
        tb: list[TreeBatch] = _same_type(batches, TreeBatch)
        if len(tb) == 1:
            return tb[0]
        first = tb[0]
        for other in tb[1:]:
            if other.spec != first.spec:
                raise UnsupportedDataFormatException(
                    "sifting merges rows of consecutive batches, but two batches differ in "
                    f"structure or constant fields:\n  {_show_spec(first.spec)}\n  "
                    f"{_show_spec(other.spec)}\nMake every batch the same structure (constants "
                    "equal), or pass batch_transforms=<a SiftingBatchTransform>"
                )
        dim = first.dim
        tensors = []
        for i, leaves in enumerate(zip(*(b.tensors for b in tb))):
            try:
                tensors.append(torch.cat(leaves, dim=dim))
            except RuntimeError as err:  # lengths differ (dynamic padding), or worse
                padded = pad_concat(leaves, dim, first.padding, _leaf_keys(first.spec)[i])
                if padded is None:
                    path = _leaf_paths(first.spec)[("t", i)]
                    shapes = ", ".join(str(tuple(t.shape)) for t in leaves)
                    raise UnsupportedDataFormatException(
                        f"cannot merge rows of batch{path} across batches (shapes {shapes}): "
                        f"{str(err).splitlines()[0]}. Sifting refills full batches from rows of several batches, so "
                        "a field must have the same number of dimensions, dtype family and "
                        "device in every batch; otherwise pass batch_transforms=<a "
                        "SiftingBatchTransform>"
                    ) from err
                tensors.append(padded)
        lists = [[x for leaf in leaves for x in leaf] for leaves in zip(*(b.lists for b in tb))]
        return TreeBatch(first.spec, tensors, lists, sum(b.size for b in tb), dim, first.padding)

    def split(self, n: int) -> tuple[TreeBatch, TreeBatch]:
        d, size = self.dim, self.size
        head = TreeBatch(
            self.spec,
            [t.narrow(d, 0, n) for t in self.tensors],
            [leaf[:n] for leaf in self.lists],
            n,
            d,
            self.padding,
        )
        tail = TreeBatch(
            self.spec,
            [t.narrow(d, n, size - n) for t in self.tensors],
            [leaf[n:] for leaf in self.lists],
            size - n,
            d,
            self.padding,
        )
        return head, tail

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TreeBatch:
        tensors = [t.to(device, non_blocking=non_blocking) for t in self.tensors]
        return TreeBatch(self.spec, tensors, self.lists, self.size, self.dim, self.padding)


class DefaultBatchTransform(SiftingBatchTransform):
    """The built-in codec as a :class:`SiftingBatchTransform` (used when none is given)."""

    def __init__(
        self, batch_format_index: int | None = None, padding: Padding | None = None
    ) -> None:
        self.batch_format_index = batch_format_index
        self.padding = padding

    def transform(self, batch: Any) -> TreeBatch:
        return TreeBatch.from_batch(batch, self.batch_format_index, self.padding)

    def reverse_transform(self, sifting_batch: SiftingBatch) -> Any:
        if not isinstance(sifting_batch, TreeBatch):
            raise TypeError(f"expected a TreeBatch, got {type(sifting_batch).__name__}")
        return sifting_batch.to_batch()


# --------------------------------------------------------------------------- functional API


def batch_size_of(batch: Any, batch_format_index: int | None = None) -> int:
    """Number of samples in ``batch`` (see the module docstring for what is supported)."""
    return len(TreeBatch.from_batch(batch, batch_format_index))


def select_rows(batch: Any, indices: Tensor, batch_format_index: int | None = None) -> Any:
    """The samples of ``batch`` at ``indices``, in the same structure and types."""
    return TreeBatch.from_batch(batch, batch_format_index).select(indices).to_batch()


def concat_batches(
    batches: Sequence[Any],
    batch_format_index: int | None = None,
    *,
    pad_values: Mapping[str | int, float | bool] | None = None,
    padding_side: str = "right",
) -> Any:
    """The samples of ``batches`` one after another, in their common structure.

    Fields padded to different lengths are padded to the longest with ``pad_values`` (see
    :mod:`hasten.sifting.padding`).
    """
    padding = Padding(pad_values, padding_side)
    trees = [TreeBatch.from_batch(b, batch_format_index, padding) for b in batches]
    return TreeBatch.concat(trees).to_batch()


def split_batch(batch: Any, n: int, batch_format_index: int | None = None) -> tuple[Any, Any]:
    """The first ``n`` samples of ``batch`` and the rest (views of tensors, no copy)."""
    head, tail = TreeBatch.from_batch(batch, batch_format_index).split(n)
    return head.to_batch(), tail.to_batch()


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """``batch`` with every tensor it holds on ``device``; objects it does not know are kept."""
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, SiftingBatch):
        return batch.to(device, non_blocking=non_blocking)
    try:
        tensors: list[Tensor] = []
        lists: list[list[Any]] = []
        spec = _flatten(batch, (), tensors, lists)
    except UnsupportedDataFormatException:
        to = getattr(batch, "to", None)
        return to(device) if callable(to) else batch
    moved = [t.to(device, non_blocking=non_blocking) for t in tensors]
    return _unflatten(spec, moved, lists)


# --------------------------------------------------------------------------- flatten / unflatten


def _flatten(obj: Any, path: tuple, tensors: list[Tensor], lists: list[list[Any]]) -> tuple:
    if isinstance(obj, Tensor):
        tensors.append(obj)
        return ("t", len(tensors) - 1)
    if isinstance(obj, _SCALARS):
        return ("c", obj)
    if isinstance(obj, Mapping):
        keys = tuple(obj.keys())
        children = tuple(_flatten(obj[k], (*path, k), tensors, lists) for k in keys)
        extra = obj.default_factory if isinstance(obj, collections.defaultdict) else None
        return ("m", type(obj), extra, keys, children)
    if isinstance(obj, (list, tuple)):
        if obj and all(isinstance(x, _SCALARS) for x in obj):
            lists.append(list(obj))
            return ("l", len(lists) - 1, type(obj))
        children = tuple(_flatten(x, (*path, i), tensors, lists) for i, x in enumerate(obj))
        return ("s", type(obj), children)
    raise UnsupportedDataFormatException(
        f"batch{_fmt_path(path)} is {_describe(obj)}: the built-in batch codec splits tensors, "
        f"tuples/lists/dicts/BatchEncoding of them, and lists of strings or numbers. {_FIX}"
    )


def _unflatten(spec: tuple, tensors: list[Tensor], lists: list[list[Any]]) -> Any:
    kind = spec[0]
    if kind == "t":
        return tensors[spec[1]]
    if kind == "c":
        return spec[1]
    if kind == "l":
        leaf = lists[spec[1]]
        return leaf if spec[2] is list else spec[2](leaf)
    if kind == "s":
        cls, children = spec[1], spec[2]
        items = [_unflatten(c, tensors, lists) for c in children]
        if cls is tuple or cls is list:
            return cls(items)
        if hasattr(cls, "_fields"):  # namedtuple
            return cls(*items)
        return cls(items)
    cls, extra, keys, children = spec[1], spec[2], spec[3], spec[4]
    data = {k: _unflatten(c, tensors, lists) for k, c in zip(keys, children)}
    if cls is dict:
        return data
    if extra is not None:
        return cls(extra, data)
    try:
        return cls(data)
    except Exception as err:
        raise UnsupportedDataFormatException(
            f"cannot rebuild a {cls.__name__} batch from a dict (its constructor does not take "
            f"one: {err}). {_FIX}"
        ) from err


def _infer_size(
    spec: tuple,
    tensors: list[Tensor],
    lists: list[list[Any]],
    dim: int,
    batch_format_index: int | None,
) -> int:
    for i, t in enumerate(tensors):
        if t.ndim <= dim:
            path = _leaf_paths(spec)[("t", i)]
            raise UnsupportedDataFormatException(
                f"batch{path} is a {t.ndim}-d tensor, with no sample dimension {dim}: every "
                f"tensor in a batch needs one. {_FIX}"
            )
    sizes = [t.shape[dim] for t in tensors] + [len(leaf) for leaf in lists]
    if not sizes:
        raise UnsupportedDataFormatException(
            f"the batch holds no tensor and no per-sample list, so it cannot be split: {_FIX}"
        )
    if all(s == sizes[0] for s in sizes):
        return sizes[0]
    paths = _leaf_paths(spec)
    names = [("t", i) for i in range(len(tensors))] + [("l", i) for i in range(len(lists))]
    detail = ", ".join(f"batch{paths[n]}: {s}" for n, s in zip(names, sizes))
    hint = ""
    if (
        batch_format_index is None
        and not lists
        and all(t.ndim >= 2 for t in tensors)
        and len({t.shape[1] for t in tensors}) == 1
    ):
        hint = (
            " All tensors agree on dimension 1: if samples lie along it, pass batch_format_index=1."
        )
    raise UnsupportedDataFormatException(
        f"the batch size is ambiguous: fields disagree on the number of samples along dimension "
        f"{dim} ({detail}).{hint} Otherwise pass batch_transforms=<a SiftingBatchTransform> "
        "that says which rows belong together"
    )


def _leaf_paths(spec: tuple, path: tuple = (), out: dict | None = None) -> dict[tuple, str]:
    out = {} if out is None else out
    kind = spec[0]
    if kind in ("t", "l"):
        out[(kind, spec[1])] = _fmt_path(path)
    elif kind == "s":
        for i, c in enumerate(spec[2]):
            _leaf_paths(c, (*path, i), out)
    elif kind == "m":
        for k, c in zip(spec[3], spec[4]):
            _leaf_paths(c, (*path, k), out)
    return out


def _leaf_keys(spec: tuple, path: tuple = (), out: list | None = None) -> list[tuple]:
    """The path (keys and positions) of every tensor leaf, by leaf index."""
    out = [] if out is None else out
    kind = spec[0]
    if kind == "t":
        out.append(path)
    elif kind == "s":
        for i, c in enumerate(spec[2]):
            _leaf_keys(c, (*path, i), out)
    elif kind == "m":
        for k, c in zip(spec[3], spec[4]):
            _leaf_keys(c, (*path, k), out)
    return out


def _show_spec(spec: tuple) -> str:
    kind = spec[0]
    if kind == "t":
        return "<tensor>"
    if kind == "l":
        return "<list>"
    if kind == "c":
        return repr(spec[1])
    if kind == "s":
        inner = ", ".join(_show_spec(c) for c in spec[2])
        return f"{spec[1].__name__}({inner})"
    inner = ", ".join(f"{k!r}: {_show_spec(c)}" for k, c in zip(spec[3], spec[4]))
    return f"{spec[1].__name__}({{{inner}}})"


def _fmt_path(path: tuple) -> str:
    return "".join(f"[{p!r}]" for p in path)


def _describe(obj: Any) -> str:
    if isinstance(obj, Tensor):
        return f"a tensor of shape {tuple(obj.shape)}"
    return f"a {type(obj).__module__}.{type(obj).__qualname__}"
