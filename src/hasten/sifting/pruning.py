"""Former home of :class:`~hasten.sifting.sampler.PruningSampler` (see :mod:`hasten.sifting.sampler`);
kept so that imports from here go on working."""

from __future__ import annotations

from hasten.sifting.sampler import PruningSampler, PruningStats

__all__ = ["PruningSampler", "PruningStats"]
