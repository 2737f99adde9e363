"""The scoring forward both front-ends run: eval mode with modes restored, and the loss check.

:class:`~hasten.sifting.SiftingDataloader` scores every incoming batch this way, and the
:class:`~hasten.sifting.Scorer` (which rescores stale samples for
:class:`~hasten.sifting.PruningSampler`) every batch it loads: every module in eval mode
(dropout off, BatchNorm statistics untouched), under ``torch.inference_mode()``, each module's
own mode put back afterwards; then one check that the loss gave one float per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from hasten.sifting.exceptions import LossImplementationNotProvidedException

__all__ = ["check_per_sample_losses", "eval_modules", "scoring_mode"]


class eval_modules:
    """``modules`` in eval mode under ``torch.inference_mode()``; each one's mode restored.

    Flag by flag (not ``model.eval()``): mixed modes come back exactly, and
    ``nn.Module.__setattr__`` is skipped, which matters once per batch. A class rather than a
    generator-based context manager: it is entered once per incoming batch.
    """

    __slots__ = ("_inference", "_modes", "_modules")

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self._modules = modules
        self._modes: list[bool] = []
        self._inference = torch.inference_mode()

    def __enter__(self) -> None:
        modules = self._modules
        self._modes = [m.training for m in modules]
        for m in modules:
            object.__setattr__(m, "training", False)
        self._inference.__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            self._inference.__exit__(*exc)
        finally:
            for m, mode in zip(self._modules, self._modes):
                object.__setattr__(m, "training", mode)


def scoring_mode(model: nn.Module) -> eval_modules:
    """Every module of ``model`` in eval mode under ``torch.inference_mode()``; modes restored."""
    return eval_modules(list(model.modules()))


def check_per_sample_losses(losses: Any, n: int, source: str) -> Tensor:
    """``losses`` if it is a floating-point tensor of shape ``[n]``; else raise naming the fix.

    Args:
        losses: What the loss returned for a batch of ``n`` samples.
        n: The batch's number of samples.
        source: Who returned it, for the message (e.g. ``"MyLoss.loss"``).

    Raises:
        LossImplementationNotProvidedException: not a tensor, the wrong shape (with the likely
            cause: a reduced loss, flattened tokens, unreduced token dimensions) or dtype.
    """
    if not isinstance(losses, Tensor):
        raise LossImplementationNotProvidedException(
            f"{source} returned {type(losses).__name__}; it must return a tensor with one loss "
            f"per sample (shape [{n}])"
        )
    if losses.shape != (n,):
        if losses.ndim == 0:
            fix = "use reduction='none' in the loss function"
        elif losses.ndim == 1:
            fix = "return one value per sample in batch order (were tokens flattened?)"
        else:
            fix = "reduce the extra dimensions per sample, e.g. .mean(dim=1) over tokens"
        raise LossImplementationNotProvidedException(
            f"{source} returned shape {list(losses.shape)} for a batch of {n} samples; it must "
            f"return one loss per sample (shape [{n}]): {fix}"
        )
    if not losses.is_floating_point():
        raise LossImplementationNotProvidedException(
            f"{source} returned dtype {losses.dtype}; losses must be floating point"
        )
    return losses
