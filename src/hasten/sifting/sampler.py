"""``PruningSampler``: decides which samples to load each epoch from the losses the training step
already computed, and turns those per-sample losses into the (reweighted) loss to backpropagate.

The loop, with the sampler's hook points::

    sampler = PruningSampler(train_set, UnbiasedPruningConfig(prune_ratio=0.5), num_epochs=E)
    loader = DataLoader(train_set, batch_size=B, sampler=sampler)       # any workers, collate
    for epoch in range(E):
        sampler.set_epoch(epoch)        # plan the epoch: read the stored losses (one host read),
                                        #   [score stale samples: a Scorer pass], apply the policy,
                                        #   shuffle the kept indices, shard them across ranks
        for x, y in loader:             # only the kept samples are loaded
            losses = F.cross_entropy(model(x), y, reduction="none")    # the step's own forward
            loss = sampler.update(losses)   # store each loss under its sample (a scatter on the
                                            #   losses' device, no host sync) and return the
                                            #   weighted mean: mean(weight_i * loss_i)
            loss.backward(); opt.step(); opt.zero_grad()

``update`` attributes losses by position: the k-th loss fed back in an epoch belongs to the k-th
index the sampler yielded (a DataLoader keeps its sampler's order, with or without workers). That
holds when every batch's losses are fed back, once, in order; pass ``indices=`` (the dataset
indices of the batch's samples) when the loop cannot promise that. Each call is checked against
the batch it belongs to before anything is stored (see :meth:`PruningSampler.update`), so a
wrong-length or repeated feedback raises at that call instead of writing losses onto the wrong
samples. The batches are the DataLoader's: the sampler reads their size and ``drop_last`` from
the ``BatchSampler`` that draws its indices (the DataLoader's own, or one passed as its
``batch_sampler``), so the k-th ``update`` must bring exactly the k-th batch's losses, from the
first batch of the epoch on. When something else groups the indices, pass ``batch_size=``
(otherwise the first update's length is taken as the batch size).

Never-seen samples are always kept, so the first epoch trains on all data and fills the table.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sized
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import BatchSampler, Sampler
from torch.utils.data import dataloader as _dataloader

from hasten.sifting.core.dist import all_gather_objects, is_distributed, world_size
from hasten.sifting.core.dist import rank as this_rank
from hasten.sifting.core.state import TRANSIENT, from_state, to_state
from hasten.sifting.feedback import SampleLosses
from hasten.sifting.guard import Guard, guard_of, log_line, summary_line
from hasten.sifting.policy import SiftPolicy, policy_for
from hasten.sifting.pruning_config import coerce_pruning_config

__all__ = ["PruningSampler", "PruningStats", "prune_until", "select_epoch"]

_STATE_VERSION = 2  # 2: the shuffle has a generator of its own (1: one for both)
_PRUNING_SEED_SALT = 0x5EED_D12A  # the pruning draws' generator: seed ^ this


@dataclass
class PruningStats:
    """What a :class:`PruningSampler` has done: how much data it saved, and what it cost.

    Fractions are of *all* data: ``kept_fraction`` 0.6 means the run loaded and trained on 60 %
    of the samples a full-data run of the same epochs would have.
    """

    epochs: int = 0
    """Epochs planned."""
    samples_total: int = 0
    """Dataset size times epochs planned: what full-data training would have used."""
    samples_kept: int = 0
    """Samples kept over the epochs planned (all ranks, before padding for equal shards)."""
    samples_scored: int = 0
    """Samples given a scoring forward by the scorer (rescoring stale losses)."""
    samples_audited: int = 0
    """Skipped samples the guard's audit forwarded with loss weight 0 (part of
    ``samples_kept``: they cost a forward and backward like the others)."""
    samples_fed_back: int = 0
    """Per-sample losses received through :meth:`PruningSampler.update` (this rank)."""
    samples_not_fed_back: int = 0
    """Samples yielded to this rank whose loss never came back before the next epoch was
    planned (the last partial batch under ``drop_last=True``, or steps that skipped
    ``update``); their stored losses stay as they were."""
    epoch_kept_fractions: list[float] = field(default_factory=list)
    """Per planned epoch, the fraction of all samples kept."""
    planning_seconds: float = 0.0
    """Time spent planning epochs (syncing, reading losses, the policy, shuffling)."""
    scoring_seconds: float = 0.0
    """Time spent in the scorer (part of ``planning_seconds``)."""

    @property
    def kept_fraction(self) -> float | None:
        """Samples kept / samples a full-data run would have used (``None`` before any epoch)."""
        return self.samples_kept / self.samples_total if self.samples_total else None

    def as_dict(self) -> dict[str, Any]:
        """All fields plus ``kept_fraction``, for logs and JSON."""
        return {**dataclasses.asdict(self), "kept_fraction": self.kept_fraction}


@dataclass
class _Plan:
    """One epoch's plan; the fields not marked transient round-trip through ``state_dict()``."""

    epoch: int
    pruning: bool
    order: Tensor  # this rank's indices for the epoch, int64 on CPU
    weights: Tensor | None  # aligned with order; None: all ones
    started: bool = False
    cursor: int = 0  # samples fed back so far this epoch
    # indices taken from this epoch's iterator (by the DataLoader, prefetch included)
    drawn: int = field(default=0, metadata=TRANSIENT)
    len_read_after: bool = field(
        default=False, metadata=TRANSIENT
    )  # len() was read after the epoch was drawn
    exhausted: bool = field(
        default=False, metadata=TRANSIENT
    )  # the DataLoader drew every index of the epoch
    batch: int | None = field(
        default=None, metadata=TRANSIENT
    )  # samples per batch: batch_size=, the DataLoader's, or the first update's
    batch_from: str = field(default="", metadata=TRANSIENT)  # where `batch` came from, for errors
    drop_last: bool = field(default=False, metadata=TRANSIENT)  # the DataLoader's, when known
    in_order: bool = field(default=True, metadata=TRANSIENT)  # batches come back in draw order
    start: int = field(default=0, metadata=TRANSIENT)  # where this iteration of the epoch began
    _on: dict[str, Tensor] = field(default_factory=dict, repr=False, metadata=TRANSIENT)

    def on(self, name: str, device: torch.device) -> Tensor:
        """``order`` or ``weights`` on ``device``, copied once per epoch."""
        t = self._on.get(name)
        if t is None or t.device != device:
            src = self.order if name == "order" else self.weights
            assert src is not None
            t = self._on[name] = src.to(device)
        return t


