"""Zero-extra-forward pruning policies (``hasten.sifting.PruningSampler``) in the sift experiment.

Each policy plugs into :func:`hasten.bench.training.train_iter` as a :class:`Policy`: the sampler
plans an epoch from the losses the training step fed back (``epoch_reads`` plans, so the learning
rate knows the epoch's length), the loader loads only the kept samples, and ``loss`` feeds the
step's per-sample losses back, returning the (reweighted) loss to backpropagate. A policy with a
scorer rescored stale samples at the start of an epoch; those forwards are counted as scoring
compute (1 per sample), exactly as the SageMaker rule's.

Families (named in :data:`hasten.bench.sift_experiment.POLICY_FAMILIES`, imported lazily):

==============  ===============================================================================
``unbiased``    InfoBatch's rule at the settings in :data:`UNBIASED_SETTINGS`
``stale``       SageMaker's rule on stored losses at the settings in :data:`STALE_SETTINGS`:
                fed back only (``max_loss_age=None``), or rescoring losses older than 2 epochs
                with a bf16 scorer in batches of 1024
``tuned``       SageMaker's rule on fed-back losses at :data:`TUNED_SETTINGS`: issue 6's best
                setting and the one tuned for issue 11's targets on validation splits
==============  ===============================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from hasten.bench import _hasten_api
from hasten.bench.training import Batch, Policy, PolicyContext

__all__ = [
    "STALE_SETTINGS",
    "TUNED_SETTINGS",
    "UNBIASED_SETTINGS",
    "PrunePolicy",
    "ScorerSettings",
    "stale_family",
    "tuned_family",
    "unbiased_family",
]

UNBIASED_SETTINGS: tuple[dict[str, Any], ...] = (
    {"prune_ratio": 0.5, "threshold": "mean", "anneal_fraction": 0.125},
    {"prune_ratio": 0.7, "threshold": "mean", "anneal_fraction": 0.05},
)
"""InfoBatch-rule settings the ``unbiased`` family runs: InfoBatch's defaults, and the setting
closest to half the compute that did best on a validation split (``benchmarks/results/
sift_policies.md`` says how it was tuned)."""


@dataclass(frozen=True)
class ScorerSettings:
    """How a pruning policy rescores stale samples (``hasten.sifting.Scorer`` arguments)."""

    batch_size: int = 1024
    autocast_dtype: str | None = "bfloat16"

    def describe(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "autocast_dtype": self.autocast_dtype}


STALE_SETTINGS: tuple[tuple[dict[str, Any], ScorerSettings | None], ...] = (
    ({"beta_value": 1.0, "max_loss_age": None, "anneal_fraction": 0.0}, None),
    ({"beta_value": 1.0, "max_loss_age": 2, "anneal_fraction": 0.0}, ScorerSettings()),
    ({"beta_value": 0.5, "max_loss_age": None, "anneal_fraction": 0.0}, None),
)
"""SageMaker-rule-on-stored-losses settings the ``stale`` family runs (its own betas: the\nexperiment's ``betas`` are the streaming rule's)."""


TUNED_SETTINGS: tuple[dict[str, Any], ...] = (
    {"beta_value": 1.0, "max_loss_age": None, "anneal_fraction": 0.0},
    {"beta_value": 0.7, "max_loss_age": None, "anneal_fraction": 0.0},
)
"""The ``tuned`` family: SageMaker's rule on fed-back losses at β = 1 (issue 6's best; on BBC
News's validation split the only β tried that saves >= 40 %; on mnist1d-large's, β 1 and 0.8
save >= 40 % and are indistinguishable on 2 seeds) and β = 0.7 (the best on MNIST-1D's
validation split at >= 40 % saved: -0.34 ± 0.19 points vs full data, +0.66 ± 0.24 over the
full-data curve, 6 seeds). Annealing (the last 15 % of the epochs on all data, with β 1 or 1.5
before it) and rescoring stale losses did no better there
(``benchmarks/results/sift-policies-tuning.json``, key ``issue11``)."""


class _Rows(Dataset[Batch]):
    """The training tensors as ``(x, y, index)`` batches, for the scorer (not counted as reads)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> Batch:
        return self.x[i], self.y[i], torch.tensor(i)

    def __getitems__(self, indices: list[int]) -> Batch:
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return self.x[idx], self.y[idx], idx


def _identity(batch: Batch) -> Batch:
    return batch


