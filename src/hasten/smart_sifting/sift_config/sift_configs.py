"""``smart_sifting.sift_config.sift_configs``: see :mod:`hasten.sifting.config`."""

from __future__ import annotations

from hasten.sifting.config import LossConfig, RelativeProbabilisticSiftConfig, SiftingBaseConfig

__all__ = ["LossConfig", "RelativeProbabilisticSiftConfig", "SiftingBaseConfig"]
