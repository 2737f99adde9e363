"""``smart_sifting.data_model.data_model_interface``: see :mod:`hasten.sifting.batch`."""

from __future__ import annotations

from hasten.sifting.batch import SiftingBatch, SiftingBatchTransform

__all__ = ["SiftingBatch", "SiftingBatchTransform"]
