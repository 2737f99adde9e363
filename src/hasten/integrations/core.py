"""The integration core: what every trainer adapter does the same way, written once.

A trainer adapter (Hugging Face: :mod:`hasten.integrations.transformers`, Lightning:
:mod:`hasten.integrations.lightning`, Keras: :mod:`hasten.keras.sifting`) hears the trainer's
events and answers them with these pieces; only the adapters touch their framework's internals::

    the run's length      training_calls(optimizer_steps, accumulation)  -> the compile plan's steps=
    plan an epoch         PrunedPasses: one pruned epoch of the PruningSampler per data pass
                          (sampler.set_epoch(p) plans it), trimmed to whole optimizer steps
    feed back losses      PrunedPasses.feed_back(per_sample_losses)       -> the loss to backpropagate
    catch the LR up       full_data_steps(...) -> catch_up(schedulers, target, cap)
                          after every optimizer step of a run by epochs: a schedule sized for
                          full-data epochs ends with the shorter, pruned run
    per-rank state        RankState: each rank's state saved and restored with the trainer's
                          checkpoints (gathered into one checkpoint where only rank 0 saves,
                          one file per rank where every rank does), checked against the world size

How passes become epochs (the pass stream and fixed-length epochs of the loader front-end,
:class:`~hasten.integrations.epochs.SiftedEpochs`; the pruned pass these passes start and trim;
the one Keras plans) is :mod:`hasten.sifting.core.epochs`.
"""

from __future__ import annotations

import itertools
import math
import os
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from hasten.sifting.core import dist as _dist
from hasten.sifting.core.epochs import start_pruned_pass, whole_steps
from hasten.sifting.sampler import PruningSampler

__all__ = [
    "PrunedPasses",
    "RankState",
    "catch_up",
    "full_data_steps",
    "training_calls",
]


# ---------------------------------------------------------------------------------- run length


def training_calls(optimizer_steps: float | None, accumulation: int = 1) -> int | None:
    """Training calls (micro-batches) of a run of ``optimizer_steps`` steps of ``accumulation``
    micro-batches each: what the compile plan's ``steps=`` counts. ``None`` (unknown, endless or
    empty) stays ``None``: the plan then learns the length as the run goes."""
    if optimizer_steps is None or isinstance(optimizer_steps, bool):
        return None
    if not isinstance(optimizer_steps, (int, float)) or not math.isfinite(optimizer_steps):
        return None
    calls = math.ceil(optimizer_steps) * max(1, int(accumulation or 1))
    return calls if calls > 0 else None


# ---------------------------------------------------------------------------------- LR catch-up


