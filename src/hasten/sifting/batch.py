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

import functools
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from hasten.sifting.exceptions import UnsupportedDataFormatException
from hasten.sifting.padding import Padding, pad_concat

__all__ = [
    "BatchCodec",
    "DefaultBatchTransform",
    "ListBatch",
    "SiftingBatch",
    "SiftingBatchTransform",
    "TensorBatch",
    "TreeBatch",
    "batch_size_of",
    "codec_for",
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
# A batch is flattened by torch.utils._pytree (tuples, lists, namedtuples, dicts, OrderedDict,
# defaultdict, deque) into a Structure (pytree's spec, plus what each leaf is: a tensor, a
# per-sample list, a constant, or a mapping pytree does not know, such as BatchEncoding, which is
# flattened in turn) and two leaf lists: tensors (split along `dim`) and per-sample Python lists.


class TreeBatch(SiftingBatch):
    """Any supported nested batch, flattened for sifting (see the module docstring)."""

    __slots__ = ("dim", "lists", "padding", "size", "spec", "tensors")

    def __init__(
        self,
        spec: Structure,
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
        spec = _flatten(batch, tensors, lists)
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
                    f"structure or constant fields:\n  {_show(first.spec)}\n  "
                    f"{_show(other.spec)}\nMake every batch the same structure (constants "
                    "equal), or pass batch_transforms=<a SiftingBatchTransform>"
                )
        dim = first.dim
        tensors = []
        for i, leaves in enumerate(zip(*(b.tensors for b in tb))):
            try:
                tensors.append(torch.cat(leaves, dim=dim))
            except RuntimeError as err:  # lengths differ (dynamic padding), or worse
                padded = pad_concat(leaves, dim, first.padding, _tensor_paths(first.spec)[i])
                if padded is None:
                    path = _fmt_path(_tensor_paths(first.spec)[i])
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


class BatchCodec(ABC):
    """How the loader takes its batches apart and puts them back: the one path every batch
    takes, whichever codec is in use (see :func:`codec_for`)."""

    @abstractmethod
    def encode(self, batch: Any, device: torch.device) -> tuple[SiftingBatch, Any, Any]:
        """``batch`` on ``device`` as a :class:`SiftingBatch`, plus the loss's two arguments
        (``transformed_batch``, ``original_batch``)."""

    @abstractmethod
    def count(self, batch: Any) -> int:
        """Samples in ``batch`` (where it is, without moving it)."""

    @abstractmethod
    def decode(self, sifting_batch: SiftingBatch) -> Any:
        """A sifted batch back in the wrapped loader's form."""


class DefaultBatchTransform(SiftingBatchTransform, BatchCodec):
    """The built-in codec (used when no transform is given), also as a
    :class:`SiftingBatchTransform`. The loss gets the batch in its own structure."""

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

    def encode(self, batch: Any, device: torch.device) -> tuple[SiftingBatch, Any, Any]:
        # flatten first, then move the tensor leaves only
        sb = self.transform(batch).to(device, device.type == "cuda")
        original = sb.to_batch()
        return sb, original, original

    def count(self, batch: Any) -> int:
        return len(self.transform(batch))

    def decode(self, sifting_batch: SiftingBatch) -> Any:
        return self.reverse_transform(sifting_batch)


class _TransformCodec(BatchCodec):
    """A user's :class:`SiftingBatchTransform` (SageMaker's protocol) as the loader's codec: the
    loss gets the transformed batch and the original one."""

    def __init__(self, transform: SiftingBatchTransform) -> None:
        self.transform = transform

    def encode(self, batch: Any, device: torch.device) -> tuple[SiftingBatch, Any, Any]:
        original = move_to_device(batch, device, device.type == "cuda")
        sb = self.transform.transform(original)
        return sb, sb, original

    def count(self, batch: Any) -> int:
        return len(self.transform.transform(batch))

    def decode(self, sifting_batch: SiftingBatch) -> Any:
        return self.transform.reverse_transform(sifting_batch)


def codec_for(
    batch_transforms: SiftingBatchTransform | None,
    batch_format_index: int | None = None,
    padding: Padding | None = None,
) -> BatchCodec:
    """The codec for a loader's arguments: the user's transform, else the built-in codec."""
    if batch_transforms is None:
        return DefaultBatchTransform(batch_format_index, padding)
    return _TransformCodec(batch_transforms)


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
        spec = _flatten(batch, tensors, lists)
    except UnsupportedDataFormatException:
        to = getattr(batch, "to", None)
        return to(device) if callable(to) else batch
    moved = [t.to(device, non_blocking=non_blocking) for t in tensors]
    return _unflatten(spec, moved, lists)


# --------------------------------------------------------------------------- flatten / unflatten


@dataclass(frozen=True)
class _TensorLeaf:
    index: int  # into the tensor list


@dataclass(frozen=True)
class _ListLeaf:
    index: int  # into the per-sample list list
    kind: type  # rebuilt as this type


@dataclass(frozen=True)
class _Constant:
    value: Any  # copied as is; equal in batches whose rows are merged


@dataclass(frozen=True)
class _MappingLeaf:
    kind: type  # a Mapping type pytree does not know (BatchEncoding, UserDict ...)
    structure: Structure  # of the mapping as a dict


@dataclass(frozen=True)
class Structure:
    """A batch's structure without its data: pytree's spec of its containers and what each of
    its leaves is. Hashable, and equal for batches whose rows can be merged."""

    spec: pytree.TreeSpec
    leaves: tuple[Any, ...]


def _is_per_sample_list(obj: Any) -> bool:
    """A list or tuple of scalars: one entry per sample (what ``default_collate`` makes of a
    string field), kept whole instead of being taken apart by pytree."""
    return (
        isinstance(obj, (list, tuple))
        and not hasattr(obj, "_fields")  # a namedtuple of scalars is a record of constants
        and bool(obj)
        and all(isinstance(x, _SCALARS) for x in obj)
    )


def _flatten(obj: Any, tensors: list[Tensor], lists: list[list[Any]]) -> Structure:
    """``obj``'s structure; its tensors and per-sample lists are appended to the two lists."""
    leaves, spec = pytree.tree_flatten(obj, is_leaf=_is_per_sample_list)
    if all(isinstance(x, Tensor) for x in leaves):  # the common case, kept cheap
        start = len(tensors)
        tensors.extend(leaves)
        return Structure(spec, _tensor_leaves(start, len(leaves)))
    out = []
    for k, x in enumerate(leaves):
        if isinstance(x, Tensor):
            tensors.append(x)
            out.append(_TensorLeaf(len(tensors) - 1))
        elif isinstance(x, _SCALARS):
            out.append(_Constant(x))
        elif _is_per_sample_list(x):
            lists.append(list(x))
            out.append(_ListLeaf(len(lists) - 1, type(x)))
        elif isinstance(x, Mapping):
            out.append(_MappingLeaf(type(x), _flatten(dict(x), tensors, lists)))
        else:
            path = _fmt_path(_key_path(obj, k))
            raise UnsupportedDataFormatException(
                f"batch{path} is {_describe(x)}: the built-in batch codec splits tensors, "
                "tuples/lists/dicts/BatchEncoding of them, and lists of strings or numbers. "
                f"{_FIX}"
            )
    return Structure(spec, tuple(out))


@functools.lru_cache(maxsize=256)
def _tensor_leaves(start: int, n: int) -> tuple[_TensorLeaf, ...]:
    return tuple(_TensorLeaf(i) for i in range(start, start + n))


def _unflatten(structure: Structure, tensors: Sequence[Any], lists: Sequence[Any]) -> Any:
    """The batch of ``structure`` around the given leaves."""
    values = []
    for leaf in structure.leaves:
        kind = type(leaf)
        if kind is _TensorLeaf:
            values.append(tensors[leaf.index])
        elif kind is _Constant:
            values.append(leaf.value)
        elif kind is _ListLeaf:
            items = lists[leaf.index]
            values.append(items if leaf.kind is list else leaf.kind(items))
        else:
            values.append(_rebuild_mapping(leaf, _unflatten(leaf.structure, tensors, lists)))
    return pytree.tree_unflatten(values, structure.spec)


def _rebuild_mapping(leaf: _MappingLeaf, data: dict[Any, Any]) -> Any:
    try:
        return leaf.kind(data)
    except Exception as err:
        raise UnsupportedDataFormatException(
            f"cannot rebuild a {leaf.kind.__name__} batch from a dict (its constructor does not "
            f"take one: {err}). {_FIX}"
        ) from err


def _key_path(obj: Any, k: int) -> tuple:
    """The path (keys, positions, attribute names) of pytree leaf ``k`` of ``obj``."""
    keyed, _ = pytree.tree_flatten_with_path(obj, is_leaf=_is_per_sample_list)
    return tuple(_plain_key(key) for key in keyed[k][0])


def _plain_key(key: Any) -> Any:
    for attr in ("key", "idx", "name"):  # MappingKey, SequenceKey, GetAttrKey
        if hasattr(key, attr):
            return getattr(key, attr)
    return str(key)


def _leaf_paths(structure: Structure, prefix: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """``(path, leaf)`` for every leaf of ``structure``, mappings pytree does not know expanded:
    the one walk over a structure, for messages and pad values (never on the hot path)."""
    skeleton = pytree.tree_unflatten([None] * len(structure.leaves), structure.spec)
    keyed, _ = pytree.tree_flatten_with_path(skeleton)
    for (keys, _), leaf in zip(keyed, structure.leaves):
        path = prefix + tuple(_plain_key(key) for key in keys)
        if isinstance(leaf, _MappingLeaf):
            yield from _leaf_paths(leaf.structure, path)
        else:
            yield path, leaf


def _tensor_paths(structure: Structure) -> list[tuple]:
    """The path of every tensor leaf, by tensor index."""
    return [path for path, leaf in _leaf_paths(structure) if isinstance(leaf, _TensorLeaf)]


def _list_paths(structure: Structure) -> list[tuple]:
    """The path of every per-sample list, by list index."""
    return [path for path, leaf in _leaf_paths(structure) if isinstance(leaf, _ListLeaf)]


def _show(structure: Structure) -> str:
    """The structure with ``<tensor>`` and ``<list>`` in place of the data."""

    class _Marks:
        def __init__(self, mark: str) -> None:
            self.mark = mark

        def __getitem__(self, i: int) -> Any:
            return _Mark(self.mark)

    return repr(_unflatten(structure, _Marks("<tensor>"), _Marks("<list>")))


class _Mark:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __iter__(self) -> Iterator[Any]:  # a per-sample tuple rebuilt around a mark
        return iter([self])


def _infer_size(
    spec: Structure,
    tensors: list[Tensor],
    lists: list[list[Any]],
    dim: int,
    batch_format_index: int | None,
) -> int:
    for i, t in enumerate(tensors):
        if t.ndim <= dim:
            path = _fmt_path(_tensor_paths(spec)[i])
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
    paths = _tensor_paths(spec) + _list_paths(spec)
    detail = ", ".join(f"batch{_fmt_path(p)}: {s}" for p, s in zip(paths, sizes))
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


def _fmt_path(path: tuple) -> str:
    return "".join(f"[{p!r}]" for p in path)


def _describe(obj: Any) -> str:
    if isinstance(obj, Tensor):
        return f"a tensor of shape {tuple(obj.shape)}"
    return f"a {type(obj).__module__}.{type(obj).__qualname__}"
