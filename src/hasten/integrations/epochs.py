"""Fixed-length epochs over a sifting loader, for trainers that plan their loops by ``len()``.

A sifting pass over the data has a variable number of batches: it depends on how many samples the
policy keeps, which is known only as the pass runs. The Hugging Face ``Trainer`` and Lightning
both read ``len(train_dataloader)`` once, before training, and plan by it: the number of optimizer
steps per epoch, where gradient accumulation ends, learning-rate schedules, the epoch at which
to stop. Hand them a loader whose length is only an estimate and they cut a long pass short
(the rest of its kept samples are silently never trained on) or run a short pass into an empty
iterator (the last, partial gradient-accumulation step leaks into the next epoch).

:class:`SiftedEpochs` removes the mismatch: it turns the sifting loader into an endless stream of
sifted batches, one data pass after another, and cuts that stream into epochs of exactly
``epoch_length`` batches::

    data passes  |---- pass 0 ----|--- pass 1 ---|----- pass 2 -----|--- pass 3 ...
    epochs       |--- epoch 0 ---|--- epoch 1 ---|--- epoch 2 ---|--- epoch 3 ...

Every epoch has the length the trainer planned for, every kept sample is trained on, and a data
pass that straddles two epochs simply continues. ``epoch_length`` defaults to the expected
length of a pass at the configured keep rate (:func:`expected_batches`), so an epoch is about one
data pass.

A fit by epochs trains whole data passes, as SageMaker's loader does (``finish_passes=True``,
which the Hugging Face and Lightning integrations set when they train by epochs): the stream
ends with its last pass, so the last epoch is cut short there, and the default epoch length
plans a little more than the passes are expected to yield
(:func:`~hasten.sifting.core.length.fit_headroom`: at most 2.5 % more), so that they fit::

    data passes  |---- pass 0 ----|--- pass 1 ---|
    epochs       |---- epoch 0 -----|- epoch 1 -|     (epoch 1 ends with pass 1: the fit's end)

The fit takes within 2.5 % of the steps it planned when the passes keep what the rule is
expected to keep; if they keep more than the plan holds, the plan's end cuts the last pass, with
a warning naming how much of it was left. Data passes are driven here: pass ``p`` calls ``loader.set_epoch(p)`` (which reaches a
``DistributedSampler``) before it starts; the trainer's own epoch number is recorded, not
forwarded.

Under ``torch.distributed`` every rank must build the same ``SiftedEpochs`` (same config, same
shard length): the epoch length is computed from the config, never from what a rank has kept, and
checked across ranks once with one ``all_gather``. Batches go through one to one, so every rank
pulls the same number of batches from the sifting loader, whose own collectives stay in step; a
data pass yields the same number of batches on every rank, so a fit that finishes its passes
ends at the same batch everywhere.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

from hasten.sifting.core.dist import all_gather_ints
from hasten.sifting.core.epochs import FixedEpochs, LengthPlan, PassStream
from hasten.sifting.loader import SiftingDataloader

__all__ = ["SiftedEpochs", "expected_batches"]


def expected_batches(loader: SiftingDataloader, passes: int = 1, *, delay: bool = True) -> int:
    """Batches that ``passes`` data passes of ``loader`` yield at the config's expected keep rate.

    The length rule of :mod:`hasten.sifting.core.length`, which ``len(loader)`` uses too: the
    batches passed through unscored during the sift delay (from the start of training when
    ``delay``, else none: the steady state) and the kept samples of the rest divided by the
    batch size, per pass (the last batch of a pass rounds up, or down under ``drop_last``). Uses
    the rule's nominal rate, never the observed one, so every rank gets the same number.

    Raises:
        TypeError: the wrapped loader has no length or no batch size.
        ValueError: ``passes < 1``.
    """
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"passes must be an int >= 1, got {passes!r}")
    return _length_plan(loader).batches(passes, delay=delay, delay_done=0)


def _length_plan(loader: SiftingDataloader) -> LengthPlan:
    """The length rule's inputs for ``loader``, with this module's advice in its errors."""
    fix = "pass epoch_length=<batches per epoch>"
    return loader.passes.length_plan(
        no_length_fix=f"train by steps and {fix}", no_batch_size_fix=fix
    )


class SiftedEpochs:
    """A :class:`~hasten.sifting.SiftingDataloader` as epochs of exactly ``epoch_length`` batches.

    See the module docstring for the picture. Iterating gives one epoch; ``len()`` is its exact
    length. The data stream continues across epochs (and across ``for`` loops), so an epoch may
    start in the middle of a data pass.

    Args:
        loader: The sifting loader. Its ``set_epoch`` is called here, once per data pass.
        epoch_length: Batches per epoch. Default: the expected batches of one data pass,
            averaged over the first ``passes`` passes (so ``passes`` epochs hold about as many
            batches as ``passes`` data passes, sift delay included).
        passes: How many data passes the default ``epoch_length`` averages over (e.g. the
            trainer's number of epochs); 1 counts the first pass only.
        finish_passes: The fit is ``passes`` whole data passes (a trainer by epochs): the
            stream ends when the last one does, cutting that epoch short, and the default
            ``epoch_length`` adds the headroom of
            :func:`~hasten.sifting.core.length.fit_headroom` (see the module docstring).
        step_multiple: With ``finish_passes``, the epoch the stream ends in still holds a
            multiple of this many batches (or ``epoch_length``), drawn from the next pass when
            the last one ends inside an optimizer step: the trainer's gradient accumulation
            steps, so no micro-batch of the last step is left unapplied.

    Attributes:
        loader: The sifting loader.
        data_epoch: Index of the data pass in progress (or last finished); -1 before the first.
        epoch: The last value given to :meth:`set_epoch` (the trainer's epoch), ``None`` before.
        finished: With ``finish_passes``, whether the fit's last pass was seen to end (when
            a batch was asked for after it; later epochs yield nothing, and a trainer adapter
            stops training).
    """

    def __init__(
        self,
        loader: SiftingDataloader,
        epoch_length: int | None = None,
        *,
        passes: int = 1,
        finish_passes: bool = False,
        step_multiple: int = 1,
    ) -> None:
        if not isinstance(loader, SiftingDataloader):
            raise TypeError(
                f"SiftedEpochs wraps a hasten SiftingDataloader, got {type(loader).__name__}"
            )
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"passes must be an int >= 1, got {passes!r}")
        if not isinstance(finish_passes, bool):
            raise TypeError(f"finish_passes must be True or False, got {finish_passes!r}")
        if isinstance(step_multiple, bool) or not isinstance(step_multiple, int):
            raise TypeError(f"step_multiple must be an int, got {type(step_multiple).__name__}")
        if step_multiple < 1:
            raise ValueError(f"step_multiple must be >= 1, got {step_multiple}")
        if epoch_length is None:
            epoch_length = _length_plan(loader).epoch_length(passes, finish_passes=finish_passes)
        elif isinstance(epoch_length, bool) or not isinstance(epoch_length, int):
            raise TypeError(f"epoch_length must be an int, got {type(epoch_length).__name__}")
        if epoch_length < 1:
            raise ValueError(f"epoch_length must be >= 1, got {epoch_length}")
        _check_same_on_all_ranks(epoch_length)
        self.loader = loader
        self.epoch_length = epoch_length
        self.passes = passes
        self.finish_passes = finish_passes
        self.step_multiple = step_multiple
        self.epoch: int | None = None
        self._passes = PassStream(loader.passes.start)
        self._epochs = FixedEpochs(
            self._passes,
            epoch_length,
            stale="this SiftedEpochs iterator is stale: a newer `for` loop or load_state_dict "
            "took over the data stream; start a new `for` loop",
            last_pass=passes - 1 if finish_passes else None,
            step_multiple=step_multiple,
            plan_end=(passes * epoch_length, self._check_plan_end) if finish_passes else None,
            on_end=self._on_finished,
        )

    def __len__(self) -> int:
        return self.epoch_length

    def __iter__(self) -> Iterator[Any]:
        return self._epochs.loop()

    @property
    def finished(self) -> bool:
        """With ``finish_passes``, whether the fit's last pass was seen to end."""
        return self._epochs.finished

    def set_epoch(self, epoch: int) -> None:
        """Record the trainer's epoch (data passes are numbered and seeded here, not by it)."""
        self.epoch = epoch

    @property
    def stats(self) -> Any:
        """The sifting loader's :class:`~hasten.sifting.stats.SiftingStats`."""
        return self.loader.stats

    def _on_finished(self) -> None:
        """Called once the fit's last pass is over (a trainer adapter stops its trainer here)."""

    def _check_plan_end(self) -> None:
        """At the plan's end: warn if the fit's passes are not over (they kept more than the
        plan holds), naming what was left."""
        last = self.passes - 1
        p = self._passes.data_epoch
        if p > last:
            return
        left, buffered = self.loader.passes.left()
        if not self._passes.in_pass:
            left = 0
        later = last - p if self._passes.in_pass else last - p + 1
        if left <= 0 and buffered == 0 and later <= 0:
            return  # the last pass's batches are all out; only its end is not seen yet
        rest = f" and {later} more pass(es)" if later > 0 else ""
        message = (
            f"the fit's {self.passes * self.epoch_length} planned batches ended inside data pass "
            f"{p} of the {self.passes} it trains: {max(left, 0)} incoming batches of that pass"
            f"{rest} were not drawn and {buffered} kept samples not trained on (the passes kept "
            "more than the plan's headroom holds). Plan longer epochs with "
            "epoch_length=<batches per epoch> to finish the passes"
        )
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    @property
    def data_epoch(self) -> int:
        """Index of the data pass in progress (or last finished); -1 before the first."""
        return self._passes.data_epoch

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Any]:
        """The sifting loader's state (mid-pass included) and the stream's position."""
        return {
            "loader": self.loader.state_dict(),
            **self._passes.state_dict(),
            "epoch_length": self.epoch_length,
            "epoch": self.epoch,
            "finished": self.finished,
            "yielded": self._epochs.yielded,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; the next batch is the one that would have come next."""
        if state["epoch_length"] != self.epoch_length:
            raise ValueError(
                f"the checkpoint's epochs have {state['epoch_length']} batches, this SiftedEpochs "
                f"has {self.epoch_length}; build it with epoch_length={state['epoch_length']}"
            )
        self.loader.load_state_dict(state["loader"])
        self.epoch = state["epoch"]
        self._epochs.finished = bool(state.get("finished", False))  # absent from older states
        self._epochs.yielded = int(state.get("yielded", 0))
        self._epochs.invalidate()
        # mid-pass: a new iterator over the loader finishes the interrupted pass
        self._passes.load_state_dict(state, self.loader.passes.resume)

    def __repr__(self) -> str:
        ends = f", ends with pass {self.passes - 1}" if self.finish_passes else ""
        return f"SiftedEpochs({self.loader!r}, epoch_length={self.epoch_length}{ends})"


def _check_same_on_all_ranks(value: int) -> None:
    values = all_gather_ints(value)  # HOST SYNC: once, at construction
    if len(set(values)) > 1:
        raise ValueError(
            f"ranks disagree on the epoch length ({values}): every rank must build the sifting "
            "loader with the same config and an equal shard (a DistributedSampler), or pass the "
            "same epoch_length everywhere; otherwise DistributedDataParallel would hang"
        )
