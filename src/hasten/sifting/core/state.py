"""State dicts derived from dataclasses: the fields are listed once, where they are declared.

A front-end keeps what must survive a checkpoint in a dataclass; :func:`to_state` turns it into
plain data (tensors cloned, lists and dicts copied: a state dict never aliases live state) and
:func:`from_state` / :func:`load_state` read it back. Fields with ``metadata=TRANSIENT`` are left
out (what is re-derived on resume, or caches).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any, TypeVar

from torch import Tensor

__all__ = ["TRANSIENT", "from_state", "load_state", "to_state"]

_D = TypeVar("_D")

TRANSIENT: Mapping[str, bool] = types.MappingProxyType({"state": False})
"""Field metadata that leaves a field out of the state:
``field(default=0, metadata=TRANSIENT)``."""


def _persisted(cls_or_obj: Any) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls_or_obj) if f.metadata.get("state", True)]


def _copy(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.clone()
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def to_state(obj: Any) -> dict[str, Any]:
    """The persisted fields of the dataclass instance ``obj``, as plain data."""
    return {f.name: _copy(getattr(obj, f.name)) for f in _persisted(obj)}


def from_state(cls: type[_D], state: dict[str, Any]) -> _D:
    """A new ``cls`` from :func:`to_state` output (other keys ignored; a missing field takes its
    default, and raises ``ValueError`` naming it when it has none)."""
    kwargs = {f.name: _copy(state[f.name]) for f in _persisted(cls) if f.name in state}
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise ValueError(f"the state lacks fields of {cls.__name__}: {err}") from err


def load_state(obj: Any, state: dict[str, Any]) -> None:
    """Set the persisted fields of ``obj`` present in ``state`` (others keep their value)."""
    for f in _persisted(obj):
        if f.name in state:
            setattr(obj, f.name, _copy(state[f.name]))
