"""Counters and timings of a :class:`~hasten.sifting.loader.SiftingDataloader`, readable any time."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["STAGES", "SiftingStats"]

STAGES = (
    "transform",
    "calculate_relevance_values",
    "should_sift",
    "sift",
    "accumulate",
    "reverse_transform",
)
"""The loader's stages, named as in SageMaker's latency log lines (see ``docs/sifting.md``)."""


@dataclass
class SiftingStats:
    """What the loader has done since it was created (or restored from a ``state_dict``).

    Sample counts are in original samples. Times are host wall-clock seconds from
    ``time.perf_counter``; on CUDA a stage's time is its launch time, except that the one host
    sync per batch (in ``should_sift``) waits for the scoring forward to finish.
    """

    num_orig_samples_seen: int = 0
    """Samples the wrapped loader produced."""
    num_orig_samples_scored: int = 0
    """Samples whose loss was computed (all but those passed through during the delay)."""
    num_orig_samples_kept: int = 0
    """Samples sent on towards training: kept by the policy, plus those passed through during
    the delay (SageMaker's ``num_orig_samples_kept``)."""
    num_orig_samples_sifted_out: int = 0
    """Scored samples the policy dropped."""
    num_samples_dropped_at_epoch_end: int = 0
    """Kept samples never yielded: the last partial batch under ``drop_last=True``, or rows
    above the common batch count across distributed ranks."""
    num_nonfinite_losses: int = 0
    """Scored samples whose loss was NaN or ±inf (always kept)."""
    num_batches_in: int = 0
    """Batches taken from the wrapped loader (including those passed through)."""
    num_batches_scored: int = 0
    """Batches scored."""
    num_batches_out: int = 0
    """Batches yielded to the training loop (including those passed through)."""
    num_samples_yielded: int = 0
    """Samples in the batches yielded."""
    load_seconds: float = 0.0
    """Time spent waiting for the wrapped loader (including batches skipped on resume)."""
    stage_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    """Total time per stage (see :data:`STAGES`)."""
    wall_seconds: float = 0.0
    """Wall time while iterating: sifting, loading and the training loop's own work between
    batches."""

    @property
    def keep_rate(self) -> float | None:
        """Fraction of scored samples the policy kept (``None`` before any scoring)."""
        scored = self.num_orig_samples_scored
        return None if scored == 0 else (scored - self.num_orig_samples_sifted_out) / scored

    @property
    def scoring_seconds(self) -> float:
        """Time in the scoring forward (``calculate_relevance_values``)."""
        return self.stage_seconds["calculate_relevance_values"]

    @property
    def sifting_seconds(self) -> float:
        """Time in every stage but the scoring forward: sifting's own overhead."""
        return sum(self.stage_seconds.values()) - self.scoring_seconds

    @property
    def scoring_share(self) -> float | None:
        """Fraction of :attr:`wall_seconds` spent scoring (``None`` before any time passed)."""
        return None if self.wall_seconds <= 0 else self.scoring_seconds / self.wall_seconds

    @property
    def sifting_share(self) -> float | None:
        """Fraction of :attr:`wall_seconds` spent in sifting's own stages (not scoring)."""
        return None if self.wall_seconds <= 0 else self.sifting_seconds / self.wall_seconds

    def stage_latency_ms(self) -> dict[str, float]:
        """Mean milliseconds per scored batch for each stage."""
        n = max(self.num_batches_scored, 1)
        return {k: 1e3 * v / n for k, v in self.stage_seconds.items()}

    def as_dict(self) -> dict[str, Any]:
        """Counters, times and the derived rates as a plain dict (for logs and JSON)."""
        out = dataclasses.asdict(self)
        out.update(
            keep_rate=self.keep_rate,
            scoring_seconds=self.scoring_seconds,
            sifting_seconds=self.sifting_seconds,
            scoring_share=self.scoring_share,
            sifting_share=self.sifting_share,
            stage_latency_ms=self.stage_latency_ms(),
        )
        return out

    def load_dict(self, data: dict[str, Any]) -> None:
        """Restore counters from :meth:`as_dict` output (derived keys are ignored)."""
        for f in dataclasses.fields(self):
            if f.name in data:
                value = data[f.name]
                setattr(self, f.name, dict(value) if isinstance(value, dict) else value)
