"""SageMaker's ``smart_sifting.integrations`` path: framework integrations (see :mod:`hasten.integrations`)."""

from __future__ import annotations

__all__: list[str] = []
