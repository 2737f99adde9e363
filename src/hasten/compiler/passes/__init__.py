"""hasten's graph passes: one module per pass, all registered by name in :mod:`.registry`."""

from __future__ import annotations

from hasten.compiler.passes.registry import (
    STAGES,
    GraphPass,
    PassStats,
    get_pass,
    pass_names,
    record,
    register_pass,
    run_passes,
)

__all__ = [
    "STAGES",
    "GraphPass",
    "PassStats",
    "get_pass",
    "pass_names",
    "record",
    "register_pass",
    "run_passes",
]
