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

New selection policies register their config class in :data:`SIFT_CONFIGS` (see
:func:`register_sift_config`) and a policy in :mod:`hasten.sifting.policy`; a dict picks one with
its ``"policy"`` key (default ``"relative_probabilistic"``, SageMaker's rule).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hasten.sifting.exceptions import SiftConfigValidationException

__all__ = [
    "SIFT_CONFIGS",
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
        _set(self, "sift_delay", _integer(self.sift_delay, "sift_delay", minimum=0))
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
        _set(self, "sift_config", _nested(self.sift_config, SiftingBaseConfig, "sift_config"))


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
        beta = self.beta_value
        if isinstance(beta, bool) or not isinstance(beta, numbers.Real):
            raise SiftConfigValidationException(
                f"beta_value must be a positive number, got {beta!r} ({type(beta).__name__}); "
                "for example beta_value=1.0 keeps about 50 % of the samples"
            )
        if not math.isfinite(beta) or beta <= 0:
            raise SiftConfigValidationException(
                f"beta_value must be a positive, finite number, got {beta!r}; the keep rate is "
                "1/(1+beta_value): 0.5 keeps 67 %, 1.0 keeps 50 %, 3.0 keeps 25 %"
            )
        _set(self, "beta_value", float(beta))
        _set(
            self,
            "loss_history_length",
            _integer(self.loss_history_length, "loss_history_length", minimum=1),
        )
        _set(
            self,
            "loss_based_sift_config",
            _nested(self.loss_based_sift_config, LossConfig, "loss_based_sift_config"),
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
        return _from_mapping(cls, data, "sift_config")

    def to_dict(self) -> dict[str, Any]:
        """The config as nested plain dicts, the shape SageMaker accepts."""
        return dataclasses.asdict(self)


SIFT_CONFIGS: dict[str, type] = {"relative_probabilistic": RelativeProbabilisticSiftConfig}
"""Registered sifting config classes by name; a dict config selects one with ``"policy"``."""


def register_sift_config(name: str, config_cls: type[_C]) -> type[_C]:
    """Make ``config_cls`` selectable as ``{"policy": name, ...}``. Returns ``config_cls``."""
    if name in SIFT_CONFIGS and SIFT_CONFIGS[name] is not config_cls:
        raise ValueError(f"a sifting config named {name!r} is already registered")
    SIFT_CONFIGS[name] = config_cls
    return config_cls


def coerce_sift_config(config: Any) -> Any:
    """Return ``config`` as a config object: objects of a registered class pass, dicts convert.

    Raises:
        SiftConfigValidationException: for a dict with unknown keys or bad values, an unknown
            ``"policy"`` name, or an object that is not a sifting config.
    """
    if isinstance(config, tuple(SIFT_CONFIGS.values())):
        return config
    if isinstance(config, Mapping):
        data = dict(config)
        name = data.pop("policy", "relative_probabilistic")
        if name not in SIFT_CONFIGS:
            raise SiftConfigValidationException(
                f"unknown sifting policy {name!r}; registered: {', '.join(sorted(SIFT_CONFIGS))}"
            )
        return _from_mapping(SIFT_CONFIGS[name], data, "sift_config")
    if config is None:
        raise SiftConfigValidationException(
            "sift_config is required: pass RelativeProbabilisticSiftConfig(beta_value=1.0, "
            "loss_history_length=500) or the equivalent dict"
        )
    raise SiftConfigValidationException(
        f"sift_config must be a sifting config object or a dict, got {type(config).__name__}; "
        "pass RelativeProbabilisticSiftConfig(...) or the equivalent dict"
    )


# --------------------------------------------------------------------------- helpers


def _set(obj: object, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # frozen dataclass: normalise in __post_init__ only


def _integer(value: Any, name: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SiftConfigValidationException(
            f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})"
        )
    if value < minimum:
        raise SiftConfigValidationException(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _nested(value: Any, cls: type[_C], name: str) -> _C:
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return _from_mapping(cls, value, name)
    raise SiftConfigValidationException(
        f"{name} must be a {cls.__name__} or a dict, got {type(value).__name__}"
    )


def _from_mapping(cls: type[_C], data: Mapping[str, Any], name: str) -> _C:
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise SiftConfigValidationException(
            f"unknown key(s) {unknown} in {name} for {cls.__name__}; allowed keys: {sorted(known)}"
        )
    required = {
        f.name
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    missing = sorted(required - set(data))
    if missing:
        raise SiftConfigValidationException(
            f"missing key(s) {missing} in {name} for {cls.__name__}"
        )
    return cls(**data)
