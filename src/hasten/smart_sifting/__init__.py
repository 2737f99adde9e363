"""SageMaker ``smart_sifting`` module paths, served by :mod:`hasten.sifting`.

Migrating from SageMaker means changing the import prefix ``smart_sifting`` to
``hasten.smart_sifting``; every class here *is* the :mod:`hasten.sifting` class (same object), so
the two spellings mix freely. The exceptions are importable from here and from
:mod:`hasten.smart_sifting.exceptions`.
"""

from __future__ import annotations

from hasten.sifting.exceptions import (
    LossImplementationNotProvidedException,
    SiftConfigValidationException,
    UnsupportedDataFormatException,
)

__all__ = [
    "LossImplementationNotProvidedException",
    "SiftConfigValidationException",
    "UnsupportedDataFormatException",
]
