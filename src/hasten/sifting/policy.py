"""Selection policies: pure functions from per-sample losses to a keep mask.

A policy has one signature, ``(losses, history, generator) -> Selection``:

- ``losses``: 1-D tensor, one loss per sample of the incoming batch (any float dtype, may hold
  NaN/inf);
- ``history``: 1-D tensor of earlier losses on the same device (see
  :class:`~hasten.sifting.history.LossHistory`), not yet including ``losses``;
- ``generator``: the :class:`torch.Generator` (on the losses' device) all randomness comes from.

It returns a :class:`Selection`: a boolean keep mask and optional per-sample weights (for
reweighting policies, where kept samples stand in for dropped ones). Policies never read device
memory back to the host and never touch global RNGs, so they are cheap to call per batch and
reproducible. The same functions serve people with their own loop::

    sel = relative_probabilistic_select(losses, history.values(), gen, beta_value=1.0)
    batch = batch[sel.keep]

:func:`policy_for` maps a config object to its policy through the one registry of rules,
:mod:`hasten.sifting.core.rules`, where new rules register (config class, policy, front-ends).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from hasten.sifting.core import rules as _rules
from hasten.sifting.history import percentile_of

__all__ = [
    "Selection",
    "SiftPolicy",
    "policy_for",
    "register_policy",
    "relative_keep_probability",
    "relative_probabilistic_select",
]


@dataclass(frozen=True)
class Selection:
    """What a policy decided for one incoming batch."""

    keep: Tensor
    """Boolean mask, one entry per sample: train on it (True) or sift it out."""

    weights: Tensor | None = None
    """Optional float weight per sample for the training loss (``None``: all ones)."""


class SiftPolicy(Protocol):
    """``(losses, history, generator) -> Selection``; see the module docstring."""

    def __call__(
        self, losses: Tensor, history: Tensor, generator: torch.Generator | None
    ) -> Selection: ...


def relative_probabilistic_select(
    losses: Tensor,
    history: Tensor,
    generator: torch.Generator | None = None,
    *,
    beta_value: float,
) -> Selection:
    """SageMaker's rule: keep each sample with probability ``p ** beta_value``.

    ``p`` is the sample's loss percentile among ``history`` (mid-rank, see
    :func:`~hasten.sifting.history.percentile_of`); with an empty history every sample is kept.
    Non-finite losses are always kept, so a diverging loss reaches the training step where the
    user sees it. On average ``1 / (1 + beta_value)`` of the samples are kept when new losses are
    distributed like the history.
    """
    p = percentile_of(losses, history)
    u = torch.rand(p.shape, generator=generator, device=p.device)
    keep = torch.where(torch.isfinite(losses), u < p.pow_(beta_value), True)
    return Selection(keep=keep)


def relative_keep_probability(losses: Tensor, history: Tensor, *, beta_value: float) -> Tensor:
    """The law :func:`relative_probabilistic_select` follows: each sample's probability of being
    kept, ``p ** beta_value`` (1 for a non-finite loss)."""
    p = percentile_of(losses, history).pow_(beta_value)
    return torch.where(torch.isfinite(losses), p, 1.0)


def register_policy(config_cls: type, factory: Callable[[Any], SiftPolicy]) -> None:
    """Deprecated: use :func:`hasten.sifting.core.rules.register_rule` (name, config and policy
    in one call). Registers ``factory(config) -> policy`` for configs of class ``config_cls``."""
    _rules._register_half(config_cls, policy=factory)


def policy_for(config: Any) -> SiftPolicy:
    """The policy function for a config object (:func:`hasten.sifting.core.rules.policy_for`).

    Raises:
        SiftConfigValidationException: when no rule is registered for the config's class.
    """
    return _rules.policy_for(config)
