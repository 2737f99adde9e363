"""The loader's log lines: progress every few batches (SageMaker's ``key: value`` form, see
``docs/sifting.md``) and, for pilot runs, each scored batch's losses."""

from __future__ import annotations

import logging
from typing import Any

from torch import Tensor

from hasten.sifting.stats import STAGES, SiftingStats

__all__ = ["SAGEMAKER_LOGGER", "Progress", "log_batch", "log_target", "logger"]

logger = logging.getLogger("hasten.sifting")
SAGEMAKER_LOGGER = "hasten.smart_sifting.dataloader.sift_dataloader"
"""The logger name SageMaker's ``smart_sifting.dataloader.sift_dataloader`` module logs under,
beneath hasten's prefix (see :func:`log_target`)."""
_sagemaker_logger = logging.getLogger(SAGEMAKER_LOGGER)


class Progress:
    """When the last progress line was logged, and the stage times it covered."""

    def __init__(self) -> None:
        self._last = (0, dict.fromkeys(STAGES, 0.0))  # scored batches, stage seconds
        self._logged_sifted = False  # the first sifted batch was logged
        self._last_out = -1  # num_batches_out at the last progress line

    def line(
        self,
        every: int,
        s: SiftingStats,
        epoch: int,
        out_batch_size: int,
        buffered: int,
        force: bool = False,
    ) -> None:
        """A progress line: for the first sifted batch, every ``every`` yielded batches and
        (``force``) at the end of a data pass (``every`` 0: never)."""
        if not every:
            return
        first = not self._logged_sifted and s.num_batches_scored > 0
        if s.num_batches_out == self._last_out or not (
            force or first or s.num_batches_out % every == 0
        ):
            return
        log = log_target()
        if not log.isEnabledFor(logging.INFO):
            return
        self._logged_sifted = self._logged_sifted or s.num_batches_scored > 0
        self._last_out = s.num_batches_out
        last_scored, last_stage = self._last
        scored = s.num_batches_scored - last_scored
        lat = {k: 1e3 * (v - last_stage[k]) / max(scored, 1) for k, v in s.stage_seconds.items()}
        self._last = (s.num_batches_scored, dict(s.stage_seconds))
        rate = s.keep_rate
        # SageMaker's `key: value` form, so its metric regexes (`num_orig_samples_seen: (\S+)`,
        # `Batch size for next sifted batch: (\S+)` ...) read these lines; no value is followed
        # by punctuation
        log.info(
            "sifting step %d (epoch %d): num_orig_samples_seen: %d num_orig_samples_kept: %d "
            "num_orig_samples_scored: %d keep_rate: %s Batch size for next sifted batch: %d "
            "buffered: %d | latency ms/batch over %d scored batches: %s",
            s.num_batches_out,
            epoch,
            s.num_orig_samples_seen,
            s.num_orig_samples_kept,
            s.num_orig_samples_scored,
            "n/a" if rate is None else f"{rate:.4f}",
            out_batch_size,
            buffered,
            scored,
            " ".join(f"{k}: {v:.3f}" for k, v in lat.items()),
        )


def log_batch(batches_in: int, losses: Tensor, keep: Tensor) -> None:
    """The losses of one scored batch and which were kept (``log_batch_data``: pilot runs)."""
    log = log_target()
    if not log.isEnabledFor(logging.INFO):
        return
    values = losses.detach().float().cpu()  # host copy: log_batch_data is for pilot runs
    mask = keep.cpu()
    # SageMaker's metric definitions scrape relevance_values and relevance_values_kept (the
    # kept samples' values); kept is hasten's 0/1 mask, one entry per sample
    log.info(
        "sifting batch %d: relevance_values: %s relevance_values_kept: %s kept: %s",
        batches_in,
        [round(v, 4) for v in values.tolist()],
        [round(v, 4) for v in values[mask].tolist()],
        [int(k) for k in mask.tolist()],
    )


def log_target() -> logging.Logger:
    """The logger for progress lines: ``hasten.sifting``, or :data:`SAGEMAKER_LOGGER` when that
    one (or a parent of it beneath ``hasten.smart_sifting``) was configured, with a level, a
    handler or ``propagate=False``, as a client written for SageMaker does. One record either
    way, so a root handler never prints a line twice."""
    lg: Any = _sagemaker_logger
    while isinstance(lg, logging.Logger) and lg.name.startswith("hasten.smart_sifting"):
        if lg.level != logging.NOTSET or lg.handlers or lg.disabled or not lg.propagate:
            return _sagemaker_logger
        lg = lg.parent
    return logger