def full_data_steps(
    pass_index: int, done: int, pass_length: int, planned: int, accumulation: int = 1
) -> int:
    """Optimizer steps a full-data run would have taken at this point of a pruned run.

    Args:
        pass_index: The pruned epoch (data pass) in progress, from 0.
        done: Batches of it trained on so far.
        pass_length: Batches it holds (``<= 0``: not started: its start).
        planned: Batches of a full-data epoch, which the trainer sized its schedule by.
        accumulation: Batches per optimizer step.
    """
    per_pass = -(-planned // max(1, accumulation))
    if pass_length <= 0:
        return max(0, pass_index) * per_pass
    return pass_index * per_pass + (min(done, pass_length) * per_pass) // pass_length


def catch_up(schedulers: Iterable[Any], target: int, cap: float | None = None) -> None:
    """Step each learning-rate scheduler until it has taken ``target`` steps (at most ``cap``).

    ``ReduceLROnPlateau`` (stepped by a metric, not by steps) and objects without
    ``last_epoch`` are left alone; a scheduler past ``target`` is never stepped back.
    """
    if cap is not None and math.isfinite(cap):
        target = min(target, int(cap))
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau
    for scheduler in schedulers:
        if scheduler is None or isinstance(scheduler, plateau):
            continue
        if not hasattr(scheduler, "last_epoch"):
            continue
        while scheduler.last_epoch < target:
            scheduler.step()


# ---------------------------------------------------------------------------------- pruned passes


class PrunedPasses:
    """A train loader over a :class:`~hasten.sifting.PruningSampler`, as a trainer needs it:
    passes it can count on, feedback attributed to the right one.

    Each data pass is one pruned epoch of the sampler (``set_epoch(p)`` plans it), ending at the
    last whole optimizer step when its batches do not fill whole steps of ``accumulation``
    (the rest of its kept samples are left for the next: counted in ``samples_not_fed_back``).
    ``by_steps=False``: one ``for`` loop is one pass and ``len()`` the first, full pass (what a
    trainer plans by). ``by_steps=True``: passes follow one another and one ``for`` loop is
    ``len()`` batches of them, a whole number of optimizer steps. :meth:`feed_back` gives the
    losses to the sampler; the pass in progress and how much of it came back drive the adapter's
    step-end work (:meth:`steps_into_schedule` for the LR catch-up, :attr:`done`).

    Args:
        loader: The trainer's DataLoader built on ``sampler``.
        sampler: The pruning sampler.
        accumulation: Batches per optimizer step (1: no trimming).
        by_steps: Whether the trainer trains by steps (see above).
        trim_full_pass: Whether a pass as long as the full first one is trimmed to whole steps
            too (``False``: the trainer plans that pass's short last step itself, as the HF
            Trainer does; Lightning steps a short last accumulation of any epoch itself, so it
            passes ``accumulation=1``).
    """

    def __init__(
        self,
        loader: Any,
        sampler: PruningSampler,
        *,
        accumulation: int = 1,
        by_steps: bool = False,
        trim_full_pass: bool = False,
    ) -> None:
        self.loader = loader
        self.sampler = sampler
        self.accumulation = max(1, int(accumulation))
        self.by_steps = by_steps
        self.trim_full_pass = trim_full_pass
        self.planned = len(loader)  # the first pass: all data, what the trainer plans by
        ga = self.accumulation
        self.block = max(ga, self.planned // ga * ga)
        self.pass_index = -1  # the pass in progress (or last finished)
        self.pass_length = 0  # batches the pass yields
        self.fed_back = 0  # batches of the pass whose losses came back
        self.epoch: int | None = None  # the trainer's, recorded only
        self._resume = False
        self._chain: Iterator[Any] | None = None

    def __len__(self) -> int:
        return self.block if self.by_steps else self.planned

    def set_epoch(self, epoch: int) -> None:
        """Record the trainer's epoch (passes are numbered and planned here)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        if not self.by_steps:
            return self._one_pass()
        if self._chain is None:
            self._chain = self._passes()
        return itertools.islice(self._chain, self.block)

    @property
    def dataset(self) -> Any:
        return self.loader.dataset

    @property
    def stats(self) -> Any:
        """The sampler's :class:`~hasten.sifting.sampler.PruningStats`."""
        return self.sampler.stats

    @property
    def num_epochs(self) -> int | None:
        return self.sampler.num_epochs

    @property
    def done(self) -> bool:
        """All of the sampler's ``num_epochs`` passes trained (never, without it)."""
        n = self.sampler.num_epochs
        return n is not None and self.pass_index + 1 >= n and self.fed_back >= self.pass_length > 0

    def feed_back(self, losses: torch.Tensor) -> torch.Tensor:
        """``sampler.update(losses)``, counted for the pass in progress; the loss to train on."""
        loss = self.sampler.update(losses)
        self.fed_back += 1
        return loss

    def steps_into_schedule(self) -> int:
        """Optimizer steps a full-data run would have taken at this point of the run."""
        return full_data_steps(
            self.pass_index, self.fed_back, self.pass_length, self.planned, self.accumulation
        )

    def _passes(self) -> Iterator[Any]:
        while True:
            yield from self._one_pass()

    def _one_pass(self) -> Iterator[Any]:
        if self.done:
            return
        if self._resume and self.fed_back < self.pass_length:
            p, length = self.pass_index, self.pass_length  # the restored sampler yields the rest
            self._resume = False
        else:
            self._resume = False
            p = self.pass_index + 1
            self._set_pass_epoch(p)
            length = self._trimmed(len(self.loader), p)
            self.pass_index, self.pass_length, self.fed_back = p, length, 0
        self._set_pass_epoch(p)  # keeps a wrapping loader's epoch counter on the pass (no replan)
        it = iter(self.loader)
        given = self.fed_back
        for batch in it:
            if given >= length:
                break
            given += 1
            yield batch
        for _ in it:  # the trimmed tail: drawn, never trained (lets the loader finish its pass)
            pass

    def _set_pass_epoch(self, p: int) -> None:
        start_pruned_pass(self.loader, self.sampler, p)

    def _trimmed(self, n: int, p: int) -> int:
        # the full pass keeps its short last step when the trainer plans that step itself
        full = not self.by_steps and n == self.planned and not self.trim_full_pass
        return whole_steps(n, self.accumulation, p, keep=full)

    def continue_from(self, other: PrunedPasses) -> None:
        """Take over ``other``'s position (a trainer rebuilt the loader over the same sampler):
        its full-pass length, the pass in progress and its feedback."""
        self.planned, self.block = other.planned, other.block
        self.pass_index, self.pass_length, self.fed_back = (
            other.pass_index,
            other.pass_length,
            other.fed_back,
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "sampler": self.sampler.state_dict(),
            "pass_index": self.pass_index,
            "pass_length": self.pass_length,
            "fed_back": self.fed_back,
            "planned": self.planned,
            "by_steps": self.by_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "sampler" not in state:
            raise ValueError("it is a sifting loader's state, not a pruning sampler's")
        if state["by_steps"] != self.by_steps or state["planned"] != self.planned:
            raise ValueError(
                f"the checkpoint trained {'by steps' if state['by_steps'] else 'by epochs'} "
                f"with passes of {state['planned']} batches, this run "
                f"{'by steps' if self.by_steps else 'by epochs'} with {self.planned}; resume "
                "with the same training arguments and dataset"
            )
        self.sampler.load_state_dict(state["sampler"])
        self.pass_index = state["pass_index"]
        self.pass_length = state["pass_length"]
        self.fed_back = state["fed_back"]
        self._resume = True
        self._chain = None

    def __repr__(self) -> str:
        mode = f"by steps, {self.block} batches per epoch" if self.by_steps else "by epochs"
        return f"{type(self).__name__}({self.sampler!r}, {mode})"


# ---------------------------------------------------------------------------------- rank state


class RankState:
    """Each rank's sifting state in a trainer's checkpoints, restored by the same rank.

    Two trainers, two ways to store it, one record and one check: where only rank 0 writes the
    checkpoint (Lightning), :meth:`gather` puts every rank's state into it (a collective: every
    rank calls it) and :meth:`own` takes this rank's back out; where every rank writes
    (the Hugging Face Trainer), :meth:`save_file` writes this rank's own file and
    :meth:`load_file` reads it (plain data: ``torch.load(weights_only=True)``). Either way the
    world size is recorded and a resume with another number of processes raises.

    Args:
        key: Under which key the gathered states sit (``"ranks"``, ``"pruning"``).
        not_ours: The message when a state is not one of these records.
        other_world: The message when it comes from another process count (``{saved}`` and
            ``{world}`` are filled in).
    """

    def __init__(self, key: str, *, not_ours: str, other_world: str) -> None:
        self.key = key
        self.not_ours = not_ours
        self.other_world = other_world

    def gather(self, state: Any) -> dict[str, Any]:
        """Every rank's ``state`` (a collective: every rank must call it)."""
        return {"world_size": _dist.world_size(), self.key: _dist.all_gather_objects(state)}

    def own(self, saved: Any) -> Any:
        """This rank's entry of a :meth:`gather` record."""
        ranks = saved.get(self.key) if isinstance(saved, dict) else None
        if not isinstance(ranks, list):
            raise ValueError(self.not_ours)
        self._check_world(len(ranks))
        return ranks[_dist.rank()]

    @staticmethod
    def file(folder: str, rank: int) -> str:
        """Where rank ``rank``'s own state file goes in a checkpoint folder."""
        return os.path.join(folder, f"hasten_sifting_rank{rank}.pt")

    def save_file(self, folder: str, rank: int, state: Any) -> str:
        """Write this rank's ``state`` (with the world size) into ``folder``; the path."""
        os.makedirs(folder, exist_ok=True)  # the main process may not have made it yet
        path = self.file(folder, rank)
        torch.save({"world_size": _dist.world_size(), self.key: state}, path)
        return path

    def load_file(self, path: str) -> Any:
        """This rank's state from :meth:`save_file`'s file (or an earlier hasten's bare state).

        Raises:
            RuntimeError: the file needs pickle (an earlier hasten's objects).
            ValueError: it was written by a run with another number of processes.
        """
        fresh = f"delete {path} to resume the checkpoint with a fresh sifted stream"
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            raise RuntimeError(
                f"{path} does not load with torch.load(weights_only=True): an earlier hasten "
                f"wrote sifting state holding Python objects, which this hasten does not read; "
                f"{fresh}"
            ) from err
        if isinstance(saved, dict) and set(saved) == {"world_size", self.key}:
            try:
                self._check_world(int(saved["world_size"]))
            except ValueError as err:
                raise ValueError(f"cannot resume from {path}: {err}. Or {fresh}") from err
            return saved[self.key]
        return saved  # written before the world size was recorded: the bare state

    def _check_world(self, saved: int) -> None:
        world = _dist.world_size()
        if saved != world:
            raise ValueError(self.other_world.format(saved=saved, world=world))
