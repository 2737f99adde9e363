"""Kept rows waiting to be yielded, with their stream positions, weights and source batches."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hasten.sifting.batch import SiftingBatch

__all__ = ["KeptBuffer"]


class KeptBuffer:
    """Kept rows waiting to be yielded, one chunk per incoming batch.

    Chunks are merged only when a batch is popped, and only those the popped rows come from: a
    chunk the popped batch ends inside is split, its tail staying as the first chunk. So every
    chunk holds rows of one incoming batch, which is what lets :meth:`state_dict` describe the
    buffer by position alone (the loader re-creates the rows from the replayed batch on resume).

    Each chunk carries its rows' stream positions (``ids``: position in the epoch's stream of
    samples), their weights from reweighting policies (``None`` otherwise), and its source: the
    incoming batch's index in the epoch and the stream position of that batch's first row.
    """

    def __init__(self) -> None:
        self.chunks: list[SiftingBatch] = []
        self.ids: list[Tensor] = []
        self.weights: list[Tensor | None] = []
        self.sizes: list[int] = []
        self.sources: list[tuple[int, int]] = []  # (batch index in the epoch, its first position)
        self.count = 0

    def add(
        self,
        sb: SiftingBatch,
        ids: Tensor,
        weights: Tensor | None,
        n: int,
        source: tuple[int, int],
    ) -> None:
        """Append the ``n`` kept rows ``sb`` of the incoming batch ``source``."""
        if n:
            self.chunks.append(sb)
            self.ids.append(ids)
            self.weights.append(weights)
            self.sizes.append(n)
            self.sources.append(source)
            self.count += n

    def pop(self, n: int) -> tuple[SiftingBatch, Tensor, Tensor | None]:
        """The first ``n`` rows (``1 <= n <= count``) merged into one batch; the rest stay."""
        k, have = 0, 0
        while have + self.sizes[k] < n:
            have += self.sizes[k]
            k += 1
        need = n - have  # rows taken from chunk k
        chunks, ids, weights = self.chunks[: k + 1], self.ids[: k + 1], self.weights[: k + 1]
        if need == self.sizes[k]:  # ends on a chunk boundary
            rest = k + 1
        else:  # split chunk k: its head is popped, its tail stays first
            head, tail = chunks[k].split(need)
            w = weights[k]
            chunks[k], ids[k] = head, ids[k][:need]
            weights[k] = None if w is None else w[:need]
            self.chunks[k], self.ids[k] = tail, self.ids[k][need:]
            self.weights[k] = None if w is None else w[need:]
            self.sizes[k] -= need
            rest = k
        del self.chunks[:rest], self.ids[:rest], self.weights[:rest]
        del self.sizes[:rest], self.sources[:rest]
        self.count -= n
        merged = chunks[0] if len(chunks) == 1 else type(chunks[0]).concat(chunks)
        w_out = None if any(w is None for w in weights) else _cat(weights)  # type: ignore[arg-type]
        return merged, _cat(ids), w_out

    def to(self, device: torch.device) -> None:
        self.chunks = [c.to(device) for c in self.chunks]
        self.ids = [i.to(device) for i in self.ids]
        self.weights = [None if w is None else w.to(device) for w in self.weights]

    def state_dict(self) -> dict[str, Any]:
        """The buffered rows by position only: plain ints and CPU int64/float tensors.

        Per chunk: ``batch`` (the incoming batch's index in the epoch), ``start`` (the stream
        position of its first row), ``rows`` (the kept rows' indices within that batch) and
        ``weights``. Holds no sample data: the loader re-creates the rows from the batches it
        replays on resume.
        """
        return {
            "count": self.count,
            "chunks": [
                {
                    "batch": b,
                    "start": s,
                    "rows": (i - s).cpu(),  # HOST SYNC: checkpoint time only
                    "weights": None if w is None else w.cpu(),
                }
                for (b, s), i, w in zip(self.sources, self.ids, self.weights)
            ],
        }


def _cat(tensors: list[Tensor]) -> Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)
