"""SageMaker smart sifting's exceptions (see :mod:`hasten.sifting.exceptions`)."""

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
