"""``TrainingMetricsRecorder``: sifting statistics through Lightning's loggers.

Importable with either Lightning distribution: the unified ``lightning`` package
(``lightning.pytorch``) or the standalone ``pytorch_lightning`` that SageMaker's smart-sifting
examples pin. The callback subclasses the ``Callback`` of every one installed, so either
``Trainer`` accepts it. Neither installed: importing this module raises ``ImportError``.
"""

from __future__ import annotations

import importlib
from typing import Any

from hasten.integrations.metrics import (
    find_pruning_sampler,
    find_sifting_loader,
    front_end_metrics,
)

__all__ = ["TrainingMetricsRecorder"]


def _callback_bases() -> tuple[type, ...]:
    bases = []
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            bases.append(importlib.import_module(name).Callback)
        except ImportError:
            continue
    if not bases:
        raise ImportError(
            "hasten's TrainingMetricsRecorder needs Lightning: install `lightning` "
            "(`pip install 'hasten[lightning]'`) or `pytorch_lightning`"
        )
    return tuple(bases)


class TrainingMetricsRecorder(*_callback_bases()):  # type: ignore[misc]
    """Logs the sifting statistics through Lightning's loggers (SageMaker's callback name).

    Every ``every_n_steps`` optimizer steps (default: the Trainer's ``log_every_n_steps``), and
    at the last batch of every epoch and of the fit whatever the step count (so a fit shorter
    than the logging interval still ends with them), it logs ``sift/keep_rate``, ``sift/samples_seen`` ... (see
    :func:`~hasten.integrations.metrics.sifting_metrics`) with ``LightningModule.log_dict``, so
    they reach every logger, ``trainer.callback_metrics`` and ``trainer.logged_metrics``. Counts
    are summed over ranks first (one small ``all_reduce``, run by every rank at the same step).
    It finds the sifting loader (or the :class:`~hasten.sifting.PruningSampler`, whose
    statistics are :func:`~hasten.integrations.metrics.pruning_metrics`) in
    ``trainer.train_dataloader``; without one it does nothing.
    When the fit ends with nothing sifted (``sift_delay`` never reached) the loader warns.

    Args:
        every_n_steps: Log every this many optimizer steps (default: ``log_every_n_steps``).
        prefix: Put before every name (default ``"sift/"``).
        prog_bar: Also show the keep rate in the progress bar.
    """

    def __init__(
        self, every_n_steps: int | None = None, prefix: str = "sift/", prog_bar: bool = False
    ) -> None:
        if every_n_steps is not None and (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, int)
            or every_n_steps < 1
        ):
            raise ValueError(f"every_n_steps must be an int >= 1 or None, got {every_n_steps!r}")
        self.every_n_steps = every_n_steps
        self.prefix = prefix
        self.prog_bar = prog_bar
        self._last_step = -1

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        every = self.every_n_steps or trainer.log_every_n_steps or 1
        # the last batch of an epoch, or of the fit, is always logged (logging from
        # on_train_epoch_end would land on the previous step's row)
        progress = getattr(getattr(trainer.fit_loop, "epoch_loop", None), "batch_progress", None)
        last = (
            batch_idx + 1 >= trainer.num_training_batches
            or bool(getattr(progress, "is_last_batch", False))  # a pruned, shorter epoch's end
            or (trainer.max_steps is not None and 0 < trainer.max_steps <= step)
        )
        if step == self._last_step or (step % every and not last):
            return
        self._log(trainer, pl_module)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        loader = find_sifting_loader(trainer.train_dataloader)
        if loader is not None:
            loader._check_delay_reached()
        sampler = find_pruning_sampler(trainer.train_dataloader)
        if sampler is not None:  # one line: what was pruned, what it saved, the guard's verdict
            sampler.report()

    def _log(self, trainer: Any, pl_module: Any) -> None:
        metrics = front_end_metrics(trainer.train_dataloader, self.prefix)
        if metrics is None:
            return
        self._last_step = trainer.global_step
        keep = f"{self.prefix}keep_rate"
        when = {"on_step": True, "on_epoch": False, "batch_size": 1}
        if self.prog_bar and keep in metrics:
            pl_module.log(keep, metrics.pop(keep), prog_bar=True, **when)
        pl_module.log_dict(metrics, **when)
