"""The one place the benchmark runners of :mod:`hasten.bench` train through hasten's switches.

``compile_bench``, ``training``, ``sift_experiment``, ``pruning_policies``, ``demo`` and
``keras_bench`` reach ``hasten.compile``, ``hasten.compile_step``, ``SiftingDataloader``,
``PruningSampler``, ``Scorer`` and ``hasten.keras.compile`` only through these functions, so an
API change in ``hasten.compiler``, ``hasten.sifting`` or ``hasten.keras`` is adapted here once
(a test checks that no other runner module imports them). Each ``*_unavailable`` function returns
``None`` when the switch can be used, else a one-line reason, so callers can skip a candidate with
an honest note instead of crashing.

Not through here, on purpose: ``doctor`` inspects hasten's own install (imports its parts, reads
the compile cache), ``machine`` stamps hasten's version, and the study scripts in
``benchmarks/`` (compiler passes, regions, scoring modes, sifting overhead) import hasten's
internals directly because the internals are what they measure.
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
    "graph_count",
    "hasten_compile",
    "hasten_compile_step",
    "keras_compile",
    "pruning_sampler",
    "scorer",
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


def temporary_cache_dir(path: str) -> Any:
    """A context manager pointing Inductor's cache at ``path`` while it is entered (hasten's
    boundary around torch's private cache setting)."""
    from hasten.compiler.hooks.inductor import temporary_cache_dir as inner

    return inner(path)


def _report(model: nn.Module) -> Any:
    """hasten's compile report of ``model``, or ``None`` where hasten did not compile it (or
    its compiler is not available)."""
    if compiler_unavailable():
        return None
    from hasten.compiler import compile_report

    try:
        return compile_report(model)
    except ValueError:  # not compiled by hasten.compile
        return None


def compile_seconds(model: nn.Module) -> float:
    """Seconds ``model``'s calls have spent compiling so far (0 for a model hasten did not
    compile), so a benchmark can keep a recompile in the middle of a run off its step clock."""
    report = _report(model)
    return 0.0 if report is None else report.compile_seconds


def graph_count(model: nn.Module) -> int | None:
    """How many graphs hasten compiled for ``model`` (``None`` for a model hasten did not
    compile): 0 when its compile plan kept every call eager."""
    report = _report(model)
    return None if report is None else report.graph_count


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


def pruning_sampler(
    num_samples: int,
    config: dict[str, Any],
    *,
    num_epochs: int,
    seed: int,
    scorer: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Any:
    """``hasten.sifting.PruningSampler(num_samples, config, num_epochs=..., seed=..., scorer=...)``:
    plans each epoch from the losses the training step feeds back (``sampler.update(losses)``)."""
    from hasten.sifting import PruningSampler

    return PruningSampler(num_samples, config, num_epochs=num_epochs, seed=seed, scorer=scorer)


def scorer(
    model: nn.Module,
    dataset: Any,
    per_sample_loss: Callable[[nn.Module, Any], torch.Tensor],
    *,
    batch_size: int,
    collate_fn: Callable[[Any], Any],
    autocast_dtype: torch.dtype | None,
    device: torch.device,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``hasten.sifting.Scorer``: ``scorer(indices) -> losses``, forwards without gradients."""
    from hasten.sifting import Scorer

    return Scorer(
        model,
        dataset,
        per_sample_loss,
        batch_size=batch_size,
        collate_fn=collate_fn,
        autocast_dtype=autocast_dtype,
        device=device,
    )


def keras_compile(build: Callable[[], Any], sample: Any, *, precision: str) -> Any:
    """``hasten.keras.compile(build, sample, precision=..., verbose=False)``: the Keras model
    hasten picked (its choice in ``model.hasten_report``)."""
    import hasten.keras as hk

    return hk.compile(build, sample, precision=precision, verbose=False)
