"""Configs of the pruning policies that :class:`~hasten.sifting.sampler.PruningSampler` runs.

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

Both rules live in the one registry of :mod:`hasten.sifting.core.rules` (with the loader's), which
also says that they run in the sampler only; new rules register there.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from hasten.sifting.core import rules
from hasten.sifting.core.fields import beta_value, fraction, optional_integer, set_field
from hasten.sifting.exceptions import SiftConfigValidationException
from hasten.sifting.guard import DEFAULT_GUARD, PruningGuard, coerce_guard
from hasten.sifting.policy import relative_keep_probability, relative_probabilistic_select
from hasten.sifting.unbiased import unbiased_keep_probability, unbiased_select

__all__ = [
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

    guard: PruningGuard | None = DEFAULT_GUARD
    """The pruning guard (:mod:`hasten.sifting.guard`): the rule proposes, the guard lets a
    sample be skipped only once it is learned, within a loss budget, after the loss flattened,
    and pauses pruning when an audit of the skipped samples fails. ``None``: the rule alone."""

    def __post_init__(self) -> None:
        set_field(self, "prune_ratio", fraction(self.prune_ratio, "prune_ratio", upper_open=True))
        t = self.threshold
        if t != "mean":
            if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0.0 < t < 1.0:
                raise SiftConfigValidationException(
                    f"threshold must be 'mean' or a quantile strictly between 0 and 1, got {t!r}"
                )
            set_field(self, "threshold", float(t))
        set_field(self, "anneal_fraction", fraction(self.anneal_fraction, "anneal_fraction"))
        set_field(self, "guard", coerce_guard(self.guard))

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

    guard: PruningGuard | None = DEFAULT_GUARD
    """The pruning guard (:mod:`hasten.sifting.guard`): the rule proposes, the guard lets a
    sample be skipped only once it is learned, within a loss budget, after the loss flattened,
    and pauses pruning when an audit of the skipped samples fails. ``None``: the rule alone."""

    def __post_init__(self) -> None:
        set_field(self, "beta_value", beta_value(self.beta_value))
        set_field(
            self,
            "max_loss_age",
            optional_integer(
                self.max_loss_age, "max_loss_age", minimum=0, none_means="never rescore"
            ),
        )
        set_field(self, "anneal_fraction", fraction(self.anneal_fraction, "anneal_fraction"))
        set_field(self, "guard", coerce_guard(self.guard))

    def to_dict(self) -> dict[str, Any]:
        """The config as a plain dict, with its ``"policy"`` name."""
        return {"policy": "stale_relative", **dataclasses.asdict(self)}


rules.register_rule(
    "stale_relative",
    StaleRelativePruningConfig,
    lambda cfg: functools.partial(relative_probabilistic_select, beta_value=cfg.beta_value),
    frontends={rules.SAMPLER},
    keep_probability=lambda cfg, losses, history: relative_keep_probability(
        losses, history, beta_value=cfg.beta_value
    ),
    elsewhere="For SiftingDataloader, use RelativeProbabilisticSiftConfig(beta_value=..., "
    "loss_history_length=...): the same rule on freshly scored batches.",
    example={"beta_value": 1.0, "max_loss_age": 1, "guard": None},
)
rules.register_rule(
    "unbiased",
    UnbiasedPruningConfig,
    lambda cfg: functools.partial(
        unbiased_select, prune_ratio=cfg.prune_ratio, threshold=cfg.threshold
    ),
    frontends={rules.SAMPLER},
    keep_probability=lambda cfg, losses, history: unbiased_keep_probability(
        losses, history, prune_ratio=cfg.prune_ratio, threshold=cfg.threshold
    ),
    elsewhere="Use it through PruningSampler(dataset, UnbiasedPruningConfig(...)): it needs no "
    "extra forward, and sampler.update(losses) applies its weights to the training loss.",
    example={"prune_ratio": 0.5, "threshold": "mean", "anneal_fraction": 0.0, "guard": None},
)

PRUNING_CONFIGS: Mapping[str, type] = rules.configs_for(rules.SAMPLER)
"""The config classes of the rules :class:`~hasten.sifting.PruningSampler` runs, by name: a
live, read-only view of :data:`hasten.sifting.core.rules.RULES`."""


def register_pruning_config(name: str, config_cls: type[_C]) -> type[_C]:
    """Deprecated: use :func:`hasten.sifting.core.rules.register_rule` (name, config and policy
    in one call). Makes ``config_cls`` selectable as ``{"policy": name, ...}``."""
    rules._register_half(config_cls, name=name, frontend=rules.SAMPLER)
    return config_cls


def coerce_pruning_config(config: Any) -> Any:
    """Return ``config`` as a config object the sampler runs (dicts are converted).

    A thin wrapper of :func:`hasten.sifting.core.rules.coerce_config` for the ``"sampler"``
    front-end.

    Raises:
        SiftConfigValidationException: an unknown ``"policy"`` or key, a bad value, an object
            that is not a registered config, or a rule the sampler does not run (the message
            names what to use instead).
    """
    return rules.coerce_config(config, rules.SAMPLER, what="pruning config")