class _PruneRun:
    def __init__(self, sampler: Any, loader: DataLoader) -> None:
        self.sampler = sampler
        self.loader = loader

    def batches(self, loader: DataLoader, epoch: int) -> DataLoader:
        self.sampler.set_epoch(epoch)  # planned already by epoch_reads: a no-op
        return self.loader

    def loss(self, losses: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.sampler.update(losses)  # attribution by position, as a user's loop does

    def epoch_reads(self, epoch: int, dataset_size: int) -> int:
        self.sampler.set_epoch(epoch)
        return len(self.sampler)

    def report(self) -> dict[str, Any]:
        """What the sampler left out over the epochs it planned (the last one counted whole,
        even when the run stopped in it), and its end-of-run line with the guard's verdict."""
        s = self.sampler.stats
        return {
            "epochs_planned": s.epochs,
            "samples_planned": s.samples_total,
            "samples_kept": s.samples_kept,
            "samples_left_out": s.samples_total - s.samples_kept,
            "samples_audited": s.samples_audited,
            "kept_per_epoch": list(s.epoch_kept_fractions),
            "summary": self.sampler.summary(),
        }


@dataclass(frozen=True)
class PrunePolicy:
    """A pruning config run through ``PruningSampler``, optionally with a scorer.

    Attributes:
        label: The run's name in results.
        config: A pruning config dict (with its ``"policy"`` key).
        scorer: Rescore stale samples with these settings (``None``: no scoring forwards).
    """

    label: str
    config: dict[str, Any]
    scorer: ScorerSettings | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.label

    def describe(self) -> dict[str, Any]:
        return {
            "policy": "pruning",
            "config": dict(self.config),
            "scorer": None if self.scorer is None else self.scorer.describe(),
            **self.extra,
        }

    def start(self, ctx: PolicyContext) -> _PruneRun:
        scorer = None
        if self.scorer is not None:
            dtype = self.scorer.autocast_dtype
            inner = _hasten_api.scorer(
                ctx.model,
                _Rows(ctx.dataset.x, ctx.dataset.y),
                ctx.loss_fn,
                batch_size=self.scorer.batch_size,
                collate_fn=_identity,
                autocast_dtype=None if dtype is None else getattr(torch, dtype),
                device=ctx.device,
            )

            def scorer(indices: torch.Tensor) -> torch.Tensor:
                ctx.count_scored(len(indices))
                return inner(indices)

        sampler = _hasten_api.pruning_sampler(
            len(ctx.dataset),
            self.config,
            num_epochs=ctx.epochs,
            seed=ctx.seed,
            scorer=scorer,
        )
        return _PruneRun(sampler, ctx.make_loader(sampler))


def _label(prefix: str, settings: dict[str, Any]) -> str:
    parts = [prefix]
    if "prune_ratio" in settings:
        parts.append(f"r{settings['prune_ratio']:g}")
    t = settings.get("threshold", "mean")
    if t != "mean":
        parts.append(f"q{t:g}")
    a = settings.get("anneal_fraction", 0.0)
    if a:
        parts.append(f"a{a:g}")
    return "-".join(parts)


def unbiased_family(config: Any, full_steps: int) -> list[Policy]:
    """InfoBatch's rule at each of :data:`UNBIASED_SETTINGS`."""
    return [
        PrunePolicy(_label("unbiased", s), {"policy": "unbiased", **s}) for s in UNBIASED_SETTINGS
    ]


def stale_family(config: Any, full_steps: int) -> list[Policy]:
    """SageMaker's rule on stored losses at each of :data:`STALE_SETTINGS`."""
    return _stale_policies(STALE_SETTINGS)


def tuned_family(config: Any, full_steps: int) -> list[Policy]:
    """SageMaker's rule on fed-back losses at each of :data:`TUNED_SETTINGS`."""
    return _stale_policies(tuple((s, None) for s in TUNED_SETTINGS))


def _stale_policies(
    settings_list: tuple[tuple[dict[str, Any], ScorerSettings | None], ...],
) -> list[Policy]:
    out: list[Policy] = []
    for settings, scorer in settings_list:
        age = settings["max_loss_age"]
        label = f"stale-b{settings['beta_value']:g}-" + ("fed" if age is None else f"age{age}")
        if scorer is not None and scorer.autocast_dtype:
            label += f"-{scorer.autocast_dtype.replace('bfloat16', 'bf16')}"
        if settings.get("anneal_fraction"):
            label += f"-a{settings['anneal_fraction']:g}"
        out.append(PrunePolicy(label, {"policy": "stale_relative", **settings}, scorer))
    return out
