"""Per-sample losses for sifting: the ``Loss`` interface and ready-made implementations.

Sifting ranks samples by loss, so it needs one loss per sample, not the batch mean: a
``Loss.loss(model, transformed_batch, original_batch=None)`` returns a 1-D tensor with one entry
per sample. The loader calls it with the model in eval mode under ``torch.inference_mode()`` and
with the batch already on the model's device.

Without a ``batch_transforms``, ``transformed_batch`` and ``original_batch`` are the same object,
the loader's batch (moved to the model's device), so either works. With a
:class:`~hasten.sifting.batch.SiftingBatchTransform`, ``transformed_batch`` is its output.

Ready-made::

    PerSampleCrossEntropy()                 # (inputs..., labels) tuples or dicts with "labels"
    CallableLoss(lambda model, batch: F.cross_entropy(model(batch[0]), batch[1], reduction="none"))
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "CallableLoss",
    "Loss",
    "PerSampleCrossEntropy",
    "SupportsLoss",
    "as_loss",
    "per_sample_cross_entropy",
]


class Loss(ABC):
    """SageMaker's sifting loss interface: one loss per sample.

    Subclasses implement :meth:`loss`; they need not call ``super().__init__()``.
    """

    @abstractmethod
    def loss(self, model: nn.Module, transformed_batch: Any, original_batch: Any = None) -> Tensor:
        """Per-sample losses, shape ``[batch_size]`` (use ``reduction="none"``)."""


class CallableLoss(Loss):
    """Adapts ``fn(model, batch) -> Tensor[batch]`` (e.g. ``ModelSpec.per_sample_loss``).

    ``fn`` receives ``transformed_batch``, which is the loader's own batch unless a batch
    transform is in use.
    """

    def __init__(self, fn: Callable[[nn.Module, Any], Tensor]) -> None:
        if not callable(fn):
            raise TypeError(f"CallableLoss needs a callable, got {type(fn).__name__}")
        self.fn = fn

    def loss(self, model: nn.Module, transformed_batch: Any, original_batch: Any = None) -> Tensor:
        return self.fn(model, transformed_batch)

    def __repr__(self) -> str:
        return f"CallableLoss({getattr(self.fn, '__qualname__', self.fn)!r})"


class PerSampleCrossEntropy(Loss):
    """Cross-entropy per sample for classifiers and token classifiers.

    Batch layouts:

    - tuple/list ``(x1, ..., xk, labels)``: logits = ``model(x1, ..., xk)``;
    - mapping with ``label_key``: logits = ``model(**other_keys)`` (Hugging Face style; the
      output's ``.logits`` is used when present).

    Logits ``[B, C]`` with labels ``[B]`` give the usual loss; logits ``[B, T, C]`` with labels
    ``[B, T]`` give the mean over each sample's tokens whose label is not ``ignore_index``. Set
    ``shift=True`` for causal language models (predict token t+1 from position t).
    """

    def __init__(self, label_key: str = "labels", ignore_index: int = -100, shift: bool = False):
        self.label_key = label_key
        self.ignore_index = ignore_index
        self.shift = shift

    def loss(self, model: nn.Module, transformed_batch: Any, original_batch: Any = None) -> Tensor:
        batch = transformed_batch
        if isinstance(batch, Mapping):
            if self.label_key not in batch:
                raise KeyError(
                    f"PerSampleCrossEntropy: the batch has no {self.label_key!r} key (keys: "
                    f"{list(batch)}); pass label_key=<the key holding the labels>"
                )
            labels = batch[self.label_key]
            out = model(**{k: v for k, v in batch.items() if k != self.label_key})
        elif isinstance(batch, (tuple, list)) and len(batch) >= 2:
            labels = batch[-1]
            out = model(*batch[:-1])
        else:
            raise TypeError(
                "PerSampleCrossEntropy expects an (inputs..., labels) tuple/list or a mapping "
                f"with {self.label_key!r}, got {type(batch).__name__}; write a Loss subclass or "
                "use CallableLoss for other layouts"
            )
        logits = getattr(out, "logits", out)
        return per_sample_cross_entropy(logits, labels, self.ignore_index, self.shift)

    def __repr__(self) -> str:
        return (
            f"PerSampleCrossEntropy(label_key={self.label_key!r}, "
            f"ignore_index={self.ignore_index}, shift={self.shift})"
        )


def per_sample_cross_entropy(
    logits: Tensor, labels: Tensor, ignore_index: int = -100, shift: bool = False
) -> Tensor:
    """Cross-entropy reduced to one value per sample (see :class:`PerSampleCrossEntropy`)."""
    if logits.ndim == 2:
        return F.cross_entropy(logits, labels, reduction="none")
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    tok = F.cross_entropy(
        logits.movedim(-1, 1), labels, ignore_index=ignore_index, reduction="none"
    )  # [B, T...]
    valid = (labels != ignore_index).to(tok.dtype)
    dims = tuple(range(1, tok.ndim))
    return tok.sum(dims) / valid.sum(dims).clamp_min(1.0)


class SupportsLoss(Protocol):
    """Anything with SageMaker's ``loss(model, transformed_batch, original_batch=None)``."""

    def loss(
        self, model: nn.Module, transformed_batch: Any, original_batch: Any = None
    ) -> Tensor: ...


def as_loss(loss_impl: Any) -> SupportsLoss | None:
    """``loss_impl`` as a loss object: objects with ``.loss`` pass, plain callables are wrapped
    in :class:`CallableLoss`, anything else gives ``None``."""
    if loss_impl is None:
        return None
    if callable(getattr(loss_impl, "loss", None)):
        return loss_impl
    if callable(loss_impl) and not isinstance(loss_impl, type):
        return CallableLoss(loss_impl)
    return None
