"""Configs of the pruning policies that :class:`~hasten.sifting.pruning.PruningSampler` runs.

These policies decide, at the start of every epoch, which dataset indices to load, from the loss
each sample had the last time the training step saw it (fed back through
:meth:`PruningSampler.update`). Two ship here:

- :class:`UnbiasedPruningConfig` (InfoBatch's rule): below-threshold samples are pruned at
  random and the survivors up-weighted, so the expected gradient is unchanged; no extra forward.
- :class:`StaleRelativePruningConfig`: SageMaker's relative rule (keep with probability
  ``percentile ** beta``) on stored losses, rescoring only samples whose loss is older than
  ``max_loss_age`` epochs.

A plain dict works wherever a config does; its ``"policy"`` key picks the class::

    {"policy": "unbiased", "prune_ratio": 0.5, "anneal_fraction": 0.125}

New pruning policies register a config class with :func:`register_pruning_config` and a rule
with :func:`hasten.sifting.policy.register_policy` (the same registry as the loader's policies).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from hasten.sifting.config import _from_mapping, _set
from hasten.sifting.exceptions import SiftConfigValidationException

__all__ = [
    "PRUNING_CONFIGS",
    "StaleRelativePruningConfig",
    "UnbiasedPruningConfig",
    "coerce_pruning_config",
    "register_pruning_config",
]

_C = TypeVar("_C")


@dataclass(frozen=True, kw_only=True)
class UnbiasedPruningConfig:
    """InfoBatch's unbiased pruning: prune low-loss samples at random, reweight the kept ones.

    Each epoch, a sample whose stored loss is below ``threshold`` is left out with probability
    ``prune_ratio``; if kept, its loss is weighted ``1 / (1 - prune_ratio)``. Samples never seen
    and samples at or above the threshold are always kept with weight 1. The last
    ``anneal_fraction`` of the epochs train on all data with weight 1.

    The share of data skipped depends on the loss distribution: about ``prune_ratio`` times the
    fraction of samples below the threshold, during the pruning epochs. Losses are skewed (many
    small, a few large), so below-mean samples are often 60-80 % of the data.
    """

    prune_ratio: float = 0.5
    """Probability in ``[0, 1)`` of leaving out a below-threshold sample in an epoch."""

    threshold: str | float = "mean"
    """``"mean"`` of the stored losses (InfoBatch) or a quantile in ``(0, 1)`` of them."""

    anneal_fraction: float = 0.125
    """Fraction of the epochs, at the end, trained on all data (InfoBatch's ``1 - delta``)."""

    def __post_init__(self) -> None:
        _set(self, "prune_ratio", _fraction(self.prune_ratio, "prune_ratio", upper_open=True))
        t = self.threshold
        if t != "mean":
            if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0.0 < t < 1.0:
                raise SiftConfigValidationException(
                    f"threshold must be 'mean' or a quantile strictly between 0 and 1, got {t!r}"
                )
            _set(self, "threshold", float(t))
        _set(self, "anneal_fraction", _fraction(self.anneal_fraction, "anneal_fraction"))

    def to_dict(self) -> dict[str, Any]:
        """The config as a plain dict, with its ``"policy"`` name."""
        return {"policy": "unbiased", **dataclasses.asdict(self)}


@dataclass(frozen=True, kw_only=True)
class StaleRelativePruningConfig:
    """SageMaker's relative rule on stored losses, rescoring only stale ones.

    Each epoch, a sample whose stored loss sits at percentile ``p`` of all stored losses is kept
    with probability ``p ** beta_value`` (SageMaker's rule; no reweighting, so the gradient is
    biased towards hard samples). Losses come from the training step (fed back, free) or, for
    samples left out longer than ``max_loss_age`` epochs, from a scoring pass at the start of the
    epoch (a :class:`~hasten.sifting.scoring.Scorer`, one forward per stale sample). Samples
    never seen are always kept.
    """

    beta_value: float = 1.0
    """Positive; keep probability ``percentile ** beta_value`` (about ``1 / (1 + beta)`` kept)."""

    max_loss_age: int | None = 1
    """Rescore a sample when its stored loss is more than this many epochs old (0: rescore
    every sample every epoch, as SageMaker does; ``None``: never rescore, reuse stale losses)."""

    anneal_fraction: float = 0.0
    """Fraction of the epochs, at the end, trained on all data."""

    def __post_init__(self) -> None:
        beta = self.beta_value
        if isinstance(beta, bool) or not isinstance(beta, numbers.Real):
            raise SiftConfigValidationException(
                f"beta_value must be a positive number, got {beta!r} ({type(beta).__name__})"
            )
        if not math.isfinite(beta) or beta <= 0:
            raise SiftConfigValidationException(
                f"beta_value must be positive and finite, got {beta!r}; 1.0 keeps about 50 %"
            )
        _set(self, "beta_value", float(beta))
        age = self.max_loss_age
        if age is not None and (isinstance(age, bool) or not isinstance(age, int) or age < 0):
            raise SiftConfigValidationException(
                f"max_loss_age must be an int >= 0 (epochs) or None (never rescore), got {age!r}"
            )
        _set(self, "anneal_fraction", _fraction(self.anneal_fraction, "anneal_fraction"))

    def to_dict(self) -> dict[str, Any]:
        """The config as a plain dict, with its ``"policy"`` name."""
        return {"policy": "stale_relative", **dataclasses.asdict(self)}


PRUNING_CONFIGS: dict[str, type] = {
    "unbiased": UnbiasedPruningConfig,
    "stale_relative": StaleRelativePruningConfig,
}
"""Registered pruning config classes by name; a dict config selects one with ``"policy"``."""


def register_pruning_config(name: str, config_cls: type[_C]) -> type[_C]:
    """Make ``config_cls`` selectable as ``{"policy": name, ...}``. Returns ``config_cls``.

    The class needs an ``anneal_fraction`` attribute (0 for none).
    """
    if name in PRUNING_CONFIGS and PRUNING_CONFIGS[name] is not config_cls:
        raise ValueError(f"a pruning config named {name!r} is already registered")
    PRUNING_CONFIGS[name] = config_cls
    return config_cls


def coerce_pruning_config(config: Any) -> Any:
    """Return ``config`` as a pruning config object (dicts are converted).

    Raises:
        SiftConfigValidationException: an unknown ``"policy"`` or key, a bad value, or an object
            that is not a registered pruning config.
    """
    if isinstance(config, tuple(PRUNING_CONFIGS.values())):
        return config
    if isinstance(config, Mapping):
        data = dict(config)
        name = data.pop("policy", None)
        if name not in PRUNING_CONFIGS:
            raise SiftConfigValidationException(
                f"a pruning config dict needs 'policy' set to one of "
                f"{sorted(PRUNING_CONFIGS)}, got {name!r}"
            )
        return _from_mapping(PRUNING_CONFIGS[name], data, "pruning config")
    raise SiftConfigValidationException(
        f"config must be a pruning config (UnbiasedPruningConfig, StaleRelativePruningConfig) "
        f"or a dict with a 'policy' key, got {type(config).__name__}"
    )


def _fraction(value: Any, name: str, *, upper_open: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if ok:
        ok = 0.0 <= value < 1.0 if upper_open else 0.0 <= value <= 1.0
    if not ok:
        bound = "[0, 1)" if upper_open else "[0, 1]"
        raise SiftConfigValidationException(f"{name} must be a number in {bound}, got {value!r}")
    return float(value)
