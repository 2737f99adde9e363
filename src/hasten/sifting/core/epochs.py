"""How data passes become a trainer's epochs, written once: pass streams, fixed-length epochs,
the length plan and the pruned pass.

Every front-end and adapter cuts its epochs here::

    SiftingDataloader      LoaderEpochs: one data pass per ``for`` loop until ``len()`` is read,
                           then loops of exactly ``len()`` batches over a PassStream
    SiftedEpochs (HF,      FixedEpochs over a PassStream of the loader's passes (its PassSource):
      Lightning)           epochs of ``epoch_length``, ending with the fit's last pass
                           (``last_pass``) on a whole optimizer step (``step_multiple``)
    expected_batches,      LengthPlan: the length rule (:mod:`hasten.sifting.core.length`)
      len(), SiftedEpochs  on the loader's pass shape, nominal keep rate and delay
    PrunedPasses (HF,      start_pruned_pass: sampler epoch ``p`` is data pass ``p``;
      Lightning)           whole_steps: a pruned pass trimmed to whole optimizer steps
    Keras EpochPlanner     pruned_pass: sampler epoch ``p`` as (order, weights), no DataLoader

A :class:`PassStream` runs data pass after data pass as one stream of batches; an epoch of a
fixed number of batches draws from it, so a pass that does not fit into one epoch continues in
the next, and every kept sample is yielded once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor

from hasten.sifting.core import length as length_rule
from hasten.sifting.core.length import PassShape

if TYPE_CHECKING:
    from hasten.sifting.sampler import PruningSampler

__all__ = [
    "END",
    "FixedEpochs",
    "LengthPlan",
    "LoaderEpochs",
    "PassSource",
    "PassStream",
    "pruned_pass",
    "start_pruned_pass",
    "whole_steps",
]

END: Any = object()
"""What :meth:`PassStream.next` returns instead of a batch when the last pass it may run is over."""


# ---------------------------------------------------------------------------------- pass stream


class PassStream:
    """Batches of data pass after data pass; ``next()`` starts a new pass when one runs out.

    Args:
        start_pass: ``start_pass(p)`` returns the iterator of data pass ``p`` (seeding its
            sampler first).
        data_epoch: The last pass already run (-1: none).

    Attributes:
        data_epoch: Index of the data pass in progress (or last finished); -1 before the first.
        yielded_in_pass: Batches taken from the pass in progress.
    """

    def __init__(self, start_pass: Callable[[int], Iterator[Any]], data_epoch: int = -1) -> None:
        self._start_pass = start_pass
        self.data_epoch = data_epoch
        self.yielded_in_pass = 0
        self.it: Iterator[Any] | None = None  # the data pass in progress

    @property
    def in_pass(self) -> bool:
        """Whether a data pass is in progress."""
        return self.it is not None

    def next(self, last_pass: int | None = None) -> Any:
        """The next batch of the stream; :data:`END` once data pass ``last_pass`` is over and
        the next batch would start a later one (``None``: passes go on for ever).

        Raises:
            RuntimeError: two data passes in a row yielded nothing (the stream cannot be filled).
        """
        empty_passes = 0
        if last_pass is not None and self.data_epoch > last_pass:
            return END
        while True:
            if self.it is None:
                if last_pass is not None and self.data_epoch >= last_pass:
                    return END
                self.data_epoch += 1
                self.yielded_in_pass = 0
                self.it = self._start_pass(self.data_epoch)
            try:
                batch = next(self.it)
            except StopIteration:
                self.it = None
                empty_passes = empty_passes + 1 if self.yielded_in_pass == 0 else 0
                if empty_passes >= 2:
                    raise RuntimeError(
                        "the sifting loader yielded no batch in two data passes in a row (an empty "
                        "dataset, or a policy that keeps nothing under drop_last=True); fixed-length "
                        "epochs cannot be filled"
                    ) from None
                continue
            self.yielded_in_pass += 1
            return batch

    def state_dict(self) -> dict[str, Any]:
        """The stream's position (the pass's own state is its loader's)."""
        return {
            "data_epoch": self.data_epoch,
            "in_pass": self.in_pass,
            "yielded_in_pass": self.yielded_in_pass,
        }

    def load_state_dict(self, state: dict[str, Any], resume_pass: Callable[[], Iterator[Any]]):
        """Restore :meth:`state_dict` output; mid-pass, ``resume_pass()`` finishes the pass."""
        self.data_epoch = state["data_epoch"]
        self.yielded_in_pass = state["yielded_in_pass"]
        self.it = resume_pass() if state["in_pass"] else None


# ---------------------------------------------------------------------------------- fixed epochs


