"""Sifting configs, keyword-compatible with SageMaker's ``smart_sifting.sift_config.sift_configs``.

The three classes nest the way SageMaker's do, and a plain dict is accepted wherever a config
object is (at any level)::

    RelativeProbabilisticSiftConfig(
        beta_value=1.0,  # keep ~1/(1+beta) of the data: 50 %
        loss_history_length=500,
        loss_based_sift_config=LossConfig(sift_config=SiftingBaseConfig(sift_delay=100)),
    )
    # the same config as a dict
    {"beta_value": 1.0, "loss_history_length": 500,
     "loss_based_sift_config": {"sift_config": {"sift_delay": 100}}}

Configs are frozen dataclasses, validated on construction: a bad value raises
:class:`~hasten.sifting.exceptions.SiftConfigValidationException` naming the field and the fix.

Every rule (config class and policy) is registered in :mod:`hasten.sifting.core.rules`; a dict
picks one with its ``"policy"`` key (default ``"relative_probabilistic"``, SageMaker's rule).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hasten.sifting.core import rules
from hasten.sifting.core.fields import beta_value, from_mapping, integer, nested, set_field
from hasten.sifting.exceptions import SiftConfigValidationException
from hasten.sifting.policy import relative_keep_probability, relative_probabilistic_select

__all__ = [
    "LossConfig",
    "RelativeProbabilisticSiftConfig",
    "SiftingBaseConfig",
    "coerce_sift_config",
    "register_sift_config",
]

_C = TypeVar("_C")


@dataclass(frozen=True)
class SiftingBaseConfig:
    """When sifting is active."""

    sift_delay: int = 1000
    """Training steps (batches yielded) before sifting starts. Until then batches pass through
    untouched and unscored, so the model sees all data while it is still learning the basics.
    SageMaker's default, 1000, is long for small datasets: set it to a few hundred steps there."""

    repeat_delay_per_epoch: bool = False
    """Restart the delay at the beginning of every epoch (the loss history is kept)."""

    def __post_init__(self) -> None:
        set_field(self, "sift_delay", integer(self.sift_delay, "sift_delay", minimum=0))
        if not isinstance(self.repeat_delay_per_epoch, bool):
            raise SiftConfigValidationException(
                f"repeat_delay_per_epoch must be True or False, got "
                f"{self.repeat_delay_per_epoch!r} ({type(self.repeat_delay_per_epoch).__name__})"
            )


@dataclass(frozen=True)
class LossConfig:
    """Configuration of loss-based sifting (SageMaker's ``loss_based_sift_config``)."""

    sift_config: SiftingBaseConfig = field(default_factory=SiftingBaseConfig)
    """When sifting is active: a :class:`SiftingBaseConfig` or an equivalent dict."""

    def __post_init__(self) -> None:
        set_field(self, "sift_config", nested(self.sift_config, SiftingBaseConfig, "sift_config"))


@dataclass(frozen=True)
class RelativeProbabilisticSiftConfig:
    """SageMaker's selection rule: keep a sample with probability ``p ** beta_value``.

    ``p`` is the percentile of the sample's loss among the last ``loss_history_length`` losses
    scored, so on average ``1 / (1 + beta_value)`` of the data is kept: beta 0.5 keeps 67 %,
    1 keeps 50 %, 3 keeps 25 %. High-loss samples are kept more often than low-loss ones.
    """

    beta_value: float
    """Positive number; larger sifts out more (keep rate ``1 / (1 + beta_value)``)."""

    loss_history_length: int
    """How many recent losses a new loss is ranked against (SageMaker's examples use 500)."""

    loss_based_sift_config: LossConfig = field(default_factory=LossConfig)
    """Delay settings: a :class:`LossConfig` or an equivalent dict."""

    def __post_init__(self) -> None:
        set_field(self, "beta_value", beta_value(self.beta_value))
        set_field(
            self,
            "loss_history_length",
            integer(self.loss_history_length, "loss_history_length", minimum=1),
        )
        set_field(
            self,
            "loss_based_sift_config",
            nested(self.loss_based_sift_config, LossConfig, "loss_based_sift_config"),
        )

    @property
    def sift_delay(self) -> int:
        """Shortcut to ``loss_based_sift_config.sift_config.sift_delay``."""
        return self.loss_based_sift_config.sift_config.sift_delay

    @property
    def repeat_delay_per_epoch(self) -> bool:
        """Shortcut to ``loss_based_sift_config.sift_config.repeat_delay_per_epoch``."""
        return self.loss_based_sift_config.sift_config.repeat_delay_per_epoch

    @property
    def expected_keep_rate(self) -> float:
        """The fraction of scored samples kept on average: ``1 / (1 + beta_value)``."""
        return 1.0 / (1.0 + self.beta_value)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RelativeProbabilisticSiftConfig:
        """Build from a (possibly nested) dict; unknown keys raise."""
        return from_mapping(cls, data, "sift_config")

    def to_dict(self) -> dict[str, Any]:
        """The config as nested plain dicts, the shape SageMaker accepts."""
        return dataclasses.asdict(self)


rules.register_rule(
    "relative_probabilistic",
    RelativeProbabilisticSiftConfig,
    lambda cfg: functools.partial(relative_probabilistic_select, beta_value=cfg.beta_value),
    frontends={rules.LOADER},
    keep_probability=lambda cfg, losses, history: relative_keep_probability(
        losses, history, beta_value=cfg.beta_value
    ),
    nominal_keep_rate=lambda cfg: cfg.expected_keep_rate,
    elsewhere="For PruningSampler, use StaleRelativePruningConfig(beta_value=...): the same rule "
    "on the losses the training step fed back.",
    example={
        "beta_value": 1.0,
        "loss_history_length": 256,
        "loss_based_sift_config": {"sift_config": {"sift_delay": 0}},
    },
)

SIFT_CONFIGS: Mapping[str, type] = rules.configs_for(rules.LOADER)
"""The config classes of the rules the loader runs, by name: a live, read-only view of
:data:`hasten.sifting.core.rules.RULES`."""


def register_sift_config(name: str, config_cls: type[_C]) -> type[_C]:
    """Deprecated: use :func:`hasten.sifting.core.rules.register_rule` (name, config and policy
    in one call). Makes ``config_cls`` selectable as ``{"policy": name, ...}``."""
    rules._register_half(config_cls, name=name, frontend=rules.LOADER)
    return config_cls


def coerce_sift_config(config: Any) -> Any:
    """Return ``config`` as a config object the loader runs: objects pass, dicts convert.

    A thin wrapper of :func:`hasten.sifting.core.rules.coerce_config` for the ``"loader"``
    front-end.

    Raises:
        SiftConfigValidationException: for a dict with unknown keys or bad values, an unknown
            ``"policy"`` name, an object that is not a sifting config, or a rule the loader does
            not run (the message names what to use instead).
    """
    return rules.coerce_config(config, rules.LOADER, what="sift_config")
