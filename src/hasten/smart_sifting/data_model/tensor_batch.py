"""``smart_sifting.data_model.tensor_batch``: see :mod:`hasten.sifting.batch`."""

from __future__ import annotations

from hasten.sifting.batch import TensorBatch

__all__ = ["TensorBatch"]
