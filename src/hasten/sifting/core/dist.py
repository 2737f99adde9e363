"""torch.distributed as sifting sees it: whether it is active, which rank, and the collectives.

One place answers "is torch.distributed active, which rank": every sifting module (and the
integrations) asks here. Outside ``torch.distributed`` (or with a world of one) every function
is a no-op that answers for a single process, so the front-ends never branch on it themselves.
Collectives run on the CPU under gloo and on the current CUDA device under NCCL.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = [
    "all_gather_ints",
    "all_gather_objects",
    "comm_device",
    "gather_counts",
    "is_distributed",
    "rank",
    "world_size",
]


def _initialized() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized()


def is_distributed() -> bool:
    """Whether this process is one of several ranks of an initialized ``torch.distributed``."""
    return _initialized() and torch.distributed.get_world_size() > 1


def world_size() -> int:
    """Number of ranks (1 outside ``torch.distributed``)."""
    return torch.distributed.get_world_size() if _initialized() else 1


def rank() -> int:
    """This process's rank (0 outside ``torch.distributed``)."""
    return torch.distributed.get_rank() if _initialized() else 0


def comm_device(device: torch.device | None = None) -> torch.device:
    """Where collectives run: ``device`` (default: the current CUDA device) under NCCL, else
    the CPU."""
    if _initialized() and torch.distributed.get_backend() == "nccl":
        if device is not None and device.type == "cuda":
            return device
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_counts(counts: Tensor) -> list[list[int]]:
    """Every rank's 1-D ``counts`` as host ints, by rank; one host sync (plus one
    ``all_gather`` under ``torch.distributed``)."""
    if not is_distributed():
        return [counts.tolist()]  # HOST SYNC
    dist = torch.distributed
    t = counts.to(comm_device(counts.device))
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.stack(out).tolist()  # HOST SYNC


def all_gather_ints(value: int) -> list[int]:
    """``value`` of every rank, by rank (``[value]`` outside ``torch.distributed``)."""
    return [row[0] for row in gather_counts(torch.tensor([value], dtype=torch.int64))]


def all_gather_objects(value: Any) -> list[Any]:
    """A picklable ``value`` of every rank, by rank (``[value]`` outside)."""
    if not is_distributed():
        return [value]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, value)
    return out
