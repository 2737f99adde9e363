"""Which samples each epoch trains on: :class:`~hasten.sifting.PruningSampler`'s law,
for a loop that is not a torch DataLoader (Keras ``fit``). No Keras import here.

Per epoch, the sampler's own law (:func:`hasten.sifting.sampler.select_epoch`, one function for
both): the stored losses of every seen sample go through the config's rule; never-seen samples
are always kept; epochs in the final ``anneal_fraction`` keep everything; the kept indices are
shuffled, from one ``torch.Generator`` seeded as the sampler's, so for the same seed and losses
the plan is the sampler's plan (tested).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from hasten.sifting.core.rules import policy_for
from hasten.sifting.feedback import SampleLosses
from hasten.sifting.guard import Guard, guard_of, log_line, summary_line
from hasten.sifting.pruning_config import coerce_pruning_config
from hasten.sifting.sampler import PruningStats, prune_until, select_epoch

__all__ = ["EpochPlanner"]


class EpochPlanner:
    """Plans epochs from a :class:`~hasten.sifting.feedback.SampleLosses` table.

    Args:
        size: Number of samples.
        config: A pruning config (or dict), as for ``PruningSampler``.
        num_epochs: The run's epochs (needed when the config anneals).
        seed: Seed of the pruning draws and the shuffle.
        shuffle: Shuffle the kept indices.

    Attributes:
        order: This epoch's dataset indices in yield order (int64 NumPy array).
        weights: Per entry of ``order``, the loss weight (float32), or ``None`` for all ones.
        stats: :class:`~hasten.sifting.pruning.PruningStats`.
        table: The loss table :meth:`record` writes into.
    """

    def __init__(
        self,
        size: int,
        config: Any,
        *,
        num_epochs: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        self.size = size
        self.config = coerce_pruning_config(config)
        anneal = float(getattr(self.config, "anneal_fraction", 0.0))
        if num_epochs is None and anneal > 0:
            raise ValueError(
                f"{type(self.config).__name__}(anneal_fraction={anneal}) trains the last epochs "
                "on all data, so it needs the run's length: pass num_epochs=<epochs given to "
                "fit> or set anneal_fraction=0"
            )
        self._prune_until = prune_until(anneal, num_epochs)
        self.shuffle = bool(shuffle)
        self.table = SampleLosses(size, "cpu")
        self.stats = PruningStats()
        self._policy = policy_for(self.config)
        settings = guard_of(self.config)
        self.guard: Guard | None = None if settings is None else Guard(settings)
        self._reported = False
        self._generator = torch.Generator().manual_seed(seed)
        self.epoch = -1
        self.order = np.zeros(0, "int64")
        self.weights: np.ndarray | None = None
        self._fed_back = 0
        self.plan(0)

    def plan(self, epoch: int) -> None:
        """Plan ``epoch`` from the losses stored so far (a no-op if it is the current one)."""
        if epoch == self.epoch:
            return
        t0 = time.perf_counter()
        if self.epoch >= 0:
            self.stats.samples_not_fed_back += len(self.order) - self._fed_back
        self._fed_back = 0
        kept, weights = select_epoch(
            self.table.losses,
            self.table.seen,
            self._policy,
            self._generator,
            epoch < self._prune_until,
            self.shuffle,
            guard=self.guard,
            epoch=epoch,
            epoch_seen=self.table.epoch_seen,
        )
        s = self.stats
        s.epochs += 1
        s.samples_total += self.size
        s.samples_kept += len(kept)
        s.samples_audited += 0 if self.guard is None else self.guard.audited(epoch)
        s.epoch_kept_fractions.append(len(kept) / self.size)
        s.planning_seconds += time.perf_counter() - t0
        self.epoch = epoch
        self.order = kept.numpy().astype("int64")
        self.weights = (
            None if weights is None else weights.index_select(0, kept).numpy().astype("float32")
        )

    def record(self, indices: np.ndarray, losses: np.ndarray) -> None:
        """Store ``losses[k]`` as the loss of sample ``indices[k]`` in the current epoch."""
        idx = torch.from_numpy(np.asarray(indices, "int64"))
        self.table.record(idx, torch.from_numpy(np.asarray(losses, "float32")), self.epoch)
        self.stats.samples_fed_back += len(idx)
        self._fed_back += len(idx)

    def summary(self) -> str:
        """One line: what was pruned, what it saved, and the guard's verdict."""
        return summary_line(self.stats, self.guard)

    def report(self) -> str | None:
        """Log :meth:`summary` once on the ``"hasten"`` logger; ``None`` when already done."""
        if self._reported:
            return None
        self._reported = True
        line = self.summary()
        log_line(line)
        return line
