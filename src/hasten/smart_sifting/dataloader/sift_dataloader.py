"""``smart_sifting.dataloader.sift_dataloader``: see :mod:`hasten.sifting.loader`."""

from __future__ import annotations

from hasten.sifting.loader import SiftingDataloader

__all__ = ["SiftingDataloader"]
