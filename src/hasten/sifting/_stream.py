"""One data pass after another as one stream of batches: the core of fixed-length epochs.

Both :class:`~hasten.sifting.SiftingDataloader` (once its ``len()`` has been read) and
:class:`~hasten.integrations.epochs.SiftedEpochs` cut this stream into epochs of a fixed number
of batches; a data pass that does not fit into one epoch continues in the next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["END", "PassStream"]

END: Any = object()
"""What :meth:`PassStream.next` returns instead of a batch when the last pass it may run is over."""


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
