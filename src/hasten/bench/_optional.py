"""Import optional packages with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, extra: str = "bench") -> ModuleType:
    """Import ``module`` or raise an ImportError that says which hasten extra provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{module!r} is needed here but is not installed; install it with "
            f"`pip install 'hasten[{extra}]'`"
        ) from err
