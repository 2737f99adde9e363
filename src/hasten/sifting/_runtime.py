"""What the loader needs to know about the DataLoader it wraps: its batch size, ``drop_last``,
generators and sampler. (torch.distributed: :mod:`hasten.sifting.core.dist`.)"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = [
    "get_loader_generator_states",
    "is_iterable_style",
    "loader_batch_size",
    "loader_drop_last",
    "set_loader_epoch",
    "set_loader_generator_states",
    "shuffles_globally",
]


def is_iterable_style(loader: Any) -> bool:
    """Whether short batches may come mid-epoch (iterable datasets, or no dataset known)."""
    dataset = getattr(loader, "dataset", None)
    return dataset is None or isinstance(dataset, torch.utils.data.IterableDataset)


def loader_batch_size(loader: Any) -> int | None:
    """The batch size of each batch ``loader`` yields to this process, where it can be found.

    A DataLoader's own ``batch_size``, else its batch sampler's: a DataLoader built with
    ``batch_sampler=`` (a custom one with a ``batch_size`` attribute) has ``batch_size=None``, and
    so have Accelerate's ``DataLoaderShard`` and ``DataLoaderDispatcher`` (what the Hugging Face
    Trainer hands out), whose ``BatchSamplerShard`` keeps the size; under Accelerate's
    ``split_batches`` each process gets its share of it. ``None`` when no size is found.
    """
    for owner in (loader, getattr(loader, "batch_sampler", None)):
        size = getattr(owner, "batch_size", None)
        if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
            break
    else:
        return None
    if getattr(owner, "split_batches", False):
        procs = getattr(owner, "num_processes", None)
        if procs is None:  # DataLoaderDispatcher keeps it on its state
            procs = getattr(getattr(owner, "state", None), "num_processes", 1)
        size //= max(1, int(procs))
    return size


def loader_drop_last(loader: Any) -> bool:
    """Whether ``loader`` drops its last, short batch (its batch sampler's setting, where it has
    one: a DataLoader built with ``batch_sampler=`` reports ``drop_last=False`` itself)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    return bool(getattr(batch_sampler, "drop_last", getattr(loader, "drop_last", False)))


def _loader_generators(loader: Any) -> list[torch.Generator]:
    found: list[torch.Generator] = []
    batch_sampler = getattr(loader, "batch_sampler", None)
    for owner in (
        loader,
        getattr(loader, "sampler", None),
        getattr(batch_sampler, "sampler", None),
    ):
        gen = getattr(owner, "generator", None)
        if isinstance(gen, torch.Generator) and all(gen is not g for g in found):
            found.append(gen)
    return found


def get_loader_generator_states(loader: Any) -> list[Tensor] | None:
    """States of the generators that decide the wrapped loader's order (``None``: none)."""
    gens = _loader_generators(loader)
    return [g.get_state() for g in gens] if gens else None


def set_loader_generator_states(loader: Any, states: list[Tensor] | None) -> None:
    """Put back what :func:`get_loader_generator_states` returned."""
    if states is None:
        return
    gens = _loader_generators(loader)
    if len(gens) != len(states):
        raise RuntimeError(
            f"cannot resume: the checkpoint holds {len(states)} DataLoader generator state(s) but "
            f"the wrapped loader has {len(gens)} generator(s); resume with the same loader setup"
        )
    for g, s in zip(gens, states):
        g.set_state(s)


def shuffles_globally(loader: Any) -> bool:
    """Whether the loader shuffles from the global RNG (its order cannot be replayed)."""
    sampler = getattr(loader, "sampler", None)
    return isinstance(sampler, torch.utils.data.RandomSampler) and sampler.generator is None


def set_loader_epoch(loader: Any, epoch: int) -> None:
    """``set_epoch(epoch)`` on the loader, its batch sampler and their samplers
    (``DistributedSampler``), where they have one; each object once."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    seen: set[int] = set()
    for target in (
        loader,
        batch_sampler,
        getattr(loader, "sampler", None),
        getattr(batch_sampler, "sampler", None),
    ):
        fn = getattr(target, "set_epoch", None)
        if target is not None and callable(fn) and id(target) not in seen:
            seen.add(id(target))
            fn(epoch)
