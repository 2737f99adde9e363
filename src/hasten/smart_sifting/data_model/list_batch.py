"""``smart_sifting.data_model.list_batch``: see :mod:`hasten.sifting.batch`."""

from __future__ import annotations

from hasten.sifting.batch import ListBatch

__all__ = ["ListBatch"]
