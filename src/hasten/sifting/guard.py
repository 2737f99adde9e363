"""The pruning guard: a sample is left out only when the evidence says it is learned, and
pruning backs off by itself when the evidence turns.

Every epoch-level pruning rule (:class:`~hasten.sifting.PruningSampler`, Keras'
``SiftingPyDataset``, and through them the HF ``Trainer`` and Lightning switches) is relative:
SageMaker's keeps a sample with probability ``percentile ** beta``, InfoBatch's prunes below the
mean, so each drops a share of every epoch whether or not *any* sample has been learned. The
guard sits between the rule and the plan. The rule still decides which samples are candidates;
the guard vetoes the candidates that are not safe to skip, and says why:

- **learned** (absolute criterion): a sample may be skipped only when its stored loss is at most
  ``learned_below`` times the run's first loss (the mean loss of the first samples of the first
  epoch, i.e. where the run started). With cross-entropy over ``C`` classes the first loss is
  about ``ln C``; the default 0.3 means "the true class has probability >= C ** -0.3": 0.62 of 5
  classes, 0.50 of 10.
- **budget** (in loss terms): the samples skipped may together hold at most ``loss_budget`` of
  the summed stored loss of all samples (the cheapest first), so the part of the training signal
  pruning throws away is bounded, however many samples that is.
- **warm-up**: no pruning while the loss still falls within an epoch by more than ``max_drift``
  of the first loss (the first half of the previous epoch against its second half). While it
  does, the stored losses mostly say *when* a sample was seen, not how well it is learned.
- **audit**: a random ``audit_fraction`` (at least ``min_audit``) of the skipped samples rides
  along in the epoch with loss weight 0: forwarded in the training batches (their losses come
  back through the feedback as everyone's), not trained on. At the next plan, when their mean
  loss climbed above the learned threshold (forgetting) or is not below the loss of the samples
  that were trained, pruning pauses (one epoch, then two, four ...) and the verdict says so.

The guard reads only the loss table and the previous epoch's order, once per epoch, on the host
(where the plan is made anyway): nothing in the training step. Its decisions are deterministic
given the table and the sampler's generator, so ranks agree and a resumed run plans as an
uninterrupted one. ``guard=None`` in a config leaves the rule alone (its keep-rate law exactly).

Example::

    StaleRelativePruningConfig(beta_value=1.0, max_loss_age=None)               # guarded
    StaleRelativePruningConfig(beta_value=1.0, guard=PruningGuard(loss_budget=0.2))
    StaleRelativePruningConfig(beta_value=1.0, guard=None)                      # the rule alone
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from hasten.sifting.core.fields import fraction, integer, nested, set_field
from hasten.sifting.exceptions import SiftConfigValidationException

__all__ = [
    "DEFAULT_GUARD",
    "Guard",
    "GuardState",
    "PruningGuard",
    "coerce_guard",
    "guard_of",
    "log_line",
    "summary_line",
]

logger = logging.getLogger("hasten")


@dataclass(frozen=True, kw_only=True)
class PruningGuard:
    """Settings of the pruning guard (see the module docstring); every pruning config holds one
    as its ``guard`` field (``None``: off)."""

    learned_below: float = 0.3
    """In ``(0, 1]``: a sample is a candidate only when its stored loss is at most this share of
    the run's first loss."""
    loss_budget: float = 0.1
    """In ``(0, 1]``: the skipped samples' stored losses sum to at most this share of all stored
    losses."""
    max_drift: float = 0.1
    """``>= 0``: prune only once the previous epoch's loss fell, from the first half of its last
    ``drift_window`` to the second half, by at most this share of the first loss."""
    drift_window: float = 1.0
    """In ``(0, 1]``: the share of the previous epoch, at its end, the warm-up judges (1: the
    whole epoch, its first half against its second; 0.5: its third quarter against its
    fourth, i.e. how fast the loss still fell when the epoch ended)."""
    audit_fraction: float = 0.05
    """In ``[0, 1)``: share of the skipped samples forwarded with weight 0 to check them (0: no
    audit)."""
    min_audit: int = 16
    """Audit at least this many skipped samples (or all, when fewer are skipped)."""

    def __post_init__(self) -> None:
        for name in ("learned_below", "loss_budget"):
            value = fraction(getattr(self, name), name)
            if value <= 0:
                raise SiftConfigValidationException(
                    f"{name} must be in (0, 1], got {value}: 0 would prune nothing; to switch "
                    "the guard off pass guard=None"
                )
            set_field(self, name, value)
        drift = self.max_drift
        if isinstance(drift, bool) or not isinstance(drift, (int, float)) or not drift >= 0:
            raise SiftConfigValidationException(f"max_drift must be a number >= 0, got {drift!r}")
        if not math.isfinite(drift):
            raise SiftConfigValidationException(
                f"max_drift must be finite, got {drift!r}: to switch the warm-up off pass a "
                "large number (e.g. 1.0), or guard=None for no guard at all"
            )
        set_field(self, "max_drift", float(drift))
        window = fraction(self.drift_window, "drift_window")
        if window <= 0:
            raise SiftConfigValidationException(
                f"drift_window must be in (0, 1], got {window}: the share of the previous epoch "
                "the warm-up judges"
            )
        set_field(self, "drift_window", window)
        set_field(
            self, "audit_fraction", fraction(self.audit_fraction, "audit_fraction", upper_open=True)
        )
        set_field(self, "min_audit", integer(self.min_audit, "min_audit", minimum=0))


