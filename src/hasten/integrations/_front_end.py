"""Which sifting front-end a config selects, for the trainer integrations' one switch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hasten.sifting import coerce_pruning_config
from hasten.sifting.core.rules import SAMPLER, rule_of
from hasten.sifting.exceptions import SiftConfigValidationException

__all__ = ["is_pruning_config"]


def is_pruning_config(config: Any) -> bool:
    """Whether ``config`` selects the :class:`~hasten.sifting.PruningSampler` front-end: a
    pruning config object, or a dict with a ``"policy"`` key naming one (an unknown policy or
    field raises, naming it). Anything else is for :class:`~hasten.sifting.SiftingDataloader`.
    A config object's rule says which front-end runs it (``hasten.sifting.core.rules``)."""
    if not isinstance(config, Mapping):
        try:
            return SAMPLER in rule_of(config).frontends
        except SiftConfigValidationException:
            return False  # not a registered config: the loader path reports it
    if "policy" in config:
        coerce_pruning_config(config)
        return True
    return False