class PruningSampler(Sampler[int]):
    """Samples a dataset's indices each epoch, leaving out samples a pruning policy drops.

    Use it as a DataLoader's ``sampler`` (it shuffles; do not pass ``shuffle=True``) and feed the
    training step's per-sample losses back through :meth:`update`, which returns the loss to
    backpropagate. See the module docstring for the loop and ``docs/sifting.md`` for schedules,
    the HF Trainer and Lightning.

    Args:
        data_source: The dataset (anything with ``len``) or its length.
        config: :class:`~hasten.sifting.pruning_config.UnbiasedPruningConfig`,
            :class:`~hasten.sifting.pruning_config.StaleRelativePruningConfig`, or an equivalent
            dict with a ``"policy"`` key.
        num_epochs: Epochs the run will train; needed when the config anneals (trains on all
            data for its last ``anneal_fraction`` of epochs).
        seed: Seeds the sampler's two generators: one shuffles, one draws the pruning rule's
            (and the guard's) random numbers, so the data order does not depend on how many
            draws the rule took. With nothing pruned, epoch ``e``'s order is the ``e``-th
            ``torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))``: a
            full-data run shuffled that way sees the same batches until the first pruned
            epoch (paired comparisons). Under ``torch.distributed`` every rank must use the
            same seed (checked).
        shuffle: Shuffle the kept indices each epoch (otherwise ascending order).
        scorer: Scores stale samples for configs with ``max_loss_age`` (a
            :class:`~hasten.sifting.scoring.Scorer` or any ``fn(indices) -> losses``). Without
            one, stale losses are reused as they are.
        num_replicas: Number of ranks sharing the data (default: the ``torch.distributed`` world
            size, else 1). Every rank gets the same number of indices per epoch.
        rank: This rank (default: the ``torch.distributed`` rank, else 0).
        device: Where the loss table lives (default: the device of the first losses fed back).
        batch_size: Samples per batch: every :meth:`update` without ``indices`` must bring
            exactly one batch of losses (the last of an epoch may be short). Default: the
            ``batch_size`` of the DataLoader that iterates the sampler (read from its
            ``BatchSampler``, with its ``drop_last``); pass it when something else groups the
            indices into batches, else it is taken from each epoch's first update. A value
            that differs from the DataLoader's raises when the DataLoader starts the epoch.

    Attributes:
        stats: A :class:`PruningStats`; ``stats.kept_fraction`` is the share of data used.
        table: The :class:`~hasten.sifting.feedback.SampleLosses` the feedback writes into.
    """

    def __init__(
        self,
        data_source: Sized | int,
        config: Any,
        *,
        num_epochs: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        scorer: Callable[[Tensor], Tensor] | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        device: torch.device | str | None = None,
        batch_size: int | None = None,
    ) -> None:
        super().__init__()
        size = data_source if isinstance(data_source, int) else _length(data_source)
        if isinstance(size, bool) or size < 1:
            raise ValueError(f"the dataset must hold at least one sample, got length {size}")
        self.config = coerce_pruning_config(config)
        anneal = float(getattr(self.config, "anneal_fraction", 0.0))
        if num_epochs is not None and (
            isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1
        ):
            raise ValueError(f"num_epochs must be a positive int or None, got {num_epochs!r}")
        if num_epochs is None and anneal > 0:
            raise ValueError(
                f"{type(self.config).__name__}(anneal_fraction={anneal}) trains the last "
                "epochs on all data, so the sampler needs the run's length: pass "
                "PruningSampler(..., num_epochs=<epochs>) or set anneal_fraction=0"
            )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(f"batch_size must be an int >= 1 or None, got {batch_size!r}")
        if scorer is not None and not callable(scorer):
            raise TypeError(f"scorer must be callable (indices -> losses), got {scorer!r}")
        world, me = _world(num_replicas, rank)
        self.size = size
        self.num_epochs = num_epochs
        self.seed = seed
        self.shuffle = bool(shuffle)
        self.scorer = scorer
        self.batch_size = batch_size
        self.num_replicas, self.rank = world, me
        self.table = SampleLosses(size, device)
        self.stats = PruningStats()
        self._policy: SiftPolicy = policy_for(self.config)
        settings = guard_of(self.config)
        self.guard: Guard | None = None if settings is None else Guard(settings)
        self._reported = False
        self._prune_until = prune_until(anneal, num_epochs)
        self._generator = torch.Generator().manual_seed(seed ^ _PRUNING_SEED_SALT)
        self._shuffle_generator = torch.Generator().manual_seed(seed)
        self._plan: _Plan | None = None
        self._weight_table: Tensor | None = None  # weights by dataset index, for indices=
        self._resume = False
        self._seed_checked = False
        self._warned_no_feedback = False
        self._warned_no_set_epoch = False
        self._last_losses: weakref.ref[Tensor] | None = None  # the previous update's losses

    # ------------------------------------------------------------------ sampler protocol

    def set_epoch(self, epoch: int) -> None:
        """Plan ``epoch`` now, from the losses stored so far (a no-op if it is already planned).

        Call it before each epoch, after the previous epoch's last :meth:`update`. Under
        ``torch.distributed`` it is a collective (the ranks merge their losses): call it on every
        rank, as with ``DistributedSampler``. Without it, each iteration plans the next epoch.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        if self._plan is not None and self._plan.epoch == epoch:
            return
        self._plan = self._make_plan(epoch)

    def __len__(self) -> int:
        """Indices this rank gets in the epoch being iterated, or else in the next iteration's.

        Exact before the first epoch (planning epoch 0), during an epoch, after
        :meth:`set_epoch`, and after an epoch whose every batch was fed back: then the next
        epoch is planned here, as the next iteration (or ``set_epoch(epoch + 1)``) would plan
        it, so ``len(loader)`` read between epochs is the next epoch's even without
        ``set_epoch`` (after the last of ``num_epochs``, nothing more is planned: it stays the
        last epoch's). Under ``torch.distributed`` planning is a collective, which ``len()``
        never runs: call :meth:`set_epoch` before each epoch there (a warning says so once
        when a stale length was read). Epochs differ in length: for learning-rate schedules
        see ``docs/sifting.md``.
        """
        if self._plan is None:
            self._plan = self._make_plan(0)
        plan = self._plan
        if plan.exhausted:  # every index of the epoch was drawn
            within = self.num_epochs is None or plan.epoch + 1 < self.num_epochs
            if within and _fed_back_all(plan) and not is_distributed():
                plan = self._plan = self._make_plan(plan.epoch + 1)  # the next iteration's epoch
            else:  # stale if an iteration follows
                plan.len_read_after = True
        return len(plan.order)

    def __iter__(self) -> Iterator[int]:
        # how the DataLoader batches the indices, read off its BatchSampler (the caller of iter)
        batching = _batching_of(self, sys._getframe(1))
        told = self.batch_size
        if batching is not None and told is not None and batching.size != told:
            raise ValueError(
                f"PruningSampler(batch_size={told}), but the DataLoader that iterates it makes "
                f"batches of {batching.size}: update() checks each batch's losses against the "
                f"batch size, so pass the DataLoader's (batch_size={batching.size}) or leave "
                "batch_size=None (the sampler reads it from the DataLoader)"
            )
        plan = self._plan
        if self._resume and plan is not None and plan.started and plan.cursor < len(plan.order):
            start = plan.cursor  # restored mid-epoch: the samples whose loss never came back
        else:
            if plan is None:
                plan = self._plan = self._make_plan(0)
            elif plan.started:
                old = plan
                plan = self._plan = self._make_plan(plan.epoch + 1)
                if old.len_read_after and len(plan.order) != len(old.order):
                    self._warn_stale_len(old, plan)
            start = 0
        self._resume = False
        plan.started = True
        plan.exhausted = False
        plan.start = start
        if batching is not None:
            plan.batch, plan.drop_last = batching.size, batching.drop_last
            plan.in_order = batching.in_order
            plan.batch_from = f"the DataLoader's batch_size={batching.size}"
        else:
            plan.batch, plan.drop_last, plan.in_order = told, False, True
            plan.batch_from = "" if told is None else f"PruningSampler(batch_size={told})"
        return _draw(plan, start)

    def _warn_stale_len(self, old: _Plan, new: _Plan) -> None:
        if self._warned_no_set_epoch:
            return
        self._warned_no_set_epoch = True
        warnings.warn(
            f"PruningSampler: set_epoch() was not called after epoch {old.epoch}, so len() "
            f"reported that epoch's {len(old.order)} indices, but this iteration is epoch "
            f"{new.epoch} with {len(new.order)}: a progress bar or schedule sized from len() is "
            "off. Call sampler.set_epoch(epoch) before each epoch (it plans the epoch, and len() "
            "is then exact); this warning is shown once",
            RuntimeWarning,
            stacklevel=3,
        )

    # ------------------------------------------------------------------ feedback

    def update(self, losses: Tensor, indices: Tensor | None = None) -> Tensor:
        """Record the training step's per-sample losses; return the loss to backpropagate.

        Args:
            losses: One loss per sample of the batch (``reduction="none"``), with grad.
            indices: The batch's dataset indices. Default: the next ``len(losses)`` indices this
                sampler yielded in the current epoch (right when every batch is fed back once,
                in order).

        Returns:
            ``mean(weight_i * losses_i)`` over the batch: the policy's weights (1 for samples
            an unbiased policy did not down-sample, ``1 / (1 - prune_ratio)`` for the kept
            low-loss ones; all 1 for other policies and in full-data epochs).

        Raises:
            ValueError: ``losses`` is not 1-D, or ``indices`` does not match it; without
                ``indices``: ``losses`` is not the length of the next batch the DataLoader
                yielded (the message says which batch and its length), or the DataLoader has
                ``in_order=False`` (its batches come back in no fixed order).
            RuntimeError: no epoch is being iterated, or more losses came back than the
                sampler yielded this epoch (or than the batches a ``drop_last`` DataLoader
                yields).
        """
        plan = self._check_update(losses, indices)  # raises before anything is stored
        n = losses.shape[0]
        device = self.table.place(losses.device)
        weights: Tensor | None = None
        if indices is None:
            c = plan.cursor
            idx = plan.on("order", device)[c : c + n]
            if plan.weights is not None:
                weights = plan.on("weights", device)[c : c + n]
            if plan.batch is None:  # nothing says how the indices are batched: the first update
                plan.batch = n
                plan.batch_from = f"the epoch's first update, of {n} losses"
        else:
            idx = torch.as_tensor(indices).reshape(-1).to(device, torch.int64, non_blocking=True)
            if plan.weights is not None:
                weights = self._weights_by_index(plan, device).index_select(0, idx)
        plan.cursor += n
        self.table.record(idx, losses, plan.epoch)
        self.stats.samples_fed_back += n
        self._last_losses = weakref.ref(losses)
        if (
            not self._reported
            and self.num_epochs is not None
            and plan.epoch + 1 >= self.num_epochs
            and _fed_back_all(plan)
        ):
            self.report()  # the run's last epoch is over: say what happened, once
        if weights is None:
            return losses.mean()
        return (losses * weights.to(losses.dtype)).mean()

    def _check_update(self, losses: Any, indices: Any) -> _Plan:
        """The plan ``update(losses, indices)`` writes into, after checking the call against
        the batch it belongs to; raises, naming what was expected, before any state changes."""
        if not isinstance(losses, Tensor) or losses.ndim != 1:
            raise ValueError(
                f"update() needs one loss per sample (a 1-D tensor; use reduction='none'), got "
                f"{getattr(losses, 'shape', type(losses).__name__)}"
            )
        if not losses.is_floating_point():
            raise TypeError(
                f"update() needs floating-point losses, got dtype {losses.dtype}: pass the "
                "training step's per-sample losses (e.g. F.cross_entropy(logits, y, "
                "reduction='none')), not labels or counts"
            )
        if losses.device.type == "meta":
            raise ValueError(
                "update() got losses on the meta device (no data): the model was not "
                "materialized; call model.to_empty(device=...) and load its weights first"
            )
        plan = self._plan
        if plan is None or not plan.started:
            raise RuntimeError(
                "update() was called before the sampler was iterated: use it as the DataLoader's "
                "sampler and call update() with the losses of the batches that loader yields"
            )
        last = None if self._last_losses is None else self._last_losses()
        if last is losses:
            raise RuntimeError(
                "update() got the same losses tensor as the previous call: each batch's losses "
                "must be fed back once (call update() once per training step and batch)"
            )
        n = losses.shape[0]
        if indices is not None:
            count = torch.as_tensor(indices).numel()
            if count != n:
                raise ValueError(
                    f"indices holds {count} entries but losses {n}: pass the dataset "
                    "index of every sample of the batch"
                )
            return plan
        if not plan.in_order:
            raise ValueError(
                "update() without indices= matches losses to samples by position, but the "
                "DataLoader has in_order=False: its workers hand batches back in the order they "
                "finish, not the order they were drawn. Pass update(losses, indices=<the batch's "
                "dataset indices>), or build the DataLoader with in_order=True"
            )
        c = plan.cursor
        left = len(plan.order) - c
        if n > left:
            raise RuntimeError(
                f"update() received {c + n} losses this epoch but the sampler yielded only "
                f"{len(plan.order)} indices to this rank: feed back each batch's losses "
                "once, or pass indices=<the batch's dataset indices>"
            )
        batch = plan.batch
        if batch is not None and plan.drop_last and left < batch:
            raise RuntimeError(
                f"update() received {n} losses, but every batch of epoch {plan.epoch} was fed "
                f"back already: the DataLoader drops the epoch's last {left} samples "
                "(drop_last=True) and yields no batch for them. Feed back each batch's losses "
                "once, or pass indices=<the batch's dataset indices>"
            )
        number = c // batch + 1 if batch else 1
        where = f"batch {number} of epoch {plan.epoch} (from sample {c} of the epoch)"
        if batch is not None and n != min(batch, left):
            raise ValueError(
                f"update() received {n} losses, but {where} has {min(batch, left)} samples "
                f"(batch size from {plan.batch_from}): feed back exactly one loss per sample of "
                "each batch, once, in the order the DataLoader yields them (token-level losses: "
                "reduce them per sample first, e.g. .view(batch_size, -1).mean(1)); or pass "
                "indices=<the batch's dataset indices> (e.g. to feed back part of a batch)"
            )
        if n > plan.drawn - c:
            raise ValueError(
                f"update() received {n} losses, but only {plan.drawn - c} samples were drawn from "
                f"the sampler since the previous update ({where}): feed back one loss per sample "
                "of each batch, once (token-level losses: reduce them per sample first); or pass "
                "indices=<the batch's dataset indices>"
            )
        return plan

    @property
    def epoch(self) -> int | None:
        """The epoch planned or in progress (``None`` before the first)."""
        return None if self._plan is None else self._plan.epoch

    @property
    def progress(self) -> float:
        """How far the run is, in epochs: ``(epoch + share of this epoch fed back) / num_epochs``.

        Drives a learning-rate schedule that ends with the run however short the pruned epochs
        are: ``LambdaLR(opt, lambda _: my_schedule(sampler.progress))``, stepped every step.

        Raises:
            ValueError: when the sampler was built without ``num_epochs``.
        """
        if self.num_epochs is None:
            raise ValueError(
                "progress needs the run's length: build PruningSampler(..., num_epochs=<epochs>)"
            )
        plan = self._plan
        if plan is None or not plan.started:
            done = 0.0 if plan is None else float(plan.epoch)
        else:
            done = plan.epoch + min(1.0, plan.cursor / max(1, len(plan.order)))
        return min(1.0, done / self.num_epochs)

    def summary(self) -> str:
        """One line: what was pruned, what it saved, and the guard's verdict."""
        return summary_line(self.stats, self.guard, self.scorer is not None)

    def report(self) -> str | None:
        """Log :meth:`summary` once on the ``"hasten"`` logger (rank 0 only); returns the line,
        or ``None`` when it was reported already. Called when the last of ``num_epochs`` is fed
        back, and by the trainer integrations when training ends."""
        if self._reported:
            return None
        self._reported = True
        line = self.summary()
        if self.rank == 0:
            log_line(line)
        return line

    @property
    def pruning(self) -> bool:
        """Whether the current epoch prunes (``False`` in the final full-data epochs)."""
        return self._plan is not None and self._plan.pruning

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: stored losses, generator, the epoch's plan and
        how far its feedback got, stats. Mid-epoch, a restored sampler yields the samples whose
        losses had not come back yet (see :meth:`load_state_dict`)."""
        plan = self._plan
        return {
            "version": _STATE_VERSION,
            "config": self.config.to_dict(),
            "size": self.size,
            "num_epochs": self.num_epochs,
            "seed": self.seed,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "generator": self._generator.get_state(),
            "shuffle_generator": self._shuffle_generator.get_state(),
            "table": self.table.state_dict(),
            "plan": None if plan is None else to_state(plan),
            "stats": dataclasses.asdict(self.stats),
            "seed_checked": self._seed_checked,
            "warned_no_feedback": self._warned_no_feedback,
            "guard": None if self.guard is None else self.guard.state_dict(),
            "reported": self._reported,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output.

        Between epochs the next :meth:`set_epoch` plans as an uninterrupted run would. Mid-epoch
        (a checkpoint taken after some steps' :meth:`update`), the next iteration yields the rest
        of the epoch's indices, from the first one whose loss had not come back, with the same
        weights: build the DataLoader anew (its prefetched batches are gone) and iterate.
        """
        if state.get("version") not in (1, _STATE_VERSION):
            raise ValueError(
                f"unsupported PruningSampler state version {state.get('version')!r} (this "
                f"hasten reads 1 and {_STATE_VERSION}, writes {_STATE_VERSION})"
            )
        for key, mine in (
            ("size", self.size),
            ("num_replicas", self.num_replicas),
            ("rank", self.rank),
        ):
            if state[key] != mine:
                raise ValueError(
                    f"the checkpoint's {key} is {state[key]} but this sampler's is {mine}: "
                    "resume with the same dataset and ranks"
                )
        mine = self.config.to_dict()
        if "guard" not in state["config"]:  # written before the guard existed
            mine.pop("guard", None)
        if state["config"] != mine or state["num_epochs"] != self.num_epochs:
            warnings.warn(
                f"resuming pruning with different settings: saved {state['config']} "
                f"(num_epochs={state['num_epochs']}), now {self.config.to_dict()} "
                f"(num_epochs={self.num_epochs})",
                stacklevel=2,
            )
        self.seed = state["seed"]
        self._generator.set_state(state["generator"])
        # version 1 drew the shuffle from the pruning generator: continue from its state
        self._shuffle_generator.set_state(state.get("shuffle_generator", state["generator"]))
        self.table.load_state_dict(state["table"])
        p = state["plan"]
        self._plan = None if p is None else from_state(_Plan, p)
        self._weight_table = None
        stats = dict(state["stats"])
        self.stats = PruningStats(**stats)
        self._seed_checked = state["seed_checked"]
        self._warned_no_feedback = state["warned_no_feedback"]
        if self.guard is not None and state.get("guard") is not None:
            self.guard.load_state_dict(state["guard"])
        self._reported = bool(state.get("reported", False))
        self._resume = True

    # ------------------------------------------------------------------ planning

    def _make_plan(self, epoch: int) -> _Plan:
        t0 = time.perf_counter()
        self._close_epoch()
        self._check_seed()
        table = self.table
        table.sync()  # collective under torch.distributed: every rank plans from the same table
        pruning = epoch < self._prune_until
        max_age = getattr(self.config, "max_loss_age", None)
        if pruning and self.scorer is not None and max_age is not None:
            self._rescore(epoch - max_age, epoch)
        seen = table.seen.cpu()  # HOST SYNC: once per epoch, to decide on the host
        kept, weights = select_epoch(
            table.losses.cpu(),
            seen,
            self._policy,
            self._generator,
            pruning,
            self.shuffle,
            shuffle_generator=self._shuffle_generator,
            guard=self.guard,
            epoch=epoch,
            epoch_seen=table.epoch_seen.cpu(),
        )
        n_kept = len(kept)
        if self.num_replicas > 1 and n_kept:
            pad = -n_kept % self.num_replicas  # repeat the first few: equal shards on every rank
            kept = torch.cat((kept, kept[:pad].repeat(math.ceil(pad / max(1, n_kept)))[:pad]))
            kept = kept[self.rank :: self.num_replicas]
        order_weights = None if weights is None else weights.index_select(0, kept)
        self._weight_table = None
        s = self.stats
        s.epochs += 1
        s.samples_total += self.size
        s.samples_kept += n_kept
        s.samples_audited += 0 if self.guard is None else self.guard.audited(epoch)
        s.epoch_kept_fractions.append(n_kept / self.size)
        s.planning_seconds += time.perf_counter() - t0
        return _Plan(epoch=epoch, pruning=pruning, order=kept, weights=order_weights)

    def _rescore(self, oldest_fresh: int, epoch: int) -> None:
        table = self.table
        stale = table.seen & (table.epoch_seen < oldest_fresh)
        idx = stale.nonzero().reshape(-1).cpu()  # HOST SYNC: once per epoch
        if self.num_replicas > 1:  # each rank scores its share; sync() merges them
            idx = idx[self.rank :: self.num_replicas]
        if len(idx):
            t0 = time.perf_counter()
            losses = self.scorer(idx)  # type: ignore[misc]
            if not isinstance(losses, Tensor) or losses.shape != (len(idx),):
                raise ValueError(
                    f"the scorer must return one loss per index (shape [{len(idx)}]), got "
                    f"{getattr(losses, 'shape', type(losses).__name__)}"
                )
            table.record(idx, losses, epoch)
            self.stats.samples_scored += len(idx)
            self.stats.scoring_seconds += time.perf_counter() - t0
        table.sync()  # collective: every rank calls it, scored or not

    def _close_epoch(self) -> None:
        plan = self._plan
        if plan is None or not plan.started:
            return
        missing = len(plan.order) - plan.cursor
        self.stats.samples_not_fed_back += missing
        if plan.cursor == 0 and len(plan.order) and not self._warned_no_feedback:
            self._warned_no_feedback = True
            warnings.warn(
                f"PruningSampler: no losses came back during epoch {plan.epoch}, so the next "
                "epoch is planned without them. Call loss = sampler.update(per_sample_losses) "
                "in every training step",
                RuntimeWarning,
                stacklevel=4,
            )

    def _check_seed(self) -> None:
        if self._seed_checked:
            return
        self._seed_checked = True
        seeds = all_gather_objects(self.seed)
        if len(set(seeds)) > 1:
            raise ValueError(
                f"PruningSampler seeds differ across ranks ({seeds}): every rank must take the "
                "same pruning decisions; pass the same seed= on every rank"
            )

    def _weights_by_index(self, plan: _Plan, device: torch.device) -> Tensor:
        table = self._weight_table
        if table is None or table.device != device:
            assert plan.weights is not None
            table = torch.ones(self.size, device=device)
            table[plan.on("order", device)] = plan.on("weights", device)
            self._weight_table = table
        return table