DEFAULT_GUARD = PruningGuard()
"""The guard a pruning config gets unless it says otherwise."""


def coerce_guard(value: Any) -> PruningGuard | None:
    """A config's ``guard`` field: a :class:`PruningGuard`, a dict of its fields, or ``None``."""
    if value is None:
        return None
    if isinstance(value, (PruningGuard, Mapping)):
        return nested(value, PruningGuard, "guard")
    raise SiftConfigValidationException(
        f"guard must be a PruningGuard, a dict of its fields, or None (no guard), got "
        f"{type(value).__name__}"
    )


def guard_of(config: Any) -> PruningGuard | None:
    """The guard that protects ``config``'s rule: its ``guard`` field, or the default guard for a
    registered config class that has no such field (every rule is guarded unless switched off)."""
    if any(f.name == "guard" for f in dataclasses.fields(config)):
        return config.guard
    return DEFAULT_GUARD


@dataclass
class GuardState:
    """What the guard remembers between epochs (all of it round-trips through ``state_dict``)."""

    first_loss: float | None = None
    """The run's first loss: the mean loss of the first samples of the first epoch seen."""
    last_epoch: int = -1
    """The epoch whose order is in ``last_order``."""
    last_order: Tensor | None = None
    """That epoch's dataset indices in the order they were trained (all ranks, before sharding)."""
    audit: Tensor | None = None
    """The skipped samples that epoch forwarded with weight 0."""
    audit_stored: float = 0.0
    """Their mean stored loss when they were skipped."""
    failures: int = 0
    """Audits failed so far (the n-th pauses pruning for ``2 ** (n - 1)`` epochs)."""
    paused_until: int = -1
    """No pruning before this epoch."""
    epochs: list[dict[str, Any]] = field(default_factory=list)
    """One record per planned epoch: what the rule proposed, what the guard allowed, and why."""


