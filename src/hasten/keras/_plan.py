"""Which samples each epoch trains on: :class:`~hasten.sifting.pruning.PruningSampler`'s law,
for a loop that is not a torch DataLoader (Keras ``fit``). No Keras import here.

Per epoch: the stored losses of every seen sample go through the config's policy (the pure
functions of :mod:`hasten.sifting.policy` / :mod:`hasten.sifting.unbiased`); never-seen samples
are always kept; epochs in the final ``anneal_fraction`` keep everything; the kept indices are
shuffled. The random draws come from one ``torch.Generator`` in the same order as the sampler's,
so for the same seed and losses the plan is the sampler's plan (tested).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

import hasten.sifting.pruning  # noqa: F401  (registers the pruning policies)
from hasten.sifting.feedback import SampleLosses
from hasten.sifting.policy import policy_for
from hasten.sifting.pruning import PruningStats
from hasten.sifting.pruning_config import coerce_pruning_config

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
        full = 0 if num_epochs is None else math.ceil(anneal * num_epochs - 1e-9)
        self._prune_until = math.inf if num_epochs is None else num_epochs - full
        self.shuffle = bool(shuffle)
        self.table = SampleLosses(size, "cpu")
        self.stats = PruningStats()
        self._policy = policy_for(self.config)
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
        seen = self.table.seen
        weights = None
        if epoch < self._prune_until and bool(seen.any()):
            scores = self.table.losses
            reference = scores[seen & torch.isfinite(scores)]
            sel = self._policy(scores, reference, self._generator)
            keep = sel.keep | ~seen  # never-seen samples are always kept
            if sel.weights is not None:
                weights = torch.where(seen, sel.weights.float(), 1.0)
            kept = keep.nonzero().reshape(-1)
        else:
            kept = torch.arange(self.size)
        if self.shuffle:
            kept = kept[torch.randperm(len(kept), generator=self._generator)]
        s = self.stats
        s.epochs += 1
        s.samples_total += self.size
        s.samples_kept += len(kept)
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
