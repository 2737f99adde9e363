"""Loss history: a ring buffer of recent losses, and the percentile of new losses against it.

Everything stays on the losses' device and is vectorised: adding a batch is at most two slice
copies, ranking a batch is one sort of the history plus two ``searchsorted`` calls. The number of
losses held is tracked on the host from tensor shapes, so nothing here reads device memory.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["LossHistory", "percentile_of"]


def percentile_of(losses: Tensor, reference: Tensor) -> Tensor:
    """The percentile (in ``[0, 1]``) of each loss among ``reference`` values.

    Ties count half (mid-rank), so a loss equal to every reference value sits at 0.5 and a batch
    of identical losses is neither all kept nor all dropped. An empty reference gives 1.0 (no
    evidence that a sample is easy). NaN ranks above every number, as in ``torch.sort``.

    Args:
        losses: 1-D tensor of new losses.
        reference: 1-D tensor of past losses, any order, same device.

    Returns:
        Float tensor shaped like ``losses``.
    """
    x = losses.detach().float().contiguous()  # no-ops for float32; bf16/fp16 rank in float32
    n = reference.numel()
    if n == 0:
        return torch.ones_like(x)
    ref = torch.sort(reference.detach().float()).values
    below = torch.searchsorted(ref, x, side="left")
    not_above = torch.searchsorted(ref, x, side="right")
    return (below + not_above) * (0.5 / n)


class LossHistory:
    """The last ``capacity`` losses, in a ring buffer on the device of the losses added.

    Example::

        history = LossHistory(capacity=500)
        p = percentile_of(losses, history.values())  # rank the new batch ...
        history.add(losses)                          # ... then remember it
    """

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self._buffer: Tensor | None = None
        self._pos = 0  # next slot to write
        self._size = 0  # slots filled
        self.total_added = 0

    def __len__(self) -> int:
        return self._size

    @property
    def device(self) -> torch.device | None:
        """Device of the buffer (``None`` until the first :meth:`add`)."""
        return None if self._buffer is None else self._buffer.device

    def values(self, device: torch.device | None = None) -> Tensor:
        """The losses held (oldest slot first is not guaranteed), a view where possible."""
        if self._buffer is None:
            return torch.empty(0, device=device)
        out = self._buffer[: self._size]
        return out if device is None else out.to(device)

    def add(self, losses: Tensor) -> None:
        """Append a 1-D batch of losses, overwriting the oldest once full.

        Non-finite losses (NaN, ±inf) are stored as +inf: they rank above every finite loss.
        """
        inf = float("inf")
        x = torch.nan_to_num(losses.detach().reshape(-1).float(), nan=inf, neginf=inf)
        k = x.numel()
        if k == 0:
            return
        if self._buffer is None:
            self._buffer = torch.empty(self.capacity, dtype=torch.float32, device=x.device)
        elif self._buffer.device != x.device:
            self._buffer = self._buffer.to(x.device)
        self.total_added += k
        cap = self.capacity
        if k >= cap:  # only the newest `cap` survive; write them in ring order
            x, skipped = x[-cap:], k - cap
            self._pos = (self._pos + skipped) % cap
            k = cap
        first = min(k, cap - self._pos)
        self._buffer[self._pos : self._pos + first] = x[:first]
        if first < k:
            self._buffer[: k - first] = x[first:]
        self._pos = (self._pos + k) % cap
        self._size = min(cap, self._size + k)

    def state_dict(self) -> dict[str, Any]:
        """Buffer contents (on CPU) and positions."""
        return {
            "capacity": self.capacity,
            "values": None if self._buffer is None else self._buffer[: self._size].cpu(),
            "pos": self._pos,
            "size": self._size,
            "total_added": self.total_added,
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device | None = None) -> None:
        """Restore what :meth:`state_dict` returned (onto ``device`` if given)."""
        if state["capacity"] != self.capacity:
            raise ValueError(
                f"loss history capacity {state['capacity']} in the state does not match "
                f"loss_history_length={self.capacity}: resume with the same config"
            )
        values = state["values"]
        self._buffer = None
        if values is not None:
            self._buffer = torch.empty(self.capacity, dtype=torch.float32, device=device)
            self._buffer[: values.numel()] = values.to(self._buffer.device)
        self._pos, self._size = int(state["pos"]), int(state["size"])
        self.total_added = int(state["total_added"])