class Guard:
    """The guard at work for one front-end (a sampler or Keras' planner): call :meth:`apply`
    with each pruning epoch's selection and :meth:`remember` with every epoch's order."""

    def __init__(self, settings: PruningGuard) -> None:
        self.settings = settings
        self.state = GuardState()

    # ------------------------------------------------------------------ planning

    def apply(
        self,
        epoch: int,
        losses: Tensor,
        seen: Tensor,
        epoch_seen: Tensor,
        keep: Tensor,
        weights: Tensor | None,
        generator: torch.Generator,
    ) -> tuple[Tensor, Tensor | None]:
        """The guarded ``(keep, weights)`` of a pruning epoch (CPU tensors by dataset index).

        Samples the guard does not clear are kept with weight 1, so the rule decides only among
        the cleared ones (an unbiased rule stays unbiased there); a few skipped ones are then
        kept with weight 0 as the audit."""
        g, st = self.settings, self.state
        record: dict[str, Any] = {"epoch": epoch, "rule_pruned": int((~keep).sum())}
        st.epochs.append(record)
        audit, st.audit = st.audit, None  # the previous epoch's audit, judged now
        self._learn_first_loss(losses, epoch_seen)
        verdict = self._check_audit(epoch, losses, epoch_seen, audit, record)
        if verdict is not None:
            st.failures += 1
            st.paused_until = epoch + 2 ** (st.failures - 1)
            record["verdict"], record["paused_from"] = verdict, epoch
        if st.first_loss is None:
            return self._hold(record, "no first loss to measure learning against yet", keep)
        threshold = g.learned_below * st.first_loss
        record["threshold"] = threshold
        if epoch < st.paused_until:
            why = (
                record.get("verdict")
                or f"paused after a failed audit, until epoch {st.paused_until}"
            )
            return self._hold(record, why, keep)
        drift = self._drift(losses, epoch_seen, audit)
        if drift is not None and drift[0] - drift[1] > g.max_drift * st.first_loss:
            where = (
                f"within epoch {st.last_epoch}"
                if g.drift_window >= 1.0
                else f"over the last {g.drift_window:.0%} of epoch {st.last_epoch}"
            )
            return self._hold(
                record,
                f"warming up: the loss still fell from {drift[0]:.2f} to {drift[1]:.2f} {where} "
                f"(more than {g.max_drift:.0%} of the first loss {st.first_loss:.2f})",
                keep,
            )
        finite = seen & torch.isfinite(losses)
        learned = finite & (losses <= threshold)
        cleared = learned.clone()
        total = float(losses[finite].sum()) if bool(finite.any()) else 0.0
        idx = learned.nonzero().reshape(-1)
        if len(idx):  # the budget: the cheapest learned samples up to loss_budget of the total
            order = torch.argsort(losses[idx], stable=True)
            within = torch.cumsum(losses[idx][order].double(), 0) <= g.loss_budget * total
            cleared[idx[order[~within]]] = False
        record["learned"] = int(learned.sum())
        record["cleared"] = int(cleared.sum())
        if not bool(cleared.any()):
            lowest = float(losses[finite].min()) if bool(finite.any()) else math.inf
            return self._hold(
                record,
                f"no sample is learned yet: none has a loss <= {threshold:.2f} "
                f"({g.learned_below:.0%} of the first loss {st.first_loss:.2f}; the lowest is "
                f"{lowest:.2f})",
                keep,
            )
        keep = keep | ~cleared
        if weights is not None:
            weights = torch.where(cleared, weights, 1.0)
        skipped = (~keep).nonzero().reshape(-1)
        st.audit, st.audit_stored = None, 0.0
        if len(skipped) and g.audit_fraction > 0:
            k = min(len(skipped), max(math.ceil(g.audit_fraction * len(skipped)), g.min_audit))
            audit = skipped[torch.randperm(len(skipped), generator=generator)[:k]]
            keep = keep.clone()
            keep[audit] = True
            weights = torch.ones(len(keep)) if weights is None else weights.clone()
            weights[audit] = 0.0
            st.audit, st.audit_stored = audit.sort().values, float(losses[audit].mean())
        record["pruned"] = int((~keep).sum())
        record["audited"] = 0 if st.audit is None else len(st.audit)
        record["reason"] = (
            f"pruned {record['pruned']} learned samples (loss <= {threshold:.2f}, within "
            f"{g.loss_budget:.0%} of the summed loss)"
        )
        return keep, weights

    def remember(self, epoch: int, order: Tensor, pruning: bool) -> None:
        """Note epoch ``epoch``'s trained order (the plan's, all ranks) for the next plan."""
        st = self.state
        if not pruning or not st.epochs or st.epochs[-1]["epoch"] != epoch:
            st.epochs.append({"epoch": epoch, "pruned": 0, "reason": "full data"})
            st.audit = None
        st.last_epoch, st.last_order = epoch, order.clone()

    def _hold(self, record: dict[str, Any], reason: str, keep: Tensor) -> tuple[Tensor, None]:
        record.update(pruned=0, reason=reason)
        self.state.audit = None
        return torch.ones_like(keep), None

    def _learn_first_loss(self, losses: Tensor, epoch_seen: Tensor) -> None:
        st = self.state
        if st.first_loss is not None or st.last_order is None or not len(st.last_order):
            return
        head = st.last_order[: max(1, min(len(st.last_order), max(32, len(st.last_order) // 50)))]
        fresh = head[(epoch_seen[head] == st.last_epoch) & torch.isfinite(losses[head])]
        if len(fresh):
            st.first_loss = float(losses[fresh].mean())

    def _drift(
        self, losses: Tensor, epoch_seen: Tensor, audit: Tensor | None
    ) -> tuple[float, float] | None:
        """Mean loss of the first and the second half of the last ``drift_window`` of the
        previous epoch (its fed-back, trained samples), or ``None`` when either half has none."""
        st = self.state
        order = st.last_order
        if order is None or len(order) < 2:
            return None
        trained = torch.ones(len(order), dtype=torch.bool)
        if audit is not None:
            trained &= ~torch.isin(order, audit)
        trained &= (epoch_seen[order] == st.last_epoch) & torch.isfinite(losses[order])
        start = len(order) - max(2, round(self.settings.drift_window * len(order)))
        order, trained = order[max(0, start) :], trained[max(0, start) :]
        half = len(order) // 2
        first, second = order[:half][trained[:half]], order[half:][trained[half:]]
        if not len(first) or not len(second):
            return None
        return float(losses[first].mean()), float(losses[second].mean())

    def _check_audit(
        self,
        epoch: int,
        losses: Tensor,
        epoch_seen: Tensor,
        audit: Tensor | None,
        record: dict[str, Any],
    ) -> str | None:
        """The previous epoch's audit: a verdict when it failed, else ``None``."""
        st = self.state
        order = st.last_order
        if audit is None or order is None or st.first_loss is None:
            return None
        back = audit[epoch_seen[audit] == st.last_epoch]
        if len(back) < max(1, len(audit) // 2):
            return None  # too few audited losses came back to judge
        rest = order[~torch.isin(order, audit)]
        rest = rest[epoch_seen[rest] == st.last_epoch]
        audited = float(losses[back].mean())
        record["audit_loss"] = audited
        threshold = self.settings.learned_below * st.first_loss
        if audited > threshold:
            return (
                f"pruning paused from epoch {epoch}: the pruned samples' loss climbed back from "
                f"{st.audit_stored:.2f} to {audited:.2f} (audit of {len(back)}), above the "
                f"{threshold:.2f} a learned sample may have (forgetting)"
            )
        if len(rest):
            kept = float(losses[rest].mean())
            record["kept_loss"] = kept
            if audited >= kept:
                return (
                    f"pruning paused from epoch {epoch}: pruned samples' loss {audited:.2f} was "
                    f"not below the kept samples' {kept:.2f} (audit of {len(back)})"
                )
        return None

    # ------------------------------------------------------------------ reporting

    def audited(self, epoch: int) -> int:
        """Samples audited in ``epoch`` (0 unless it is the epoch planned last)."""
        records = self.state.epochs
        if not records or records[-1]["epoch"] != epoch:
            return 0
        return int(records[-1].get("audited", 0))

    def verdict(self) -> str:
        """One sentence: what the guard did over the run."""
        st = self.state
        pruned = [r for r in st.epochs if r.get("pruned", 0) > 0]
        failed = [r["verdict"] for r in st.epochs if "verdict" in r]
        audits = [r for r in st.epochs if "audit_loss" in r and "verdict" not in r]
        if failed:
            head = f"guard: {failed[0]}"  # who decided, as in every other verdict
            if len(failed) > 1:
                head += f" ({len(failed)} audits failed)"
            last_pause = max(r["paused_from"] for r in st.epochs if "paused_from" in r)
            if pruned and pruned[-1]["epoch"] > last_pause:
                head += f"; pruning resumed in epoch {pruned[-1]['epoch']}"
            return head
        if not pruned:
            holds = [r for r in st.epochs if r.get("reason") not in (None, "full data")]
            if not holds:
                return "guard: no epoch pruned (full data only)"
            return f"guard: nothing pruned; last check (epoch {holds[-1]['epoch']}): {holds[-1]['reason']}"
        line = (
            f"guard: pruned in epoch(s) {', '.join(str(r['epoch']) for r in pruned)} "
            f"(learned: loss <= {pruned[-1]['threshold']:.2f}, "
            f"{self.settings.learned_below:.0%} of the first loss {st.first_loss:.2f})"
        )
        if audits:
            a = audits[-1]
            line += f"; last audit: pruned samples' loss {a['audit_loss']:.2f}"
            if "kept_loss" in a:
                line += f" against the kept samples' {a['kept_loss']:.2f}"
            line += ", safe"
        return line

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Any]:
        from hasten.sifting.core.state import to_state

        return to_state(self.state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        from hasten.sifting.core.state import from_state

        self.state = from_state(GuardState, dict(state))


def summary_line(stats: Any, guard: Guard | None, scored: bool = False) -> str:
    """The end-of-run line of a pruning front-end: what was pruned, what it saved (forward +
    backward per sample, scoring forwards at a third of that), and the guard's verdict."""
    total = stats.samples_total
    if not total:
        return "hasten sifting: no epoch planned yet"
    kept = stats.samples_kept
    compute = kept + (stats.samples_scored / 3.0 if scored else 0.0)
    audited = getattr(stats, "samples_audited", 0)
    per_epoch = ", ".join(f"{f:.0%}" for f in stats.epoch_kept_fractions)
    line = (
        f"hasten sifting: trained on {kept} of {total} samples over {stats.epochs} epoch(s) "
        f"(kept per epoch {per_epoch}"
        + (f"; {audited} of them audited with weight 0" if audited else "")
        + f"), saving {1 - compute / total:.0%} of the forward + backward compute"
        + (f" ({stats.samples_scored} samples rescored)" if stats.samples_scored else "")
        + "; "
    )
    return line + ("guard off: the rule alone decided" if guard is None else guard.verdict())


def log_line(line: str) -> None:
    """Log ``line`` at INFO on the ``"hasten"`` logger, on stderr unless logging is set up (as
    the compiler's report does): a plain script shows it; where logging is configured it goes
    to the application's handlers. Silence it with
    ``logging.getLogger("hasten").setLevel(logging.WARNING)``."""
    if not logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    logger.info(line)