def prune_until(anneal_fraction: float, num_epochs: int | None) -> float:
    """The first epoch that trains on all data (the final ``anneal_fraction`` of ``num_epochs``);
    ``inf`` for a run of unknown length (which must not anneal)."""
    if num_epochs is None:
        return math.inf
    return num_epochs - math.ceil(anneal_fraction * num_epochs - 1e-9)


def select_epoch(
    losses: Tensor,
    seen: Tensor,
    policy: SiftPolicy,
    generator: torch.Generator,
    pruning: bool,
    shuffle: bool,
    *,
    shuffle_generator: torch.Generator | None = None,
    guard: Guard | None = None,
    epoch: int = 0,
    epoch_seen: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """One epoch's kept dataset indices (shuffled if asked) and every sample's loss weight.

    The per-epoch law of every front-end that plans from fed-back losses (``PruningSampler``,
    Keras' ``EpochPlanner``): the stored ``losses`` of the ``seen`` samples go through the rule's
    ``policy``; never-seen samples are always kept; with ``pruning`` off, everything is. The
    rule's and the guard's draws come from ``generator`` in one order, the shuffle from
    ``shuffle_generator`` (default: ``generator`` too), so equal seeds and losses give equal
    plans.
    With a ``guard`` (:mod:`hasten.sifting.guard`; needs ``epoch`` and the table's
    ``epoch_seen``), the rule's selection goes through it and it remembers the epoch's order.
    Returns ``(kept, weights)``: int64 indices on the CPU, and float weights by dataset index
    (``None``: all ones).
    """
    if pruning and bool(seen.any()):  # HOST SYNC: once per epoch
        reference = losses[seen & torch.isfinite(losses)]
        sel = policy(losses, reference, generator)
        keep = sel.keep | ~seen  # never-seen samples are always kept
        weights = None if sel.weights is None else torch.where(seen, sel.weights.float(), 1.0)
        if guard is not None:
            if epoch_seen is None:
                raise ValueError("select_epoch(guard=...) needs the table's epoch_seen")
            keep, weights = guard.apply(epoch, losses, seen, epoch_seen, keep, weights, generator)
        kept = keep.nonzero().reshape(-1)
    else:
        kept, weights = torch.arange(len(seen)), None
    if shuffle:
        shuffler = generator if shuffle_generator is None else shuffle_generator
        kept = kept[torch.randperm(len(kept), generator=shuffler)]
    if guard is not None:
        guard.remember(epoch, kept, pruning and bool(seen.any()))
    return kept, weights


@dataclass(frozen=True)
class _Batching:
    """How a DataLoader groups a sampler's indices into the batches it yields."""

    size: int
    drop_last: bool
    in_order: bool  # False: workers may hand batches back out of draw order


_BATCH_ITER = BatchSampler.__iter__
_LOADER_ITER = getattr(_dataloader, "_BaseDataLoaderIter", ())
_LOADER_DEPTH = 8  # frames between the BatchSampler and the DataLoader's iterator (Accelerate's)


def _batching_of(sampler: Sampler[int], caller: FrameType | None) -> _Batching | None:
    """How ``sampler``'s indices are batched, read off ``caller`` (the frame that called
    ``iter(sampler)``): when it is ``torch.utils.data.BatchSampler.__iter__`` over ``sampler``
    (the DataLoader's own batch sampler, or one passed as ``batch_sampler=``), its
    ``batch_size`` and ``drop_last``, and whether the DataLoader above it keeps batches in draw
    order. ``None`` for any other consumer (a custom batch sampler, a loop over the sampler):
    their batches cannot be seen. Runs once per epoch."""
    if caller is None or caller.f_code is not _BATCH_ITER.__code__:
        return None
    owner = caller.f_locals.get("self")
    if (
        not isinstance(owner, BatchSampler)
        or owner.sampler is not sampler
        or type(owner).__iter__ is not _BATCH_ITER
    ):
        return None
    in_order = True
    frame = caller.f_back
    for _ in range(_LOADER_DEPTH):
        if frame is None:
            break
        it = frame.f_locals.get("self")
        if isinstance(it, _LOADER_ITER):
            in_order = bool(getattr(it, "_in_order", True)) or not getattr(it, "_num_workers", 0)
            break
        frame = frame.f_back
    return _Batching(int(owner.batch_size), bool(owner.drop_last), in_order)


def _fed_back_all(plan: _Plan) -> bool:
    """Whether every batch of ``plan`` that the DataLoader yields came back (its epoch is over)."""
    left = len(plan.order) - plan.cursor
    if left <= 0:
        return True
    batch = plan.batch
    # under drop_last the short tail after the last full batch never comes back
    return batch is not None and plan.drop_last and (len(plan.order) - plan.start) % batch == left


def _draw(plan: _Plan, start: int) -> Iterator[int]:
    """The epoch's indices from ``start``, counting what the DataLoader has drawn."""
    plan.drawn = start
    for i in plan.order[start:].tolist():
        plan.drawn += 1
        yield i
    plan.exhausted = True


def _length(data_source: Any) -> int:
    try:
        return len(data_source)
    except TypeError as err:
        raise TypeError(
            f"PruningSampler needs a dataset with a length (or the length as an int); "
            f"{type(data_source).__name__} has none"
        ) from err


def _world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    world = num_replicas if num_replicas is not None else world_size()
    me = rank if rank is not None else this_rank()
    for name, v in (("num_replicas", world), ("rank", me)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {v!r}")
    if world < 1 or not 0 <= me < world:
        raise ValueError(f"need num_replicas >= 1 and 0 <= rank < num_replicas, got {world}, {me}")
    return world, me
