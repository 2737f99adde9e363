"""hasten: faster, cheaper PyTorch training.

Two switches, two lines each, that compose::

    import hasten

    model = hasten.compile(model)  # training compiler on TorchDynamo/AOTAutograd/Inductor
    loader = hasten.SiftingDataloader(sift_config, loader, loss_impl=loss, model=model)  # smart sifting

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
    "SiftingDataloader": "hasten.sifting.loader",
    "RelativeProbabilisticSiftConfig": "hasten.sifting.config",
    "LossConfig": "hasten.sifting.config",
    "SiftingBaseConfig": "hasten.sifting.config",
    "Loss": "hasten.sifting.loss",
}

__all__ = [
    "CompileConfig",
    "Loss",
    "LossConfig",
    "RelativeProbabilisticSiftConfig",
    "SiftingBaseConfig",
    "SiftingDataloader",
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
    from hasten.sifting.config import LossConfig, RelativeProbabilisticSiftConfig, SiftingBaseConfig
    from hasten.sifting.loader import SiftingDataloader
    from hasten.sifting.loss import Loss
