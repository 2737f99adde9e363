"""Which sifting front-end a config selects, for the trainer integrations' one switch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hasten.sifting import StaleRelativePruningConfig, UnbiasedPruningConfig, coerce_pruning_config

__all__ = ["is_pruning_config"]


def is_pruning_config(config: Any) -> bool:
    """Whether ``config`` selects the :class:`~hasten.sifting.PruningSampler` front-end: a
    pruning config object, or a dict with a ``"policy"`` key naming one (an unknown policy or
    field raises, naming it). Anything else is for :class:`~hasten.sifting.SiftingDataloader`."""
    if isinstance(config, (UnbiasedPruningConfig, StaleRelativePruningConfig)):
        return True
    if isinstance(config, Mapping) and "policy" in config:
        coerce_pruning_config(config)
        return True
    return False