class FixedEpochs:
    """Epochs of ``length`` batches cut from a :class:`PassStream`; each :meth:`loop` is one.

    Args:
        stream: The stream of data passes.
        length: Batches per epoch.
        stale: The message of the error a superseded loop raises.
        last_pass: The fit's last data pass (``None``: passes go on for ever). Once it is over
            the stream ends (:attr:`finished`) and every later epoch is empty.
        step_multiple: With ``last_pass``, the epoch the stream ends in still holds a multiple
            of this many batches (or ``length``), drawn from the next pass when the last one
            ends inside an optimizer step.
        plan_end: ``(n, check)``: ``check()`` runs just before the ``n``-th batch of the whole
            stream is yielded (a trainer asks for no batch after its plan's last).
        on_end: Runs once, when the stream ends after ``last_pass``.

    Attributes:
        finished: Whether the stream ended after ``last_pass``.
        yielded: Batches yielded over the whole stream.
    """

    def __init__(
        self,
        stream: PassStream,
        length: int,
        *,
        stale: str,
        last_pass: int | None = None,
        step_multiple: int = 1,
        plan_end: tuple[int, Callable[[], None]] | None = None,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.stream = stream
        self.length = length
        self.stale = stale
        self.last_pass = last_pass
        self.step_multiple = step_multiple
        self.plan_end = plan_end
        self.on_end = on_end
        self.finished = False
        self.yielded = 0
        self._token = 0

    def loop(self) -> Iterator[Any]:
        """The next epoch, as a new iterator (older ones raise from then on)."""
        self._token += 1
        return self._epoch(self._token)

    def invalidate(self) -> None:
        """Make every running epoch iterator stale (the state was restored)."""
        self._token += 1

    def _epoch(self, token: int) -> Iterator[Any]:
        for k in range(self.length):
            if self.finished:
                return
            if token != self._token:
                raise RuntimeError(self.stale)
            # the last pass over: end here, or once the optimizer step in progress is whole
            batch = self.stream.next(None if k % self.step_multiple else self.last_pass)
            if batch is END:
                self.finished = True
                if self.on_end is not None:
                    self.on_end()
                return
            self.yielded += 1
            if self.plan_end is not None and self.yielded == self.plan_end[0]:
                self.plan_end[1]()  # before the yield: a trainer asks for no batch after it
            yield batch


# ---------------------------------------------------------------------------------- length plan


@dataclass(frozen=True)
class LengthPlan:
    """The length rule's inputs for a loader, as they are now (see
    :mod:`hasten.sifting.core.length`)."""

    shape: PassShape
    """One pass of the wrapped loader."""
    rate: float
    """The rule's nominal keep rate (the same on every rank)."""
    sift_delay: int
    repeat_delay_per_epoch: bool
    out_batch_size: int | None
    """Samples per yielded batch (``None``: the incoming batch size)."""
    delay_done: int = 0
    """Batches of the delay behind the next pass."""

    def batches(
        self,
        passes: int = 1,
        *,
        delay: bool = True,
        delay_done: int | None = None,
        rate: float | None = None,
    ) -> int:
        """Batches ``passes`` passes yield: with the delay still ahead as it is now (or
        ``delay_done`` batches of it behind; none of it when not ``delay``), at ``rate`` (default:
        the nominal one)."""
        return length_rule.expected_batches(
            self.shape,
            self.rate if rate is None else rate,
            sift_delay=self.sift_delay if delay else 0,
            repeat_delay_per_epoch=self.repeat_delay_per_epoch,
            delay_done=self.delay_done if delay_done is None else delay_done,
            passes=passes,
            out_batch_size=self.out_batch_size,
        )

    def epoch_length(self, passes: int, *, finish_passes: bool) -> int:
        """Batches per epoch for ``passes`` epochs of about one data pass each, from the start of
        training: their expected batches, plus :func:`~hasten.sifting.core.length.fit_headroom`
        when the fit is those whole passes, averaged over the epochs (at least 1)."""
        planned = self.batches(passes, delay_done=0)
        if finish_passes:
            planned += length_rule.fit_headroom(
                self.shape,
                self.rate,
                sift_delay=self.sift_delay,
                repeat_delay_per_epoch=self.repeat_delay_per_epoch,
                passes=passes,
                out_batch_size=self.out_batch_size,
            )
        return max(1, math.ceil(planned / passes))


@dataclass(frozen=True)
class PassSource:
    """A sifting loader's data passes, as fixed-length epochs draw them (the loader's
    ``passes``; :class:`~hasten.integrations.epochs.SiftedEpochs` reads nothing else of it)."""

    start: Callable[[int], Iterator[Any]]
    """``start(p)``: seed data pass ``p`` (the wrapped loader's ``set_epoch``) and start it."""
    resume: Callable[[], Iterator[Any]]
    """Finish the pass a restored checkpoint was in."""
    length_plan: Callable[..., LengthPlan]
    """The length rule's inputs now; keywords ``no_length_fix`` and ``no_batch_size_fix`` end
    the errors raised when the loader has no length or no batch size."""
    left: Callable[[], tuple[int, int]]
    """``(incoming batches of the pass in progress not drawn yet, kept samples buffered)``."""


# ---------------------------------------------------------------------------------- loader epochs


class LoaderEpochs:
    """The loops of a :class:`~hasten.sifting.SiftingDataloader`: one data pass per ``for`` loop
    until ``len()`` is read, then loops of exactly that many batches over a stream of passes
    (see ``SiftingDataloader.__len__`` for the rule).

    Args:
        source: The loader's passes.
        stale: The message of the error a superseded fixed-length loop raises.
    """

    def __init__(self, source: PassSource, *, stale: str) -> None:
        self.source = source
        self.stale = stale
        self.length: int | None = None  # fixed once len() was read outside a running pass
        self.looping = False  # a one-pass `for` loop is running (len() is then a hint only)
        self._unstarted = False  # a one-pass iterator was made but not started yet
        self._provisional: int | None = None  # len() read while it was unstarted
        self.fixed: FixedEpochs | None = None  # the fixed-length loops, once they began

    def loop(self, one_pass: Callable[[], Iterator[Any]], data_epoch: int) -> Iterator[Any]:
        """The iterator of a new ``for`` loop: ``one_pass()`` while the length is not fixed,
        else the next fixed-length loop (its stream continues after pass ``data_epoch``)."""
        if self.length is None and self._provisional is not None:
            # len() was read while an unstarted iterator was open (a trainer probing the loader
            # with iter(), then planning by len()), and now a new loop begins: fix the length
            self.length, self._provisional = self._provisional, None
        if self.length is None:  # one `for` loop = one data pass
            self._unstarted = True
            return one_pass()
        if self.fixed is None:
            self.fixed = self._fixed(PassStream(self.source.start, data_epoch=data_epoch))
        self.fixed.length = self.length
        return self.fixed.loop()

    def read_len(self, expected: Callable[[bool], int]) -> int:
        """``len()``: fixed, or ``expected(observed)`` (batches of the next pass, at the keep
        rate observed so far when ``observed``), fixed here when read outside a loop."""
        if self.length is not None:
            return self.length
        if self.looping:
            return expected(True)
        length = max(1, expected(False))
        if self._unstarted:  # list(loader) asks here; so does Lightning after probing iter()
            self._provisional = length
        else:
            self.length = length
        return length

    def pass_begins(self) -> None:
        """A one-pass iterator took its first step."""
        self.looping, self._unstarted, self._provisional = True, False, None

    def pass_ends(self) -> None:
        self.looping = False

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch_length": self.length,
            "stream": None if self.fixed is None else self.fixed.stream.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.length is None:  # else keep the length the trainer already planned by
            self.length = state.get("epoch_length")
        if self.fixed is not None:
            self.fixed.invalidate()
        stream = state.get("stream")
        if stream is None:
            self.fixed = None
            return
        passes = PassStream(self.source.start)
        passes.load_state_dict(stream, self.source.resume)
        self.fixed = self._fixed(passes)  # the old loops' iterators stay stale

    def _fixed(self, stream: PassStream) -> FixedEpochs:
        return FixedEpochs(stream, self.length or 0, stale=self.stale)


# ---------------------------------------------------------------------------------- pruned passes


def start_pruned_pass(loader: Any, sampler: PruningSampler, p: int) -> None:
    """Make sampler epoch ``p`` data pass ``p``: plan it (``sampler.set_epoch``), and keep a
    wrapping loader's epoch counter on it (Accelerate's forwards it to the sampler; no replan)."""
    if loader is not None and hasattr(loader, "set_epoch"):
        loader.set_epoch(p)
    sampler.set_epoch(p)


def whole_steps(n: int, accumulation: int, p: int, *, keep: bool = False) -> int:
    """Batches of pruned pass ``p`` (``n`` of them) that fill whole optimizer steps of
    ``accumulation`` batches; ``keep``: all ``n`` (a pass whose short last step the trainer
    plans itself).

    Raises:
        ValueError: not one whole step fits.
    """
    ga = accumulation
    if ga == 1 or n % ga == 0 or keep:
        return n
    if n < ga:
        raise ValueError(
            f"pruned epoch {p} has {n} batches, fewer than gradient_accumulation_steps="
            f"{ga}: no whole optimizer step fits; lower gradient_accumulation_steps or "
            "per_device_train_batch_size"
        )
    return n // ga * ga


def pruned_pass(sampler: PruningSampler, p: int) -> tuple[Tensor, Tensor | None]:
    """Sampler epoch ``p`` as data pass ``p`` for a loop without a DataLoader (Keras): planned
    and started (feedback by index is taken from here on); its indices in yield order (int64)
    and, aligned with them, the loss weights (``None``: all ones)."""
    sampler.set_epoch(p)
    iter(sampler)  # starts the epoch
    plan = sampler._plan  # the one reader of the sampler's plan outside it
    if plan is None:  # set_epoch always plans; kept as a clear error should that change
        raise RuntimeError("PruningSampler.set_epoch planned no epoch")
    return plan.order, plan.weights
