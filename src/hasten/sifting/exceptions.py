"""The errors smart sifting raises, named as in SageMaker's ``smart_sifting``.

Each one subclasses both :class:`ValueError` and :class:`TypeError`, so code that migrated from
SageMaker can catch it by name, and plain PyTorch code catches it with the builtin it expects (a
wrong type and a wrong value of a sifting input are reported by the same exception).
"""

from __future__ import annotations

__all__ = [
    "LossImplementationNotProvidedException",
    "SiftConfigValidationException",
    "UnsupportedDataFormatException",
]


class SiftConfigValidationException(ValueError, TypeError):
    """A sifting config has a missing or unknown key, or a value of the wrong type or range."""


class UnsupportedDataFormatException(ValueError, TypeError):
    """A batch cannot be split into samples: unsupported type, or ambiguous / inconsistent size."""


class LossImplementationNotProvidedException(ValueError, TypeError):
    """No usable per-sample loss: ``loss_impl`` or ``model`` missing, or a loss of the wrong shape."""
