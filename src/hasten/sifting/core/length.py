"""The length rule: how many batches a sifted data pass yields, at a keep rate.

One rule for everything that plans by length: ``len(SiftingDataloader)``, the fixed-length
epochs of :mod:`hasten.integrations.epochs` (Hugging Face Trainer, Lightning) and
:func:`~hasten.integrations.epochs.expected_batches`. A pass of the wrapped loader is ``batches``
incoming batches of ``batch_size`` samples (``samples`` in all: the last batch may be short).
The first batches of training (the sift delay) pass through unscored, one to one; of the
rest, ``rate`` of the samples are kept and refilled into full batches, the last one rounded up,
or down under ``drop_last``::

    passed  = min(delay batches left, batches)
    yielded = passed + round_up_or_down(rate * (samples - passed * batch_size) / out_batch_size)

Every rank computes the same number: the rate is the rule's nominal one (never what a rank has
observed), and the pass's shape is read from the loader's settings.

A fit of a known number of whole passes (a trainer by epochs) is planned a little longer than
expected, :func:`fit_headroom`, so that the passes' actual batches, which vary with the draws,
fit into the plan and the fit ends where its last pass does::

    planned = expected_batches(passes) + fit_headroom(passes)
    headroom = ceil(min(3 * sd, HEADROOM_SHARE * expected) + (1 - rate))

``sd`` is the standard deviation of the kept samples, in batches (``sqrt(scored * rate *
(1 - rate)) / batch``: at most that of independent draws at the nominal rate), and ``1 - rate``
the first scored batch, kept whole (no history to rank it against yet). Capped at
``HEADROOM_SHARE`` of the expected batches, a fit takes at least ``1 / (1 + HEADROOM_SHARE)``
of its planned steps when its passes keep what they are expected to; one that keeps more than
the plan holds is cut at the plan (the trainers' schedules end there), and says so.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch

from hasten.sifting._runtime import loader_batch_size, loader_drop_last

__all__ = [
    "HEADROOM_SHARE",
    "PassShape",
    "expected_batches",
    "fit_headroom",
    "pass_batches",
    "pass_shape",
]

HEADROOM_SHARE = 0.025
"""The most :func:`fit_headroom` plans beyond the expected batches, as a share of them."""


@dataclass(frozen=True)
class PassShape:
    """One data pass of the wrapped loader, as the length rule sees it."""

    batches: int
    """Incoming batches per pass (``len(loader)``)."""
    batch_size: int
    """Samples per incoming batch."""
    samples: int
    """Samples per pass (the last batch may be short: ``len(sampler)`` where it is known)."""
    drop_last: bool
    """Whether a short last batch is dropped (by the loader, and by sifting's refill)."""


def pass_shape(
    loader: Any,
    batch_size: int | None = None,
    *,
    no_length_fix: str = "train by steps instead of epochs",
    no_batch_size_fix: str = "pass the batch size",
) -> PassShape:
    """The shape of one pass of ``loader`` (a DataLoader, or anything with ``len`` and a batch
    size); ``batch_size`` is the fallback when the loader has none.

    The samples of a pass are ``len(sampler)`` when the loader batches with a plain
    ``BatchSampler`` and keeps its last, short batch; else ``batches * batch_size``.

    Raises:
        TypeError: the loader has no length, or no batch size is known (the ``*_fix``
            arguments say what to do instead: they end the messages).
    """
    try:
        batches = len(loader)
    except TypeError as err:
        raise TypeError(
            f"planning by length needs the length of the wrapped loader, and "
            f"{type(loader).__name__} has none (an IterableDataset without __len__?). Give the "
            f"dataset a __len__, or {no_length_fix}"
        ) from err
    size = loader_batch_size(loader) or batch_size
    if size is None:
        raise TypeError(
            f"planning by length needs the batch size, and the wrapped {type(loader).__name__} "
            f"has none (neither batch_size nor batch_sampler.batch_size: a custom "
            f"batch_sampler?); {no_batch_size_fix}"
        )
    drop_last = loader_drop_last(loader)
    samples = batches * size
    batch_sampler = getattr(loader, "batch_sampler", None)
    if (
        not drop_last
        and type(batch_sampler) is torch.utils.data.BatchSampler
        and batch_sampler.batch_size == size
    ):
        with contextlib.suppress(TypeError):  # the last batch of a pass may be short
            samples = len(batch_sampler.sampler)  # type: ignore[arg-type]
    return PassShape(batches, size, samples, drop_last)


def pass_batches(
    shape: PassShape, rate: float, *, delay_batches: int = 0, out_batch_size: int | None = None
) -> int:
    """Batches one pass yields: ``delay_batches`` passed through, then ``rate`` of the rest
    refilled into batches of ``out_batch_size`` (default: the incoming batch size)."""
    passed = min(max(0, delay_batches), shape.batches)
    kept = rate * max(0, shape.samples - passed * shape.batch_size)
    b = out_batch_size or shape.batch_size
    if shape.drop_last:
        return passed + math.floor(kept / b + 1e-9)
    return passed + math.ceil(kept / b - 1e-9)


def expected_batches(
    shape: PassShape,
    rate: float,
    *,
    sift_delay: int,
    repeat_delay_per_epoch: bool,
    delay_done: int = 0,
    passes: int = 1,
    out_batch_size: int | None = None,
) -> int:
    """Batches ``passes`` passes yield, ``delay_done`` batches of the delay being behind."""
    total, done = 0, delay_done
    for _ in range(passes):
        left = sift_delay if repeat_delay_per_epoch else max(0, sift_delay - done)
        total += pass_batches(shape, rate, delay_batches=left, out_batch_size=out_batch_size)
        done += min(left, shape.batches)
    return total


def fit_headroom(
    shape: PassShape,
    rate: float,
    *,
    sift_delay: int,
    repeat_delay_per_epoch: bool,
    passes: int,
    out_batch_size: int | None = None,
) -> int:
    """Batches to plan beyond :func:`expected_batches` for a fit of ``passes`` whole passes
    (see the module docstring): room for the draws to keep more than expected."""
    expected = expected_batches(
        shape,
        rate,
        sift_delay=sift_delay,
        repeat_delay_per_epoch=repeat_delay_per_epoch,
        passes=passes,
        out_batch_size=out_batch_size,
    )
    scored, done = 0, 0
    for _ in range(passes):
        left = sift_delay if repeat_delay_per_epoch else max(0, sift_delay - done)
        passed = min(left, shape.batches)
        scored += max(0, shape.samples - passed * shape.batch_size)
        done += passed
    b = out_batch_size or shape.batch_size
    share = min(max(rate, 0.0), 1.0)
    if scored == 0 or share in (0.0, 1.0):
        return 0
    sd = math.sqrt(scored * share * (1.0 - share)) / b
    return math.ceil(min(3.0 * sd, HEADROOM_SHARE * expected) + (1.0 - share) - 1e-9)
