"""Kept rows waiting to be yielded, with their stream positions and weights."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hasten.sifting.batch import SiftingBatch

__all__ = ["KeptBuffer"]


class KeptBuffer:
    """Kept rows waiting to be yielded, as chunks (concatenated only when a batch is popped).

    Each chunk carries its rows' stream positions (``ids``) and, from reweighting policies,
    their weights (``None`` otherwise).
    """

    def __init__(self) -> None:
        self.chunks: list[SiftingBatch] = []
        self.ids: list[Tensor] = []
        self.weights: list[Tensor | None] = []
        self.count = 0

    def add(self, sb: SiftingBatch, ids: Tensor, weights: Tensor | None, n: int) -> None:
        if n:
            self.chunks.append(sb)
            self.ids.append(ids)
            self.weights.append(weights)
            self.count += n

    def pop(self, n: int) -> tuple[SiftingBatch, Tensor, Tensor | None]:
        """The first ``n`` rows; the rest stay."""
        merged = (
            self.chunks[0] if len(self.chunks) == 1 else type(self.chunks[0]).concat(self.chunks)
        )
        ids = _cat(self.ids)
        weights = None if any(w is None for w in self.weights) else _cat(self.weights)  # type: ignore[arg-type]
        if n == self.count:
            self.chunks, self.ids, self.weights, self.count = [], [], [], 0
            return merged, ids, weights
        head, tail = merged.split(n)
        self.chunks, self.ids, self.count = [tail], [ids[n:]], self.count - n
        self.weights = [None if weights is None else weights[n:]]
        return head, ids[:n], None if weights is None else weights[:n]

    def to(self, device: torch.device) -> None:
        self.chunks = [c.to(device) for c in self.chunks]
        self.ids = [i.to(device) for i in self.ids]
        self.weights = [None if w is None else w.to(device) for w in self.weights]

    def state_dict(self) -> dict[str, Any]:
        cpu = torch.device("cpu")
        return {
            "chunks": [c.to(cpu) for c in self.chunks],
            "ids": [i.cpu() for i in self.ids],
            "weights": [None if w is None else w.cpu() for w in self.weights],
            "count": self.count,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> KeptBuffer:
        buf = cls()
        buf.chunks, buf.ids = list(state["chunks"]), list(state["ids"])
        buf.weights, buf.count = list(state["weights"]), state["count"]
        return buf


def _cat(tensors: list[Tensor]) -> Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)
