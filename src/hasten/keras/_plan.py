"""Which samples each epoch trains on: :class:`~hasten.sifting.PruningSampler`'s plan, for a
loop that is not a torch DataLoader (Keras ``fit``). No Keras import here.

The planner *is* a pruning sampler over the dataset's indices, on the CPU, one rank: the same
law (:func:`hasten.sifting.sampler.select_epoch`), guard, statistics, checkpointable state and
end-of-run line, written once; sampler epoch ``e`` becomes Keras epoch ``e`` as every adapter's
pruned pass does (:func:`hasten.sifting.core.epochs.pruned_pass`). This class only hands Keras
the epoch's order and weights as NumPy arrays and records losses by index: for the same seed
and losses the plan is the sampler's plan (tested).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hasten.sifting.core.epochs import pruned_pass
from hasten.sifting.sampler import PruningSampler, PruningStats

__all__ = ["EpochPlanner"]


class EpochPlanner:
    """Plans epochs with a :class:`~hasten.sifting.PruningSampler` over ``size`` indices.

    Args:
        size: Number of samples.
        config: A pruning config (or dict), as for ``PruningSampler``.
        num_epochs: The run's epochs (needed when the config anneals).
        seed: Seed of the pruning draws and the shuffle.
        shuffle: Shuffle the kept indices.

    Attributes:
        sampler: The pruning sampler that plans.
        order: This epoch's dataset indices in yield order (int64 NumPy array).
        weights: Per entry of ``order``, the loss weight (float32), or ``None`` for all ones.
        stats: :class:`~hasten.sifting.sampler.PruningStats`.
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
        try:
            self.sampler = PruningSampler(
                size,
                config,
                num_epochs=num_epochs,
                seed=seed,
                shuffle=shuffle,
                num_replicas=1,
                rank=0,
                device="cpu",
            )
        except ValueError as err:
            if "num_epochs" in str(err) and num_epochs is None:
                raise ValueError(
                    f"{err}; for Keras: pass num_epochs=<epochs given to fit>"
                ) from err
            raise
        self.size = size
        self.config = self.sampler.config
        self.shuffle = bool(shuffle)
        self.table = self.sampler.table
        self.epoch = -1
        self.order = np.zeros(0, "int64")
        self.weights: np.ndarray | None = None
        self.plan(0)

    @property
    def stats(self) -> PruningStats:
        return self.sampler.stats

    @property
    def guard(self) -> Any:
        return self.sampler.guard

    def plan(self, epoch: int) -> None:
        """Plan ``epoch`` from the losses stored so far (a no-op if it is the current one)."""
        if epoch == self.epoch:
            return
        order, weights = pruned_pass(self.sampler, epoch)  # feedback by index from here on
        self.epoch = epoch
        self.order = order.numpy().astype("int64")
        self.weights = None if weights is None else weights.numpy().astype("float32")

    def record(self, indices: np.ndarray, losses: np.ndarray) -> None:
        """Store ``losses[k]`` as the loss of sample ``indices[k]`` in the current epoch."""
        idx = torch.from_numpy(np.asarray(indices, "int64"))
        self.sampler.update(torch.from_numpy(np.asarray(losses, "float32")), indices=idx)

    def summary(self) -> str:
        """One line: what was pruned, what it saved, and the guard's verdict."""
        return self.sampler.summary()

    def report(self) -> str | None:
        """Log :meth:`summary` once on the ``"hasten"`` logger; ``None`` when already done."""
        return self.sampler.report()
