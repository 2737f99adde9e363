"""The unbiased pruning rule (InfoBatch's): drop low-loss samples at random, up-weight the rest.

A pure function with the signature of every selection policy in :mod:`hasten.sifting.policy`,
``(losses, history, generator) -> Selection``, so it serves both a stream of batches (``history``
= recent losses) and a whole dataset at once (``losses`` = every sample's stored loss,
``history`` = the same losses)::

    sel = unbiased_select(losses, history, gen, prune_ratio=0.5)
    loss = (per_sample_loss[sel.keep] * sel.weights[sel.keep]).sum() / len(per_sample_loss)

Why it is unbiased: a sample whose loss is below the threshold is kept with probability
``1 - prune_ratio`` and then weighted ``1 / (1 - prune_ratio)``; every other sample is kept with
weight 1. So for every sample ``E[keep_i * weight_i] = 1``, and the weighted sum of the kept
samples' gradients has, over the random draw, the expectation of the full sum: pruning changes
the variance of the gradient, not its mean.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hasten.sifting.policy import Selection

__all__ = ["loss_threshold", "unbiased_keep_probability", "unbiased_select"]


def loss_threshold(reference: Tensor, threshold: str | float = "mean") -> Tensor:
    """The loss below which samples count as well learned (a 0-d tensor, on ``reference``'s device).

    Args:
        reference: Past losses; non-finite values are ignored.
        threshold: ``"mean"`` (InfoBatch's rule) or a quantile in ``(0, 1)`` of the finite
            reference losses (``0.5``: the median).

    Returns:
        The threshold; ``-inf`` when ``reference`` holds no finite loss (nothing is below it).
    """
    ref = reference.detach().reshape(-1).float()
    finite = torch.isfinite(ref)
    if threshold == "mean":
        count = finite.sum()
        total = torch.where(finite, ref, 0.0).sum()
        return torch.where(count > 0, total / count.clamp(min=1), -math.inf)
    if ref.numel() == 0:
        return torch.tensor(-math.inf, device=ref.device)
    # non-finite values sort last (+inf, NaN): take the quantile among the finite prefix
    ordered = torch.sort(torch.where(finite, ref, math.inf)).values
    count = finite.sum()
    pos = ((count - 1).clamp(min=0).float() * float(threshold)).round().long()
    return torch.where(count > 0, ordered[pos], -math.inf)


def unbiased_select(
    losses: Tensor,
    history: Tensor,
    generator: torch.Generator | None = None,
    *,
    prune_ratio: float,
    threshold: str | float = "mean",
) -> Selection:
    """Prune each below-threshold sample with probability ``prune_ratio``; reweight survivors.

    Args:
        losses: 1-D tensor, one loss per sample (may hold NaN/inf: never pruned).
        history: The losses the threshold is computed from (same device).
        generator: Source of the random draws (on the losses' device).
        prune_ratio: Probability in ``[0, 1)`` of pruning a below-threshold sample.
        threshold: ``"mean"`` or a quantile in ``(0, 1)`` of ``history``; see
            :func:`loss_threshold`.

    Returns:
        A :class:`~hasten.sifting.policy.Selection` whose ``weights`` are ``1 / (1 -
        prune_ratio)`` for kept below-threshold samples and 1 elsewhere. With an empty (or
        all non-finite) history nothing is pruned.
    """
    x = losses.detach()
    low = torch.isfinite(x) & (x < loss_threshold(history, threshold).to(x.dtype))
    u = torch.rand(x.shape, generator=generator, device=x.device)
    keep = ~low | (u >= prune_ratio)
    weights = torch.where(low, 1.0 / (1.0 - prune_ratio), 1.0)
    return Selection(keep=keep, weights=weights)


def unbiased_keep_probability(
    losses: Tensor, history: Tensor, *, prune_ratio: float, threshold: str | float = "mean"
) -> Tensor:
    """The law :func:`unbiased_select` follows: each sample's probability of being kept,
    ``1 - prune_ratio`` below the threshold of ``history``, else 1."""
    x = losses.detach().float()
    low = torch.isfinite(x) & (x < loss_threshold(history, threshold))
    return torch.where(low, 1.0 - prune_ratio, 1.0)
