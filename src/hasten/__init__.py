"""hasten: faster, cheaper PyTorch training.

Two switches, two lines each, that compose::

    import hasten

    model = hasten.compile(model)  # training compiler on TorchDynamo/AOTAutograd/Inductor
    sampler = hasten.PruningSampler(train_set, hasten.StaleRelativePruningConfig(max_loss_age=None))
    loss = sampler.update(per_sample_losses)  # sifting: DataLoader(..., sampler=sampler), in the step

Sifting has two front-ends over one set of rules: ``PruningSampler`` (per epoch, from the
losses the training step feeds back; needs a map-style dataset) and ``SiftingDataloader``
(SageMaker's API: wraps any DataLoader and scores each batch with an extra forward). See
``docs/sifting.md`` for which to use when.

Public names are imported lazily, so ``import hasten`` costs little more than ``import torch``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hasten._version import __version__

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "compile": "hasten.compiler.api",
    "compile_step": "hasten.compiler.api",
    "explain": "hasten.compiler.api",
    "verify": "hasten.compiler.api",
    "CompileConfig": "hasten.compiler.config",
    # sifting names resolve through the package, whatever module defines them
    "PruningSampler": "hasten.sifting",
    "UnbiasedPruningConfig": "hasten.sifting",
    "StaleRelativePruningConfig": "hasten.sifting",
    "Scorer": "hasten.sifting",
    "SiftingDataloader": "hasten.sifting",
    "RelativeProbabilisticSiftConfig": "hasten.sifting",
    "LossConfig": "hasten.sifting",
    "SiftingBaseConfig": "hasten.sifting",
    "Loss": "hasten.sifting",
    "PerSampleCrossEntropy": "hasten.sifting",
}

__all__ = [
    "CompileConfig",
    "Loss",
    "LossConfig",
    "PerSampleCrossEntropy",
    "PruningSampler",
    "RelativeProbabilisticSiftConfig",
    "Scorer",
    "SiftingBaseConfig",
    "SiftingDataloader",
    "StaleRelativePruningConfig",
    "UnbiasedPruningConfig",
    "__version__",
    "compile",
    "compile_step",
    "explain",
    "verify",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hasten' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: the next lookup skips __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from hasten.compiler.api import compile, compile_step, explain, verify
    from hasten.compiler.config import CompileConfig
    from hasten.sifting import (
        Loss,
        LossConfig,
        PerSampleCrossEntropy,
        PruningSampler,
        RelativeProbabilisticSiftConfig,
        Scorer,
        SiftingBaseConfig,
        SiftingDataloader,
        StaleRelativePruningConfig,
        UnbiasedPruningConfig,
    )
