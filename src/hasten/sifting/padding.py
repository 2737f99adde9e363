"""Merging rows of batches padded to different lengths (dynamic padding).

Hugging Face collators commonly pad each batch to its own longest sequence
(``DataCollatorWithPadding``, ``padding="longest"``), so the batches sifting merges rows of can
differ in sequence length. When the tensors of a field disagree beyond the sample dimension, each
dimension that differs is padded to the longest of the merged pieces with the field's pad value,
on the padding side (right by default, as tokenizers). Fields that agree are concatenated as they
are: the fixed-length path pays nothing.

Pad values come per field name (the innermost mapping key of the field, or the position in a
tuple): those given as ``pad_values``, else the defaults of :data:`DEFAULT_PAD_VALUES` (what a
Hugging Face tokenizer and its collators pad with). ``input_ids`` has no default: its pad id is
the tokenizer's, and models read it (RoBERTa derives position ids from
``input_ids != pad_token_id``), so a wrong guess would silently change what the model computes.
A ragged field without a pad value raises
:class:`~hasten.sifting.exceptions.UnsupportedDataFormatException` naming ``pad_values``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from hasten.sifting.exceptions import UnsupportedDataFormatException

__all__ = ["DEFAULT_PAD_VALUES", "Padding", "pad_concat"]

DEFAULT_PAD_VALUES: dict[str, int] = {
    "attention_mask": 0,
    "decoder_attention_mask": 0,
    "token_type_ids": 0,
    "special_tokens_mask": 1,
    "labels": -100,  # ignored by torch's cross_entropy and by Transformers' losses
}
"""Pad values used for these field names unless ``pad_values`` says otherwise. Never
``input_ids``: its pad id is the tokenizer's ``pad_token_id``."""

_SIDES = ("right", "left")


class Padding:
    """Pad values per field and the side to pad on, checked once at construction.

    Args:
        pad_values: Field name (a mapping key; or an int, the position in a tuple batch) to the
            value to pad it with. Overrides :data:`DEFAULT_PAD_VALUES`.
        padding_side: ``"right"`` (default) or ``"left"``, as the tokenizer's ``padding_side``.

    Raises:
        TypeError: ``pad_values`` is not a mapping, or a key or value has the wrong type.
        ValueError: a pad value is ``None`` (a tokenizer without a pad token), or an unknown side.
    """

    __slots__ = ("side", "values")

    def __init__(
        self,
        pad_values: Mapping[str | int, float | bool] | None = None,
        padding_side: str = "right",
    ) -> None:
        if padding_side not in _SIDES:
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        given = {} if pad_values is None else pad_values
        if not isinstance(given, Mapping):
            raise TypeError(
                "pad_values must be a dict of field name to pad value, e.g. "
                "{'input_ids': tokenizer.pad_token_id, 'labels': -100}; got "
                f"{type(given).__name__}"
            )
        for key, value in given.items():
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                raise TypeError(
                    f"pad_values keys are field names (str) or tuple positions (int), got {key!r}"
                )
            if value is None:
                raise ValueError(
                    f"pad_values[{key!r}] is None (a tokenizer without a pad token?). Give the "
                    "tokenizer one (tokenizer.pad_token = tokenizer.eos_token is common for "
                    "causal LMs) and pass its pad_token_id"
                )
            if not isinstance(value, (int, float, bool)):
                raise TypeError(f"pad_values[{key!r}] must be a number, got {value!r}")
        self.values: dict[str | int, float | bool] = {**DEFAULT_PAD_VALUES, **given}
        self.side = padding_side

    def value_for(self, path: Sequence[Any]) -> float | bool | None:
        """The pad value of the field at ``path`` (innermost key), ``None`` when there is none."""
        return self.values.get(path[-1]) if path else None

    def __repr__(self) -> str:
        return f"Padding({self.values!r}, padding_side={self.side!r})"


def pad_concat(
    leaves: Sequence[Tensor], dim: int, padding: Padding | None, path: Sequence[Any]
) -> Tensor | None:
    """``torch.cat(leaves, dim)`` with every other dimension padded to the longest piece.

    ``padding`` ``None``: the default pad values, on the right. Returns ``None`` when padding
    is not what the pieces need (different numbers of dimensions, or shapes that already agree),
    so that the caller reports its own error.

    Raises:
        UnsupportedDataFormatException: the field needs padding and has no pad value.
    """
    ndim = leaves[0].ndim
    if any(t.ndim != ndim for t in leaves):
        return None
    shape = [max(t.shape[d] for t in leaves) for d in range(ndim)]
    shape[dim] = sum(t.shape[dim] for t in leaves)
    if all(t.shape[d] == shape[d] for t in leaves for d in range(ndim) if d != dim):
        return None
    if padding is None:
        padding = Padding()
    value = padding.value_for(path)
    name = "".join(f"[{p!r}]" for p in path)
    if value is None:
        key = path[-1] if path else None
        lengths = sorted({tuple(t.shape[d] for d in range(ndim) if d != dim) for t in leaves})
        if key == "input_ids":
            fix = "pad_values={'input_ids': tokenizer.pad_token_id}"
            why = (
                " (never guessed: models read it, e.g. RoBERTa derives positions from "
                "input_ids != pad_token_id)"
            )
        else:
            fix = f"pad_values={{{key!r}: <pad value>}}" if key is not None else "pad_values"
            why = ""
        raise UnsupportedDataFormatException(
            f"batch{name} is padded to different lengths in the batches whose rows sifting "
            f"merges ({', '.join(map(str, lengths))} beyond the sample dimension {dim}), and "
            f"sifting has no pad value for it{why}. Pass SiftingDataloader(..., {fix}), or pad "
            "every batch to one fixed length (tokenizer padding='max_length')"
        )
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in leaves))
    try:
        out = torch.full(shape, value, dtype=dtype, device=leaves[0].device)
    except RuntimeError as err:
        raise UnsupportedDataFormatException(
            f"cannot pad batch{name} ({dtype}) with pad value {value!r}: {err}"
        ) from err
    offset = 0
    left = padding.side == "left"
    for t in leaves:
        n = t.shape[dim]
        region = out.narrow(dim, offset, n)
        for d in range(ndim):
            if d != dim and t.shape[d] != shape[d]:
                region = region.narrow(d, shape[d] - t.shape[d] if left else 0, t.shape[d])
        region.copy_(t)
        offset += n
    return out
