"""Sifting statistics as flat ``{name: number}`` dicts for trainer loggers.

Both trainer callbacks (Hugging Face's :class:`~hasten.integrations.transformers.SiftingCallback`
and Lightning's :class:`~hasten.integrations.lightning.TrainingMetricsRecorder`) log what
:func:`sifting_metrics` (a :class:`~hasten.sifting.SiftingDataloader`) or :func:`pruning_metrics`
(a :class:`~hasten.sifting.PruningSampler`) returns; :func:`front_end_metrics` picks one. Under ``torch.distributed`` the sample counts are summed over
ranks with one ``all_reduce`` (so ``keep_rate`` is the global rate, not rank 0's); call it on every
rank at the same step, as trainers do with their own logging.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import torch

from hasten.sifting import PruningSampler, SiftingDataloader
from hasten.sifting.core import dist as _dist

T = TypeVar("T")

__all__ = [
    "find_pruning_sampler",
    "find_sifting_loader",
    "front_end_metrics",
    "pruning_metrics",
    "sifting_metrics",
]

_COUNTS = (
    "num_orig_samples_seen",
    "num_orig_samples_scored",
    "num_orig_samples_kept",
    "num_orig_samples_sifted_out",
    "num_samples_yielded",
    "num_samples_dropped_at_epoch_end",
    "num_nonfinite_losses",
)


def find_sifting_loader(obj: Any) -> SiftingDataloader | None:
    """The :class:`SiftingDataloader` in ``obj``: the loader itself, a wrapper holding it as
    ``.loader`` (:class:`~hasten.integrations.epochs.SiftedEpochs`), or one inside a mapping or
    sequence of loaders (Lightning's combined loaders). ``None`` when there is none."""

    def pick(o: Any) -> SiftingDataloader | None:
        for candidate in (o, getattr(o, "loader", None)):
            if isinstance(candidate, SiftingDataloader):
                return candidate
        return None

    return _find(obj, pick)


def find_pruning_sampler(obj: Any) -> PruningSampler | None:
    """The :class:`PruningSampler` behind ``obj``: the sampler itself, or the sampler of a
    loader (``.sampler``, ``.batch_sampler.sampler``, accelerate's
    ``.batch_sampler.batch_sampler.sampler``), also inside a mapping or sequence of loaders
    (Lightning's combined loaders). ``None`` when there is none."""

    def pick(o: Any) -> PruningSampler | None:
        batch_sampler = getattr(o, "batch_sampler", None)
        for candidate in (
            o,
            getattr(o, "sampler", None),
            getattr(batch_sampler, "sampler", None),
            getattr(getattr(batch_sampler, "batch_sampler", None), "sampler", None),
        ):
            if isinstance(candidate, PruningSampler):
                return candidate
        return None

    return _find(obj, pick)


def _find(obj: Any, pick: Callable[[Any], T | None], depth: int = 0) -> T | None:
    """``pick(obj)``, else the first hit inside a combined loader, mapping or sequence (3 deep)."""
    found = pick(obj)
    if found is not None or depth > 3 or obj is None:
        return found
    flattened = getattr(obj, "flattened", None)  # lightning's CombinedLoader
    if isinstance(flattened, list):
        obj = flattened
    if isinstance(obj, Mapping):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for item in obj:
            found = _find(item, pick, depth + 1)
            if found is not None:
                return found
    return None


def front_end_metrics(obj: Any, prefix: str = "sift/") -> dict[str, float] | None:
    """:func:`sifting_metrics` or :func:`pruning_metrics` of the sifting loader or pruning
    sampler found in ``obj`` (a trainer's train dataloader); ``None`` when it holds neither.
    Collective under ``torch.distributed`` when one is found (see those functions)."""
    loader = find_sifting_loader(obj)
    if loader is not None:
        return sifting_metrics(loader, prefix)
    sampler = find_pruning_sampler(obj)
    if sampler is not None:
        return pruning_metrics(sampler, prefix)
    return None


def pruning_metrics(
    sampler: PruningSampler, prefix: str = "sift/", *, all_ranks: bool = True
) -> dict[str, float]:
    """A :class:`PruningSampler`'s statistics, flat, with ``prefix`` on each name.

    Names: ``keep_rate`` (samples kept / samples a full-data run of the epochs planned so far
    would have used: the share of data trained on; absent before the first epoch),
    ``epoch_keep_rate`` (the same for the current epoch), ``samples_seen`` (dataset size times
    epochs planned), ``samples_kept``, ``samples_audited`` (skipped samples the guard forwarded
    with weight 0; all three counted over all ranks by the sampler itself),
    ``samples_fed_back``, ``samples_not_fed_back``, ``samples_scored`` (summed over ranks when
    ``all_ranks``), ``data_epoch`` (the epoch planned or in progress) and ``planning_seconds``
    (this rank's time planning epochs, scoring included).

    Args:
        sampler: The pruning sampler.
        prefix: Put before every name.
        all_ranks: Sum the per-rank counts over ``torch.distributed`` ranks (one ``all_reduce``;
            every rank must call this at the same point). Ignored outside ``torch.distributed``.
    """
    s = sampler.stats
    mine = [float(s.samples_fed_back), float(s.samples_not_fed_back), float(s.samples_scored)]
    if all_ranks:
        mine = _sum_over_ranks(mine)
    fed_back, not_fed_back, scored = mine
    out = {
        "samples_seen": float(s.samples_total),
        "samples_kept": float(s.samples_kept),
        "samples_audited": float(s.samples_audited),
        "samples_fed_back": fed_back,
        "samples_not_fed_back": not_fed_back,
        "samples_scored": scored,
        "data_epoch": float(sampler.epoch if sampler.epoch is not None else 0),
        "planning_seconds": float(s.planning_seconds),
    }
    if s.kept_fraction is not None:
        out["keep_rate"] = float(s.kept_fraction)
    if s.epoch_kept_fractions:
        out["epoch_keep_rate"] = float(s.epoch_kept_fractions[-1])
    return {f"{prefix}{k}": v for k, v in out.items()}


def sifting_metrics(
    loader: SiftingDataloader, prefix: str = "sift/", *, all_ranks: bool = True
) -> dict[str, float]:
    """The loader's statistics, flat, with ``prefix`` on each name.

    Names: ``keep_rate`` (kept / scored, over all ranks when ``all_ranks``; absent before any
    scoring), ``samples_seen``, ``samples_scored``, ``samples_kept``, ``samples_sifted_out``,
    ``samples_dropped`` (kept but never yielded: ``drop_last`` or rank balancing), ``nonfinite_losses``
    (all summed over ranks when ``all_ranks``), and this rank's ``data_epoch`` (data passes begun,
    counting from 0), ``scoring_share`` and ``sifting_share`` (fractions of the loader's wall time
    spent in the scoring forward and in sifting's own work).

    Args:
        loader: The sifting loader.
        prefix: Put before every name.
        all_ranks: Sum the counts over ``torch.distributed`` ranks (one ``all_reduce``; every rank
            must call this at the same point). Ignored outside ``torch.distributed``.
    """
    s = loader.stats
    counts = [float(getattr(s, name)) for name in _COUNTS]
    if all_ranks:
        counts = _sum_over_ranks(counts)
    seen, scored, kept, sifted_out, _, dropped, bad = counts
    out = {
        "samples_seen": seen,
        "samples_scored": scored,
        "samples_kept": kept,
        "samples_sifted_out": sifted_out,
        "samples_dropped": dropped,
        "nonfinite_losses": bad,
        "data_epoch": float(max(loader.data_epoch, 0)),
    }
    if scored > 0:
        out["keep_rate"] = (scored - sifted_out) / scored
    for name in ("scoring_share", "sifting_share"):
        value = getattr(s, name)
        if value is not None:
            out[name] = float(value)
    return {f"{prefix}{k}": v for k, v in out.items()}


def _sum_over_ranks(values: Iterable[float]) -> list[float]:
    values = list(values)
    if not _dist.is_distributed():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=_dist.comm_device())
    torch.distributed.all_reduce(t)
    return t.tolist()  # HOST SYNC: once per logging step
