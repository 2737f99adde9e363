"""Per-sample loss memory fed by the training step itself: no extra forward pass.

:class:`SampleLosses` holds, for every dataset index, the last loss seen for it and the epoch
it was seen in. The training step writes into it (``record``, a scatter on the losses' device:
no host sync); pruning policies read it once per epoch. Under ``torch.distributed`` each rank
records the samples it trained on and :meth:`SampleLosses.sync` merges the ranks' updates, so
every rank holds the same table and takes the same pruning decision.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hasten.sifting.core.dist import comm_device, is_distributed

__all__ = ["SampleLosses"]

UNSEEN = -1
"""``epoch_seen`` of a sample whose loss was never recorded."""


class SampleLosses:
    """The latest loss of every sample of a dataset, and the epoch it was recorded in.

    Args:
        size: Number of samples (dataset indices ``0 .. size - 1``).
        device: Where the table lives; default: the device of the first losses recorded.

    Example::

        table = SampleLosses(len(dataset))
        table.record(indices, per_sample_losses, epoch=3)   # in the training step
        table.losses[table.seen]                             # what a policy reads
    """

    def __init__(self, size: int, device: torch.device | str | None = None) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int (the dataset length), got {size!r}")
        self.size = size
        self._device = None if device is None else torch.device(device)
        self._losses: Tensor | None = None
        self._epoch_seen: Tensor | None = None
        self._dirty: Tensor | None = None  # recorded on this rank since the last sync()
        if self._device is not None:
            self._allocate(self._device)

    # ------------------------------------------------------------------ reading

    @property
    def device(self) -> torch.device:
        """Device of the table (CPU until the first record when no device was given)."""
        return self._device or torch.device("cpu")

    @property
    def losses(self) -> Tensor:
        """Float32 ``[size]``: the latest loss per sample; ``+inf`` if unseen or non-finite."""
        if self._losses is None:
            self._allocate(self.device)
        assert self._losses is not None
        return self._losses

    @property
    def epoch_seen(self) -> Tensor:
        """Int64 ``[size]``: the epoch each loss was recorded in (``-1``: never)."""
        if self._epoch_seen is None:
            self._allocate(self.device)
        assert self._epoch_seen is not None
        return self._epoch_seen

    @property
    def seen(self) -> Tensor:
        """Boolean ``[size]``: whether a loss was ever recorded for the sample."""
        return self.epoch_seen != UNSEEN

    # ------------------------------------------------------------------ writing

    def record(self, indices: Tensor, losses: Tensor, epoch: int) -> None:
        """Store ``losses[k]`` as the loss of sample ``indices[k]``, seen in ``epoch``.

        Non-finite losses are stored as ``+inf`` (treated as the hardest samples). Runs on the
        table's device without reading anything back to the host. When an index repeats, one
        of its losses is kept.
        """
        self.place(losses.device)
        assert self._losses is not None and self._epoch_seen is not None
        assert self._dirty is not None
        dev = self._losses.device
        idx = indices.reshape(-1).to(dev, torch.int64, non_blocking=True)
        inf = float("inf")
        vals = torch.nan_to_num(
            losses.detach().reshape(-1).to(dev, torch.float32), nan=inf, neginf=inf
        )
        self._losses.index_copy_(0, idx, vals)
        self._epoch_seen.index_fill_(0, idx, epoch)
        self._dirty.index_fill_(0, idx, True)

    def place(self, device: torch.device) -> torch.device:
        """Fix the table on ``device`` unless a device was already fixed; return the table's
        device. (The first :meth:`record` calls it with the losses' device.)"""
        if self._device is None:
            self._device = torch.device(device)
            self._place(self._device)
        return self._device

    def sync(self) -> None:
        """Merge what every rank recorded since the last sync (no-op outside torch.distributed).

        Each sample's loss becomes the mean of the losses ranks recorded for it since the last
        sync (normally one rank's), its epoch the latest of theirs; samples nobody recorded keep
        their value. Collective: every rank must call it at the same point.
        """
        if not is_distributed():
            return
        dist = torch.distributed
        losses, seen, dirty = self.losses, self.epoch_seen, self._dirty
        assert dirty is not None
        comm = comm_device(losses.device)
        packed = torch.stack((torch.where(dirty, losses, 0.0).double(), dirty.double())).to(comm)
        packed = torch.where(torch.isinf(packed), 1e300, packed)  # inf * 0 would give NaN
        stamps = torch.where(dirty, seen, UNSEEN).to(comm)
        dist.all_reduce(packed)
        dist.all_reduce(stamps, op=dist.ReduceOp.MAX)
        total, count = packed.to(losses.device)
        merged = (total / count.clamp(min=1)).float()
        merged = torch.where(merged > 1e38, float("inf"), merged)
        got = count > 0
        losses.copy_(torch.where(got, merged, losses))
        seen.copy_(torch.where(got, stamps.to(seen.device), seen))
        dirty.fill_(False)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """The table on CPU (``None`` entries before anything was recorded)."""
        return {
            "size": self.size,
            "losses": None if self._losses is None else self._losses.cpu(),
            "epoch_seen": None if self._epoch_seen is None else self._epoch_seen.cpu(),
            "dirty": None if self._dirty is None else self._dirty.cpu(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output onto this table's device."""
        if state["size"] != self.size:
            raise ValueError(
                f"the saved loss table covers {state['size']} samples but this one {self.size}: "
                "resume with the same dataset"
            )
        if state["losses"] is None:
            self._losses = self._epoch_seen = self._dirty = None
            return
        if self._losses is None:
            self._allocate(self.device)
        assert self._losses is not None and self._epoch_seen is not None
        assert self._dirty is not None
        self._losses.copy_(state["losses"])
        self._epoch_seen.copy_(state["epoch_seen"])
        self._dirty.copy_(state["dirty"])

    def _place(self, device: torch.device) -> None:
        if self._losses is None:
            self._allocate(device)
        else:
            assert self._epoch_seen is not None and self._dirty is not None
            self._losses = self._losses.to(device)
            self._epoch_seen = self._epoch_seen.to(device)
            self._dirty = self._dirty.to(device)

    def _allocate(self, device: torch.device) -> None:
        self._losses = torch.full((self.size,), float("inf"), device=device)
        self._epoch_seen = torch.full((self.size,), UNSEEN, dtype=torch.int64, device=device)
        self._dirty = torch.zeros(self.size, dtype=torch.bool, device=device)
