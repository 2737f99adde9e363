"""Small, dependency-free statistics for benchmark results.

Timing samples are skewed (a step is never faster than the hardware allows but can be slowed by
anything else on the machine), so benchmarks quote medians with the 20th and 80th percentiles;
accuracies over seeds are quoted as mean ± standard deviation and ± standard error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["MeanStd", "Summary", "break_even_step", "mean_std", "percentile", "summarize"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation between order statistics.

    Matches ``numpy.percentile(values, q)`` (its default "linear" method).

    Raises:
        ValueError: for an empty sequence or ``q`` outside [0, 100].
    """
    if not values:
        raise ValueError("percentile of an empty sequence; record at least one sample")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q={q} is outside [0, 100]")
    xs = sorted(float(v) for v in values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    """Robust summary of repeated measurements (for example seconds per step).

    Attributes:
        n: Number of samples.
        median: 50th percentile.
        p20: 20th percentile.
        p80: 80th percentile.
        mean: Arithmetic mean.
        min: Smallest sample.
        max: Largest sample.
    """

    n: int
    median: float
    p20: float
    p80: float
    mean: float
    min: float
    max: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def summarize(values: Sequence[float]) -> Summary:
    """Median, p20/p80, mean, min and max of ``values``.

    Raises:
        ValueError: for an empty sequence.
    """
    if not values:
        raise ValueError("cannot summarize an empty sequence; record at least one sample")
    xs = [float(v) for v in values]
    return Summary(
        n=len(xs),
        median=percentile(xs, 50),
        p20=percentile(xs, 20),
        p80=percentile(xs, 80),
        mean=sum(xs) / len(xs),
        min=min(xs),
        max=max(xs),
    )


@dataclass(frozen=True)
class MeanStd:
    """Mean with sample standard deviation (ddof=1) and standard error of the mean.

    ``std`` and ``sem`` are 0.0 for a single value (there is no spread to estimate).
    """

    n: int
    mean: float
    std: float
    sem: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.mean:.4g} ± {self.std:.2g} (sem {self.sem:.2g}, n={self.n})"


def mean_std(values: Sequence[float]) -> MeanStd:
    """Mean, sample standard deviation and standard error of ``values``.

    Raises:
        ValueError: for an empty sequence.
    """
    if not values:
        raise ValueError("mean of an empty sequence; record at least one value")
    xs = [float(v) for v in values]
    n = len(xs)
    mean = sum(xs) / n
    if n == 1:
        return MeanStd(1, mean, 0.0, 0.0)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return MeanStd(n, mean, std, std / math.sqrt(n))


def break_even_step(
    first_s: float, step_s: float, base_first_s: float, base_step_s: float
) -> int | None:
    """The first step ``n`` at which a candidate's time to step ``n`` (first call + ``n - 1``
    steady steps) is no more than the baseline's; ``None`` if it never gets there."""
    if first_s <= base_first_s and step_s <= base_step_s:
        return 1
    if step_s >= base_step_s:
        return None
    # first + (n-1) * step <= base_first + (n-1) * base_step
    return 1 + max(0, math.ceil((first_s - base_first_s) / (base_step_s - step_s) - 1e-12))
