"""Field validation shared by every sifting config: one check per kind of field, one message.

Configs are frozen, keyword-friendly dataclasses that normalise their fields in ``__post_init__``
with these helpers; a bad value raises
:class:`~hasten.sifting.exceptions.SiftConfigValidationException` naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any, TypeVar

from hasten.sifting.exceptions import SiftConfigValidationException

__all__ = [
    "beta_value",
    "fraction",
    "from_mapping",
    "integer",
    "nested",
    "optional_integer",
    "set_field",
]

_C = TypeVar("_C")


def set_field(obj: object, name: str, value: Any) -> None:
    """Normalise a field of a frozen dataclass (call it from ``__post_init__`` only)."""
    object.__setattr__(obj, name, value)


def integer(value: Any, name: str, *, minimum: int) -> int:
    """``value`` as an ``int >= minimum`` (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SiftConfigValidationException(
            f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})"
        )
    if value < minimum:
        raise SiftConfigValidationException(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def optional_integer(value: Any, name: str, *, minimum: int, none_means: str) -> int | None:
    """``None`` or an ``int >= minimum``; ``none_means`` says what ``None`` does, for the error."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise SiftConfigValidationException(
            f"{name} must be an int >= {minimum} or None ({none_means}), got {value!r}"
        )
    return int(value)


def beta_value(value: Any, name: str = "beta_value") -> float:
    """SageMaker's ``beta_value``: a positive, finite number (keep rate ``1 / (1 + beta)``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SiftConfigValidationException(
            f"{name} must be a positive number, got {value!r} ({type(value).__name__}); "
            "for example beta_value=1.0 keeps about 50 % of the samples"
        )
    if not math.isfinite(value) or value <= 0:
        raise SiftConfigValidationException(
            f"{name} must be a positive, finite number, got {value!r}; the keep rate is "
            "1/(1+beta_value): 0.5 keeps 67 %, 1.0 keeps 50 %, 3.0 keeps 25 %"
        )
    return float(value)


def fraction(value: Any, name: str, *, upper_open: bool = False) -> float:
    """A number in ``[0, 1]`` (``[0, 1)`` when ``upper_open``)."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if ok:
        ok = 0.0 <= value < 1.0 if upper_open else 0.0 <= value <= 1.0
    if not ok:
        bound = "[0, 1)" if upper_open else "[0, 1]"
        raise SiftConfigValidationException(f"{name} must be a number in {bound}, got {value!r}")
    return float(value)


def nested(value: Any, cls: type[_C], name: str) -> _C:
    """A nested config field: an instance of ``cls``, or a dict converted to one."""
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return from_mapping(cls, value, name)
    raise SiftConfigValidationException(
        f"{name} must be a {cls.__name__} or a dict, got {type(value).__name__}"
    )


def from_mapping(cls: type[_C], data: Mapping[str, Any], name: str) -> _C:
    """Build the dataclass ``cls`` from ``data``; unknown and missing keys raise, by name."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    known = {f.name for f in fields}
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise SiftConfigValidationException(
            f"unknown key(s) {unknown} in {name} for {cls.__name__}; allowed keys: {sorted(known)}"
        )
    required = {
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    missing = sorted(required - set(data))
    if missing:
        raise SiftConfigValidationException(
            f"missing key(s) {missing} in {name} for {cls.__name__}"
        )
    return cls(**data)
