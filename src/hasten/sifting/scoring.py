"""A scoring pass: the loss of chosen samples, one forward each, as cheaply as it can be done.

Where a policy still needs fresh losses of samples it did not train on (SageMaker's relative
rule, :class:`~hasten.sifting.pruning_config.StaleRelativePruningConfig`), it scores them in one
pass at the start of an epoch instead of one extra forward per training batch. A separate pass
can be cheaper than scoring batch by batch:

- **larger batches**: no backward, no activations kept, so a batch several times the training
  batch fits, and fewer, larger kernels run closer to the machine's peak;
- **lower precision**: ``autocast_dtype=torch.bfloat16`` runs matmuls and convolutions in bf16
  (tensor cores on GPUs, AMX on recent Xeons); a ranking of losses tolerates bf16 rounding;
- **a compiled model**: pass ``hasten.compile(model)`` (or ``torch.compile``) as ``model``.

The model runs in eval mode (dropout off, BatchNorm statistics untouched) under
``torch.inference_mode()``; every module's own mode is restored afterwards.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from hasten._modules import module_device
from hasten.sifting.batch import move_to_device
from hasten.sifting.core.forward import check_per_sample_losses, scoring_mode
from hasten.sifting.exceptions import LossImplementationNotProvidedException
from hasten.sifting.loss import SupportsLoss, as_loss

__all__ = ["Scorer", "ScoringStats", "scoring_mode"]  # scoring_mode: from core.forward


@dataclass
class ScoringStats:
    """What a :class:`Scorer` has done."""

    samples_scored: int = 0
    """Samples given one scoring forward."""
    passes: int = 0
    """Calls that scored at least one sample."""
    seconds: float = 0.0
    """Wall time inside the scorer (loading included; on CUDA synchronised once per call)."""


class Scorer:
    """Scores chosen samples of a dataset: ``scorer(indices) -> losses``.

    Args:
        model: The model being trained (or a compiled version of it sharing its weights).
        dataset: The map-style dataset the indices refer to.
        loss_impl: One loss per sample: a :class:`~hasten.sifting.loss.Loss` or a callable
            ``fn(model, batch) -> Tensor[batch]`` (the same as the loader's ``loss_impl``).
        batch_size: Samples per scoring forward; larger than the training batch is usually
            faster (no activations are kept for a backward).
        collate_fn: How samples become a batch (the training DataLoader's; default: PyTorch's).
        autocast_dtype: Run the forward under ``torch.autocast`` with this dtype (for example
            ``torch.bfloat16``); ``None``: the model's own precision.
        device: Where to score (default: the device of the model's parameters).
        num_workers: DataLoader workers for loading the samples to score.

    Example::

        scorer = Scorer(model, train_set, loss_fn, batch_size=1024, autocast_dtype=torch.bfloat16)
        losses = scorer(torch.tensor([3, 17, 42]))  # float32, one per index, on the model's device
    """

    def __init__(
        self,
        model: nn.Module,
        dataset: Any,
        loss_impl: Any,
        *,
        batch_size: int = 1024,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        autocast_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        num_workers: int = 0,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        loss = as_loss(loss_impl)
        if loss is None:
            raise LossImplementationNotProvidedException(
                "Scorer needs loss_impl: a hasten.sifting.Loss or a callable "
                f"fn(model, batch) -> Tensor[batch_size], got {type(loss_impl).__name__}"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if autocast_dtype is not None and not isinstance(autocast_dtype, torch.dtype):
            raise TypeError(
                f"autocast_dtype must be a torch.dtype such as torch.bfloat16, or None; got "
                f"{autocast_dtype!r}"
            )
        self.model = model
        self.dataset = dataset
        self.loss_impl: SupportsLoss = loss
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.autocast_dtype = autocast_dtype
        self.device = None if device is None else torch.device(device)
        self.num_workers = num_workers
        self.stats = ScoringStats()
        self._checked_bf16 = False

    def _warn_if_emulated(self) -> None:
        """Once: bf16 scoring on a CPU without bf16 units is slower than fp32, not faster."""
        if self._checked_bf16:
            return
        self._checked_bf16 = True
        from hasten.compiler.hooks.aten import native_bf16_cpu

        if native_bf16_cpu() is False:
            warnings.warn(
                "Scorer(autocast_dtype=torch.bfloat16) on this CPU runs bf16 emulated: it lists "
                "no AVX512-BF16 or AMX unit ('hasten doctor' shows what it has), so scoring is "
                "usually slower than in fp32 here; leave autocast_dtype=None",
                stacklevel=3,
            )

    def __call__(self, indices: Tensor | Sequence[int]) -> Tensor:
        """Losses of the samples ``indices`` (float32, in the same order, on the scoring device)."""
        from torch.utils.data import DataLoader

        idx = torch.as_tensor(indices, dtype=torch.int64).reshape(-1).cpu()
        device = self.device or module_device(self.model)
        if idx.numel() == 0:
            return torch.empty(0, device=device)
        t0 = time.perf_counter()
        loader = DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=idx.tolist(),
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
        )
        if self.autocast_dtype == torch.bfloat16 and device.type == "cpu":
            self._warn_if_emulated()
        out: list[Tensor] = []
        sizes = torch.arange(0, idx.numel(), self.batch_size).tolist()
        autocast = (
            torch.autocast(device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with scoring_mode(self.model), autocast:
            for start, batch in zip(sizes, loader):
                batch = move_to_device(batch, device, device.type == "cuda")
                losses = self.loss_impl.loss(self.model, batch, batch)
                n = min(self.batch_size, idx.numel() - start)
                check_per_sample_losses(
                    losses, n, f"the scorer's {type(self.loss_impl).__name__}.loss"
                )
                out.append(losses.float())
        result = torch.cat(out)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # HOST SYNC: once per pass, for an honest clock
        self.stats.samples_scored += idx.numel()
        self.stats.passes += 1
        self.stats.seconds += time.perf_counter() - t0
        return result
