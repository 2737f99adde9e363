"""SageMaker's ``smart_sifting.metrics`` path: training-framework metric callbacks."""

from __future__ import annotations

__all__: list[str] = []
