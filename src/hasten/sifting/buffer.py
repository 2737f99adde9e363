"""Kept rows waiting to be yielded, with their stream positions and source batches."""

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
    samples) and its source: the incoming batch's index in the epoch and the stream position of
    that batch's first row. (Rows carry no weights: the loader's rules keep samples unweighted;
    reweighting rules run in :class:`~hasten.sifting.PruningSampler`.)
    """

    def __init__(self) -> None:
        self.chunks: list[SiftingBatch] = []
        self.ids: list[Tensor] = []
        self.sizes: list[int] = []
        self.sources: list[tuple[int, int]] = []  # (batch index in the epoch, its first position)
        self.count = 0

    def add(self, sb: SiftingBatch, ids: Tensor, n: int, source: tuple[int, int]) -> None:
        """Append the ``n`` kept rows ``sb`` of the incoming batch ``source``."""
        if n:
            self.chunks.append(sb)
            self.ids.append(ids)
            self.sizes.append(n)
            self.sources.append(source)
            self.count += n

    def pop(self, n: int) -> tuple[SiftingBatch, Tensor]:
        """The first ``n`` rows (``1 <= n <= count``) merged into one batch, and their ids; the
        rest stay."""
        k, have = 0, 0
        while have + self.sizes[k] < n:
            have += self.sizes[k]
            k += 1
        need = n - have  # rows taken from chunk k
        chunks, ids = self.chunks[: k + 1], self.ids[: k + 1]
        if need == self.sizes[k]:  # ends on a chunk boundary
            rest = k + 1
        else:  # split chunk k: its head is popped, its tail stays first
            head, tail = chunks[k].split(need)
            chunks[k], ids[k] = head, ids[k][:need]
            self.chunks[k], self.ids[k] = tail, self.ids[k][need:]
            self.sizes[k] -= need
            rest = k
        del self.chunks[:rest], self.ids[:rest], self.sizes[:rest], self.sources[:rest]
        self.count -= n
        merged = chunks[0] if len(chunks) == 1 else type(chunks[0]).concat(chunks)
        return merged, ids[0] if len(ids) == 1 else torch.cat(ids)

    def state_dict(self) -> dict[str, Any]:
        """The buffered rows by position only: plain ints and CPU int64 tensors.

        Per chunk: ``batch`` (the incoming batch's index in the epoch), ``start`` (the stream
        position of its first row) and ``rows`` (the kept rows' indices within that batch).
        Holds no sample data: the loader re-creates the rows from the batches it replays on
        resume.
        """
        return {
            "count": self.count,
            "chunks": [
                {"batch": b, "start": s, "rows": (i - s).cpu()}  # HOST SYNC: checkpoint only
                for (b, s), i in zip(self.sources, self.ids)
            ],
        }
