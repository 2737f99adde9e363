"""The only place the benchmarks touch hasten's own switches (compiler and sifting).

Everything else in :mod:`hasten.bench` goes through these functions, so an API change in
``hasten.compiler`` or ``hasten.sifting`` is adapted here once. Each ``*_unavailable`` function
returns ``None`` when the switch can be used, else a one-line reason, so callers can skip a
candidate with an honest note instead of crashing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

__all__ = [
    "compile_seconds",
    "compiler_unavailable",
    "hasten_compile",
    "hasten_compile_step",
    "sifting_loader",
    "sifting_unavailable",
]


def _unavailable(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except ImportError as err:
        return f"{module} is not available in this build ({err})"
    return None


def compiler_unavailable() -> str | None:
    """``None`` if ``hasten.compile`` can be used, else why not."""
    return _unavailable("hasten.compiler")


def sifting_unavailable() -> str | None:
    """``None`` if ``hasten.SiftingDataloader`` can be used, else why not."""
    return _unavailable("hasten.sifting")


def hasten_compile(model: nn.Module, precision: str = "fp32", **overrides: Any) -> nn.Module:
    """``hasten.compile(model, precision=...)``: compiles in place, returns the same module."""
    import hasten

    return hasten.compile(model, precision=precision, **overrides)


def compile_seconds(model: nn.Module) -> float:
    """Seconds ``model``'s calls have spent compiling so far (0 for a model hasten did not
    compile), so a benchmark can keep a recompile in the middle of a run off its step clock."""
    if compiler_unavailable():
        return 0.0
    from hasten.compiler import compile_report

    try:
        return compile_report(model).compile_seconds
    except ValueError:  # not compiled by hasten.compile
        return 0.0


def hasten_compile_step(
    step: Callable[[], Any], optimizer: torch.optim.Optimizer
) -> Callable[[], Any]:
    """``hasten.compile_step(step, optimizers=optimizer)``: the optimizer update made fast (the
    fused kernel where there is one), in place; returns the step to call."""
    import hasten

    return hasten.compile_step(step, optimizers=optimizer)


def sifting_loader(
    loader: Iterable[Any],
    model: nn.Module,
    per_sample_loss: Callable[[nn.Module, Any], torch.Tensor],
    *,
    beta: float,
    loss_history_length: int,
    sift_delay: int,
    seed: int,
    on_scored: Callable[[int], None],
) -> Iterable[Any]:
    """A ``SiftingDataloader`` with SageMaker's relative probabilistic rule around ``loader``.

    Args:
        loader: The original DataLoader.
        model: The model that scores samples (in eval mode, without gradients).
        per_sample_loss: ``(model, batch) -> [batch]`` losses.
        beta: ``beta_value``: keep probability is ``percentile ** beta`` (1/(1+beta) kept).
        loss_history_length: Losses the percentile is taken over.
        sift_delay: Steps before sifting starts.
        seed: Seeds the loader's generator, so paired runs sift alike.
        on_scored: Called with the number of samples in every batch the sifter scores, so the
            caller counts scoring forwards exactly.
    """
    import hasten

    class _CountingLoss(hasten.Loss):
        def loss(
            self, model: nn.Module, transformed_batch: Any, original_batch: Any = None
        ) -> torch.Tensor:
            # without batch_transforms, the loss gets the batch in the loader's own structure
            losses = per_sample_loss(model, transformed_batch)
            on_scored(int(losses.shape[0]))
            return losses

    config = hasten.RelativeProbabilisticSiftConfig(
        beta_value=beta,
        loss_history_length=loss_history_length,
        loss_based_sift_config=hasten.LossConfig(
            sift_config=hasten.SiftingBaseConfig(sift_delay=sift_delay)
        ),
    )
    return hasten.SiftingDataloader(
        sift_config=config,
        orig_dataloader=loader,
        model=model,
        loss_impl=_CountingLoss(),
        seed=seed,
        log_interval=None,
    )
