"""``SiftingDataloader``: wraps a DataLoader, scores each sample, yields full batches of kept ones.

The loader's stages, per batch of the wrapped loader (the names are those of the latency log
lines; ``stats.stage_seconds`` times each)::

    for epoch in ...:                          # one `for batch in loader` loop = one epoch
        for batch in orig_dataloader:          # load
            if step < sift_delay:              # delay: pass the batch through, unscored
                yield batch; continue
            sb = transform(batch)              # transform: move to the model's device, flatten
            losses = loss_impl.loss(model, sb, batch)    # calculate_relevance_values
                                               #   (model.eval(), torch.inference_mode(),
                                               #    modes restored after)
            keep = policy(losses, history, generator)    # should_sift: the one host sync
            history.add(losses)
            kept = sb.select(keep)             # sift
            buffer.add(kept)                   # accumulate (on the model's device)
            while len(buffer) >= batch_size:
                yield reverse_transform(buffer.pop(batch_size))  # reverse_transform
        if buffer and not drop_last:           # the last, partial batch
            yield reverse_transform(buffer.pop(len(buffer)))

Every yielded batch has the wrapped loader's batch size and the type and structure of its
batches. Each kept row is yielded once; the policy decides which rows are kept (see
:mod:`hasten.sifting.policy`).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from hasten._modules import module_device
from hasten.sifting._generator import SiftGenerator
from hasten.sifting._progress import SAGEMAKER_LOGGER as SAGEMAKER_LOGGER  # kept importable here
from hasten.sifting._progress import Progress, log_batch
from hasten.sifting._progress import logger as logger
from hasten.sifting._runtime import (
    get_loader_generator_states,
    is_iterable_style,
    loader_drop_last,
    set_loader_epoch,
    set_loader_generator_states,
    shuffles_globally,
)
from hasten.sifting.batch import BatchCodec, SiftingBatch, SiftingBatchTransform, codec_for
from hasten.sifting.buffer import KeptBuffer
from hasten.sifting.config import coerce_sift_config
from hasten.sifting.core.dist import gather_counts, rank
from hasten.sifting.core.epochs import LengthPlan, LoaderEpochs, PassSource
from hasten.sifting.core.forward import check_per_sample_losses, eval_modules
from hasten.sifting.core.length import PassShape, pass_shape
from hasten.sifting.core.rules import rule_of
from hasten.sifting.core.state import from_state, to_state
from hasten.sifting.exceptions import (
    LossImplementationNotProvidedException,
    UnsupportedDataFormatException,
)
from hasten.sifting.history import LossHistory
from hasten.sifting.loss import SupportsLoss, as_loss
from hasten.sifting.padding import Padding
from hasten.sifting.policy import SiftPolicy
from hasten.sifting.stats import SiftingStats

__all__ = ["SiftingDataloader"]
_STALE = (
    "this SiftingDataloader iterator is stale: the loader was iterated again or restored with "
    "load_state_dict since it was created; start a new `for` loop"
)
_STATE_VERSION = 2
# 1: buffered rows stored as SiftingBatch objects (needed torch.load(weights_only=False));
# 2: the whole state is plain (tensors, numbers, strings, lists, dicts), rows stored by position.
# The keys of version 2 are _Position's fields plus those state_dict() adds.


@dataclass
class _Position:
    """Where the loader is, as it round-trips through ``state_dict()`` (one key per field)."""

    epoch: int = -1  # data passes started
    sampler_epoch: int | None = None  # last value given to the wrapped loader's set_epoch
    in_epoch: bool = False
    batches_in: int = 0  # this pass
    samples_in: int = 0  # this pass
    short_batch_seen: bool = False
    delay_done: int = 0  # steps passed through (this pass with repeat_delay_per_epoch)
    delay_done_epoch_start: int = 0
    out_batch_size: int | None = None
    # mid-pass: the wrapped loader's generators as the pass began (to replay its order)
    loader_generator_states: list[Tensor] | None = None
    rank_fills: list[int] | None = None  # kept rows per rank this pass
    sifted_out_this_epoch: int = 0  # sifted batches yielded this pass
    warned_nonfinite: bool = False
    warned_delay: bool = False


class SiftingDataloader:
    """Smart sifting: trains on full batches of the samples a model still gets wrong.

    Drop-in for SageMaker's ``smart_sifting.dataloader.sift_dataloader.SiftingDataloader`` (same
    positional and keyword arguments); hasten's extras are keyword-only.

    Args:
        sift_config: A :class:`~hasten.sifting.config.RelativeProbabilisticSiftConfig` (or the
            config of another rule the loader runs, see :mod:`hasten.sifting.core.rules`), or
            the equivalent dict. A config of a sampler-only rule (``UnbiasedPruningConfig``,
            ``StaleRelativePruningConfig``) raises, naming ``PruningSampler``.
        orig_dataloader: The DataLoader (or any re-iterable of batches) to wrap.
        batch_transforms: Optional :class:`~hasten.sifting.batch.SiftingBatchTransform` for
            batch formats the built-in codec does not handle.
        model: The model being trained; scores samples in eval mode.
        loss_impl: A :class:`~hasten.sifting.loss.Loss` (anything with
            ``.loss(model, transformed_batch, original_batch)``) or a plain callable
            ``fn(model, batch) -> Tensor[batch]``, returning one loss per sample.
        log_batch_data: Log the losses of the samples kept and dropped, every batch (copies
            them to the host: for pilot runs).
        batch_format_index: The dimension of every tensor in a batch that indexes samples
            (default 0). Set 1 for feature-major tensors.
        seed: Seed of the sifting generator. Default: ``torch.initial_seed()``, so
            ``torch.manual_seed(s)`` before building the loader makes runs reproducible, and
            the global RNG is not consumed.
        generator: A ready :class:`torch.Generator` on the scoring device (instead of ``seed``).
        device: Where to score and accumulate (default: the device of the model's parameters).
        batch_size: Size of yielded batches when the wrapped loader has no ``batch_size``
            (a custom ``batch_sampler``); default: the size of its first batch.
        log_interval: Log a progress line (SageMaker's ``key: value`` form, see
            ``docs/sifting.md``) for the first sifted batch, every this many yielded batches and
            at the end of each data pass (``None`` or 0: never).
        pad_values: For batches padded to their own longest sequence (dynamic padding): the
            value to pad each field with when merged rows differ in length, by field name, e.g.
            ``{"input_ids": tokenizer.pad_token_id}``. ``attention_mask``, ``token_type_ids``,
            ``labels`` (-100) ... have defaults; ``input_ids`` never does. See
            :mod:`hasten.sifting.padding`. Built-in codec only (a batch transform pads itself).
        padding_side: Pad on the ``"right"`` (default) or ``"left"``, as the tokenizer does.

    Attributes:
        stats: A :class:`~hasten.sifting.stats.SiftingStats`, updated as batches go by.
        last_sample_ids: For the last yielded batch, the position of each row in its epoch's
            stream of samples (int64 tensor, ``None`` for batches passed through unscored).
        passes: The loader's data passes as fixed-length epochs draw them (a
            :class:`~hasten.sifting.core.epochs.PassSource`: what
            :class:`~hasten.integrations.epochs.SiftedEpochs` uses).

    Length, epochs, resume: see :meth:`__len__`, :meth:`set_epoch` and :meth:`state_dict`.
    Reading ``len()`` fixes the length of every later ``for`` loop (``len()`` is then exact, as
    Lightning and the HF Trainer need it).
    Attributes it does not define (``dataset``, ``sampler`` ...) come from ``orig_dataloader``.
    """

    def __init__(
        self,
        sift_config: Any,
        orig_dataloader: Any,
        batch_transforms: SiftingBatchTransform | None = None,
        model: nn.Module | None = None,
        loss_impl: Any = None,
        log_batch_data: bool = False,
        batch_format_index: int | None = None,
        *,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
        batch_size: int | None = None,
        log_interval: int | None = 20,
        pad_values: Mapping[str | int, float | bool] | None = None,
        padding_side: str = "right",
    ) -> None:
        self.sift_config = coerce_sift_config(sift_config)
        self.orig_dataloader = orig_dataloader
        self.model = _check_model(model)
        self.loss_impl: SupportsLoss = _check_loss(loss_impl)
        self._loss_name = f"{type(self.loss_impl).__name__}.loss"  # for messages
        _check_arguments(
            batch_transforms,
            batch_format_index,
            pad_values,
            seed,
            generator,
            batch_size,
            log_interval,
        )
        padding = Padding(pad_values, padding_side)
        self.batch_transforms = batch_transforms
        self.log_batch_data = bool(log_batch_data)
        self.batch_format_index = batch_format_index
        self._codec: BatchCodec = codec_for(batch_transforms, batch_format_index, padding)
        self._device = None if device is None else torch.device(device)
        self.log_interval = log_interval or 0

        rule = rule_of(self.sift_config)
        self._policy: SiftPolicy = rule.policy(self.sift_config)
        self._nominal_keep_rate = float(rule.nominal_keep_rate(self.sift_config))  # type: ignore[misc]
        self._history = LossHistory(self.sift_config.loss_history_length)
        self._gen = SiftGenerator(seed, generator)
        self.stats = SiftingStats()
        self.last_sample_ids: Tensor | None = None

        orig_bs = getattr(orig_dataloader, "batch_size", None)
        self._fixed_batch_size = orig_bs if isinstance(orig_bs, int) else None
        # the position: everything that round-trips through state_dict() besides the history,
        # stats, generator, buffer and stream (see _Position)
        self._pos = _Position(out_batch_size=self._fixed_batch_size or batch_size)
        self._buffer = KeptBuffer()
        self._pending_buffer: dict[str, Any] | None = None  # loaded, not yet re-created
        self._resume = False
        self._progress = Progress()
        self._pass_batches: int | None = None  # len() of the wrapped loader this pass
        self._modules: list[nn.Module] | None = None  # the model's modules, listed each epoch
        self._pass_token = 0  # invalidates running data-pass iterators
        self.epoch: int | None = None  # the last value given to set_epoch
        # the data passes, as fixed-length epochs draw them (here and in SiftedEpochs)
        self.passes = PassSource(
            self._start_pass, self._iter_pass, self._length_plan, self._pass_left
        )
        # the loops: one data pass each until len() is read, then len() batches of a stream
        self._epochs = LoaderEpochs(self.passes, stale=_STALE)

    # ------------------------------------------------------------------ protocol

    def __iter__(self) -> Iterator[Any]:
        return self._epochs.loop(self._iter_pass, self._pos.epoch)

    def __len__(self) -> int:
        """Batches in every ``for`` loop over the loader: exact, and fixed when first read.

        The first call outside a running ``for`` loop (a trainer reading the length to plan
        its epochs, ``tqdm(loader)``; not ``list(loader)``, which asks after its loop began:
        a value read between ``iter()`` and the first batch is fixed only if a new loop
        starts instead, as when Lightning probes the loader with ``iter()`` before planning)
        computes the expected batches of a data pass at the config's expected
        keep rate: the batches passed through during the sift delay, plus the kept samples of
        the rest divided by the batch size (rounded up, or down under ``drop_last``). From then
        on that number is the length of every ``for`` loop: each loop yields exactly ``len()``
        batches, drawn from a continuous stream of data passes. A pass that keeps more than
        expected goes on in the next loop; one that keeps less is followed by the next pass
        within the same loop. So a trainer that ends its epoch after ``len()`` batches and plans
        its schedule from it (Lightning's ``estimated_stepping_batches``, the HF Trainer's
        ``max_steps``) takes exactly the steps it planned, and cuts no pass: every sample of
        every pass is drawn once and every kept one is trained on (only the pass in progress
        when training stops is left unfinished). Each data pass ``p`` calls the wrapped
        loader's ``set_epoch(p)``.

        Until then, one ``for`` loop is one whole data pass, of a variable number of batches,
        and ``len()`` read inside it is an estimate of that pass at the keep rate observed so
        far.

        Raises:
            TypeError: when the wrapped loader has no length (an ``IterableDataset`` without
                ``__len__``): give the dataset a ``__len__`` or train by steps; or when its batch
                size cannot be found (a custom ``batch_sampler`` without ``batch_size``): pass
                ``SiftingDataloader(..., batch_size=N)``.
        """
        return self._epochs.read_len(self._expected_pass_length)

    def _expected_pass_length(self, observed: bool) -> int:
        """Expected batches of the next data pass (:mod:`hasten.sifting.core.length`), at the
        rule's nominal keep rate (the same on every rank), or at the rate ``observed`` so far
        once something was scored."""
        return self._length_plan().batches(rate=self.stats.keep_rate if observed else None)

    def _length_plan(self, **fixes: str) -> LengthPlan:
        """The length rule's inputs now (see :class:`~hasten.sifting.core.epochs.LengthPlan`)."""
        cfg, pos = self.sift_config, self._pos
        return LengthPlan(
            self._pass_shape(**fixes),
            self._nominal_keep_rate,
            cfg.sift_delay,
            cfg.repeat_delay_per_epoch,
            pos.out_batch_size,
            pos.delay_done_epoch_start if pos.in_epoch else pos.delay_done,
        )

    def _pass_left(self) -> tuple[int, int]:
        """Incoming batches of the pass in progress not drawn yet, and kept samples buffered."""
        return self._pass_shape().batches - self._pos.batches_in, self._buffer.count

    def _pass_shape(self, **fixes: str) -> PassShape:
        """One pass of the wrapped loader as the length rule sees it; ``fixes`` replace the
        advice ending its errors (see :func:`~hasten.sifting.core.length.pass_shape`)."""
        return pass_shape(
            self.orig_dataloader,
            self._pos.out_batch_size,
            **{
                "no_length_fix": "train by steps (max_steps) instead of epochs",
                "no_batch_size_fix": "pass SiftingDataloader(..., batch_size=N)",
                **fixes,
            },
        )

    def _start_pass(self, data_epoch: int) -> Iterator[Any]:
        self._set_pass_epoch(data_epoch)
        return self._iter_pass()

    def _iter_pass(self) -> Iterator[Any]:
        """An iterator over one data pass (the wrapped loader once), invalidating older ones."""
        self._pass_token += 1
        return self._run(self._pass_token)

    def set_epoch(self, epoch: int) -> None:
        """Record ``epoch`` and pass it to the wrapped loader's ``set_epoch`` and to its sampler's
        (``DistributedSampler``), where they exist. Call it before each epoch, as usual.

        Once ``len()`` has been read, ``for`` loops no longer match data passes (see
        :meth:`__len__`): the loader then numbers the passes and seeds each itself, and
        ``epoch`` is only recorded (as :attr:`epoch`)."""
        self.epoch = epoch
        if self._epochs.length is None:
            self._set_pass_epoch(epoch)

    def _set_pass_epoch(self, epoch: int) -> None:
        self._pos.sampler_epoch = epoch
        set_loader_epoch(self.orig_dataloader, epoch)

    @property
    def data_epoch(self) -> int:
        """Index of the data pass (over the wrapped loader) in progress or last finished; -1
        before the first."""
        return self._pos.epoch

    def __getattr__(self, name: str) -> Any:
        # only called for names not found normally: delegate to the wrapped loader
        if name.startswith("_") or "orig_dataloader" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.orig_dataloader, name)

    def __repr__(self) -> str:
        return (
            f"SiftingDataloader({self.sift_config!r}, "
            f"orig_dataloader={type(self.orig_dataloader).__name__}, "
            f"loss_impl={self.loss_impl!r})"
        )

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this loader is, mid-epoch included.

        Holds: the loss history, counters and stats, the delay position, the sifting
        generator's state, the number of batches consumed from the wrapped loader this epoch,
        the state its generators had when the epoch began, and the kept rows not yet yielded,
        by position (which consumed batch, which rows), not by value.

        The state is plain data (tensors, numbers, strings, ``None``, lists and dicts), so a
        checkpoint holding it loads with ``torch.load(..., weights_only=True)`` (PyTorch's
        default, and Lightning's).

        To resume, build the same model (load its weights), the same wrapped loader and a new
        ``SiftingDataloader`` with the same arguments, call :meth:`load_state_dict`, then
        iterate: the loader re-creates the epoch's order and skips the batches already consumed
        (they are loaded but not scored; those holding buffered rows are transformed again to
        re-create the rows), so it yields the batches an uninterrupted run would.
        The order can be re-created when the wrapped loader shuffles with its own
        ``generator=torch.Generator().manual_seed(...)``, with a seeded ``DistributedSampler``
        (call :meth:`set_epoch` as usual), or does not shuffle.
        """
        pos = to_state(self._pos)
        if not self._pos.in_epoch:  # between epochs: the generators as they are now
            pos["loader_generator_states"] = get_loader_generator_states(self.orig_dataloader)
        return {
            "version": _STATE_VERSION,
            "sift_config": _config_repr(self.sift_config),
            "seed": self._gen.seed,
            "generator": self._gen.state_dict(),
            "history": self._history.state_dict(),
            "stats": self.stats.as_dict(),
            **pos,
            "buffer": self._buffer.state_dict()
            if self._pending_buffer is None
            else self._pending_buffer,
            # fixed-length loops (len() was read): their length and the stream's position
            **self._epochs.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; the next iteration continues from there."""
        version = state.get("version") if isinstance(state, dict) else None
        if version != _STATE_VERSION:
            if isinstance(version, int) and version < _STATE_VERSION:
                raise ValueError(
                    f"this SiftingDataloader state was written by an earlier hasten (state "
                    f"version {version}; this hasten reads version {_STATE_VERSION}, which stores "
                    "buffered rows by position so that checkpoints load with "
                    "weights_only=True). It cannot be resumed exactly: resume from a checkpoint "
                    "written by this hasten, or skip load_state_dict to start the sifted stream "
                    "afresh (new loss history, sift delay restarted)"
                )
            raise ValueError(
                f"unsupported SiftingDataloader state version {version!r} (this hasten reads "
                f"{_STATE_VERSION}); pass the output of SiftingDataloader.state_dict()"
            )
        if state["sift_config"] != _config_repr(self.sift_config):
            warnings.warn(
                f"resuming sifting with a different config: saved {state['sift_config']}, now "
                f"{_config_repr(self.sift_config)}",
                stacklevel=2,
            )
        self._gen.load(state["seed"], state["generator"])
        self._history.load_state_dict(state["history"], self._history.device)
        self.stats = SiftingStats()
        self.stats.load_dict(state["stats"])
        self._pos = from_state(_Position, state)
        self._buffer = KeptBuffer()
        # re-created from the replayed batches on the next iteration (see _continue_epoch)
        self._pending_buffer = state["buffer"] if state["buffer"]["count"] else None
        self._resume = True
        self._pass_token += 1
        self._epochs.load_state_dict(state)
        if self._pos.sampler_epoch is not None:
            self.set_epoch(self._pos.sampler_epoch)
        if (
            self._pos.in_epoch
            and self._pos.loader_generator_states is None
            and shuffles_globally(self.orig_dataloader)
        ):
            warnings.warn(
                "resuming mid-epoch, but the wrapped DataLoader shuffles with the global RNG, so "
                "this epoch's order cannot be replayed and some samples may repeat or be "
                "skipped until the epoch ends. Pass generator=torch.Generator().manual_seed(s) "
                "to the DataLoader for an exact resume",
                stacklevel=2,
            )

    # ------------------------------------------------------------------ iteration

    @property
    def _drop_last(self) -> bool:
        return loader_drop_last(self.orig_dataloader)

    def _in_delay(self) -> bool:
        return self._pos.delay_done < self.sift_config.sift_delay

    def _run(self, token: int) -> Iterator[Any]:
        device = self._device or module_device(self.model)
        if device.type == "meta":
            raise RuntimeError(
                "SiftingDataloader cannot score with a model on the meta device (its parameters "
                "hold no data). Materialize it first: model.to_empty(device='cpu' or 'cuda'), "
                "then load or initialize its weights; or pass device=<the scoring device>"
            )
        self._epochs.pass_begins()
        it = self._begin_epoch(device)
        stats, stage = self.stats, self.stats.stage_seconds
        mark = time.perf_counter()
        while True:
            if token != self._pass_token:
                raise RuntimeError(_STALE)
            t0 = time.perf_counter()
            stats.wall_seconds += t0 - mark
            mark = t0
            try:
                batch = next(it)
            except StopIteration:
                break
            stats.load_seconds += time.perf_counter() - t0
            self._pos.batches_in += 1
            stats.num_batches_in += 1
            if self._in_delay():
                n = self._count(batch)
                self._pos.samples_in += n
                self._pos.delay_done += 1
                stats.num_orig_samples_seen += n
                stats.num_orig_samples_kept += n
                stats.num_batches_out += 1
                stats.num_samples_yielded += n
                self.last_sample_ids = None
                self._maybe_log()
                if self._pos.batches_in == self._pass_batches:  # the pass's last batch, unscored
                    self._check_delay_reached()
                yield batch
                continue
            self._sift(batch, device, stage)
            while self._ready() > 0:
                yield self._emit(self._pos.out_batch_size, stage)  # type: ignore[arg-type]
        stats.wall_seconds += time.perf_counter() - mark
        yield from self._finish_epoch(stage)
        self._epochs.pass_ends()

    def _begin_epoch(self, device: torch.device) -> Iterator[Any]:
        orig = self.orig_dataloader
        self._modules = None  # re-list the model's modules (they may have changed)
        if self._resume:  # restored from a checkpoint: put the loader's generators back
            self._resume = False
            set_loader_generator_states(orig, self._pos.loader_generator_states)
            if self._pos.in_epoch:
                return self._continue_epoch(device)
        self._pos.epoch += 1
        self._pos.in_epoch = True
        self._pos.batches_in = self._pos.samples_in = self._pos.sifted_out_this_epoch = 0
        self._pos.short_batch_seen = False
        self._buffer = KeptBuffer()
        self._pending_buffer = None
        self._pos.rank_fills = None
        if self.sift_config.repeat_delay_per_epoch:
            self._pos.delay_done = 0
        self._pos.delay_done_epoch_start = self._pos.delay_done
        self._pos.loader_generator_states = get_loader_generator_states(orig)
        self._pass_batches = _sized(orig)
        return iter(orig)

    def _continue_epoch(self, device: torch.device) -> Iterator[Any]:
        """Re-create the checkpointed epoch's iterator and skip the batches it had consumed.

        The kept rows the checkpoint had not yielded are re-created from the skipped batches
        they came from (transformed as when they were scored, then the same rows selected).
        """
        it = iter(self.orig_dataloader)
        self._pass_batches = _sized(self.orig_dataloader)
        t0 = time.perf_counter()
        pending = self._pending_buffer
        self._pending_buffer = None
        wanted = {} if pending is None else {c["batch"]: c for c in pending["chunks"]}
        buffer = KeptBuffer()
        for i in range(self._pos.batches_in):
            try:
                batch = next(it)
            except StopIteration:
                raise RuntimeError(
                    f"cannot resume: the checkpoint consumed {self._pos.batches_in} batches of "
                    f"this epoch but the wrapped loader has only {i}; resume with the same "
                    "data and loader settings"
                ) from None
            chunk = wanted.get(i)
            if chunk is not None:
                buffer.add(*self._recreate_rows(batch, chunk, device))
        self.stats.load_seconds += time.perf_counter() - t0
        if pending is not None and buffer.count != pending["count"]:
            raise RuntimeError(
                f"cannot resume: the checkpoint buffered {pending['count']} kept rows but "
                f"{buffer.count} were found in the replayed batches; resume with the same data "
                "and loader settings"
            )
        self._buffer = buffer
        return it

    def _recreate_rows(
        self, batch: Any, chunk: dict[str, Any], device: torch.device
    ) -> tuple[SiftingBatch, Tensor, int, tuple[int, int]]:
        """A buffered chunk of a checkpoint, selected again from its replayed source batch."""
        sb, _, _ = self._codec.encode(batch, device)
        rows = chunk["rows"].to(device=device, dtype=torch.int64)
        n = rows.numel()
        if n and int(rows.max()) >= len(sb):  # HOST SYNC: resume only
            raise RuntimeError(
                f"cannot resume: the checkpoint buffered row {int(rows.max())} of batch "
                f"{chunk['batch']} of this epoch, but the replayed batch has {len(sb)} rows; "
                "resume with the same data and loader settings"
            )
        start = int(chunk["start"])
        return sb.select(rows), rows + start, n, (int(chunk["batch"]), start)

    def _count(self, batch: Any) -> int:
        n = self._codec.count(batch)
        self._check_batch_size(n)
        return n

    def _check_batch_size(self, n: int) -> None:
        fixed = self._fixed_batch_size
        if fixed is None:
            return
        if n > fixed or self._pos.short_batch_seen:
            what = (
                f"a batch of {n} samples but the DataLoader's batch_size is {fixed}"
                if n > fixed
                else "a full batch after a short one"
            )
            raise UnsupportedDataFormatException(
                f"sifting counted {what}: the batch is probably not laid out sample-first. "
                "Pass batch_format_index=<the dimension that indexes samples> or "
                "batch_transforms=<a SiftingBatchTransform>"
            )
        if n < fixed and not is_iterable_style(self.orig_dataloader):
            self._pos.short_batch_seen = True  # only the last batch of an epoch may be short

    def _sift(self, batch: Any, device: torch.device, stage: dict[str, float]) -> None:
        stats = self.stats
        t0 = time.perf_counter()
        sb, transformed, original = self._codec.encode(batch, device)
        n = len(sb)
        self._check_batch_size(n)
        if self._pos.out_batch_size is None:
            self._pos.out_batch_size = n
        t1 = time.perf_counter()
        stage["transform"] += t1 - t0

        losses = self._score(transformed, original, n)
        t2 = time.perf_counter()
        stage["calculate_relevance_values"] += t2 - t1

        gen = self._gen.on(losses.device)
        sel = self._policy(losses, self._history.values(), gen)
        self._history.add(losses)
        keep = sel.keep
        order = torch.argsort(keep, descending=True, stable=True)  # kept rows first, in order
        counts = torch.stack((keep, torch.isfinite(losses))).sum(1)
        fills = gather_counts(counts)  # HOST SYNC: the one per incoming batch
        n_kept, n_finite = fills[rank()]
        n_bad = n - n_finite
        t3 = time.perf_counter()
        stage["should_sift"] += t3 - t2

        if self._pos.rank_fills is None:
            self._pos.rank_fills = [0] * len(fills)
        for r, (k, _) in enumerate(fills):
            self._pos.rank_fills[r] += k
        idx = order[:n_kept]
        kept = sb.select(idx)
        ids = idx + self._pos.samples_in
        t4 = time.perf_counter()
        stage["sift"] += t4 - t3

        self._buffer.add(kept, ids, n_kept, (self._pos.batches_in - 1, self._pos.samples_in))
        stage["accumulate"] += time.perf_counter() - t4

        self._pos.samples_in += n
        stats.num_batches_scored += 1
        stats.num_orig_samples_seen += n
        stats.num_orig_samples_scored += n
        stats.num_orig_samples_kept += n_kept
        stats.num_orig_samples_sifted_out += n - n_kept
        if n_bad:
            stats.num_nonfinite_losses += n_bad
            if not self._pos.warned_nonfinite:
                self._pos.warned_nonfinite = True
                warnings.warn(
                    f"sifting scored {n_bad} sample(s) with a NaN or infinite loss; they are "
                    "kept for training (and ranked as the highest loss). Counted in "
                    "loader.stats.num_nonfinite_losses; this warning is shown once",
                    RuntimeWarning,
                    stacklevel=3,
                )
        if self.log_batch_data:
            log_batch(self.stats.num_batches_in, losses, keep)

    def _score(self, transformed: Any, original: Any, n: int) -> Tensor:
        modules = self._modules
        if modules is None:
            modules = self._modules = list(self.model.modules())
        with eval_modules(modules):
            losses = self.loss_impl.loss(self.model, transformed, original)
        return check_per_sample_losses(losses, n, self._loss_name)

    def _ready(self) -> int:
        """Sifted batches that every rank can yield now."""
        b = self._pos.out_batch_size
        if self._pos.rank_fills is None or b is None:
            return 0
        return min(self._pos.rank_fills) // b - self._pos.sifted_out_this_epoch

    def _emit(self, n: int, stage: dict[str, float]) -> Any:
        t0 = time.perf_counter()
        sb, ids = self._buffer.pop(n)
        t1 = time.perf_counter()
        stage["accumulate"] += t1 - t0
        out = self._codec.decode(sb)
        stage["reverse_transform"] += time.perf_counter() - t1
        self._pos.sifted_out_this_epoch += 1
        self.last_sample_ids = ids
        self.stats.num_batches_out += 1
        self.stats.num_samples_yielded += n
        self._maybe_log()
        return out

    def _finish_epoch(self, stage: dict[str, float]) -> Iterator[Any]:
        b = self._pos.out_batch_size
        fills = self._pos.rank_fills
        if fills is not None and b is not None:
            done = self._pos.sifted_out_this_epoch * b
            lefts = [f - done for f in fills]
            rounding = math.floor if self._drop_last else math.ceil
            more = min(int(rounding(left / b)) for left in lefts)
            for _ in range(more):
                yield self._emit(min(b, self._buffer.count), stage)
        dropped = self._buffer.count
        if dropped:
            self.stats.num_samples_dropped_at_epoch_end += dropped
            self._buffer = KeptBuffer()
        self._pos.in_epoch = False
        self._check_delay_reached()
        self._maybe_log(force=True)

    def _check_delay_reached(self) -> None:
        """Warn, once, when a data pass (or training) ends with no batch scored yet."""
        if self._pos.warned_delay or not self._in_delay() or self.stats.num_batches_scored:
            return
        self._pos.warned_delay = True
        cfg = self.sift_config
        where = "this pass" if cfg.repeat_delay_per_epoch else "so far"
        warnings.warn(
            f"nothing was sifted: sift_delay={cfg.sift_delay} but only {self._pos.delay_done} "
            f"batches were seen {where} ({self.stats.num_orig_samples_seen} samples, all passed "
            "through unscored). Lower sift_delay below the number of batches you train on, e.g. "
            "RelativeProbabilisticSiftConfig(..., loss_based_sift_config={'sift_config': "
            "{'sift_delay': 10}}); this warning is shown once",
            RuntimeWarning,
            stacklevel=3,
        )

    # ------------------------------------------------------------------ helpers

    def _maybe_log(self, force: bool = False) -> None:
        self._progress.line(
            self.log_interval,
            self.stats,
            self._pos.epoch,
            self._pos.out_batch_size or 0,
            self._buffer.count,
            force,
        )


def _sized(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


# --------------------------------------------------------------------------- module helpers


def _check_model(model: Any) -> nn.Module:
    if model is None:
        raise LossImplementationNotProvidedException(
            "SiftingDataloader needs the model to score samples: pass model=<your nn.Module>"
        )
    if not isinstance(model, nn.Module):
        raise LossImplementationNotProvidedException(
            f"model must be a torch.nn.Module, got {type(model).__name__}"
        )
    return model


def _check_loss(loss_impl: Any) -> SupportsLoss:
    if loss_impl is None:
        raise LossImplementationNotProvidedException(
            "SiftingDataloader needs loss_impl: a hasten.sifting.Loss subclass whose "
            "loss(model, transformed_batch, original_batch) returns one loss per sample, or a "
            "callable fn(model, batch) -> Tensor[batch_size]"
        )
    if isinstance(loss_impl, type):
        raise LossImplementationNotProvidedException(
            f"loss_impl is the class {loss_impl.__name__}; pass an instance: "
            f"loss_impl={loss_impl.__name__}()"
        )
    if isinstance(loss_impl, nn.Module) and not callable(getattr(loss_impl, "loss", None)):
        raise LossImplementationNotProvidedException(
            f"loss_impl is a torch loss module ({type(loss_impl).__name__}), which takes "
            "(prediction, target); sifting needs the model and the batch. Wrap it: "
            "loss_impl=lambda model, batch: criterion(model(batch[0]), batch[1]) with "
            "reduction='none'"
        )
    loss = as_loss(loss_impl)
    if loss is None:
        raise LossImplementationNotProvidedException(
            f"loss_impl must implement loss(model, transformed_batch, original_batch) or be a "
            f"callable fn(model, batch); got {type(loss_impl).__name__}"
        )
    return loss


def _check_arguments(
    batch_transforms: Any,
    batch_format_index: Any,
    pad_values: Any,
    seed: Any,
    generator: Any,
    batch_size: Any,
    log_interval: Any,
) -> None:
    """The constructor's argument checks (the model's and the loss's are above)."""
    if batch_transforms is not None and not (
        callable(getattr(batch_transforms, "transform", None))
        and callable(getattr(batch_transforms, "reverse_transform", None))
    ):
        raise TypeError(
            f"batch_transforms must be a SiftingBatchTransform (with transform() and "
            f"reverse_transform()), got {type(batch_transforms).__name__}"
        )
    if batch_format_index is not None and (
        isinstance(batch_format_index, bool)
        or not isinstance(batch_format_index, int)
        or batch_format_index < 0
    ):
        raise ValueError(
            f"batch_format_index must be a dimension index >= 0 (0: samples along the "
            f"first dimension, 1: along the second) or None, got {batch_format_index!r}"
        )
    if batch_transforms is not None and pad_values is not None:
        raise ValueError(
            "pad_values applies to the built-in batch codec; with batch_transforms, pad in "
            "your SiftingBatch's concat() instead"
        )
    if seed is not None and generator is not None:
        raise ValueError("pass either seed or generator, not both")
    for name, value in (("batch_size", batch_size), ("log_interval", log_interval)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise ValueError(f"{name} must be a non-negative int or None, got {value!r}")
    if batch_size == 0:
        raise ValueError("batch_size must be >= 1")


def _config_repr(config: Any) -> Any:
    """The config as plain data for the state (its ``to_dict()``), else its ``repr``."""
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        data = to_dict()
        if _is_plain(data):
            return data
    return repr(config)


def _is_plain(obj: Any) -> bool:
    """Whether ``obj`` is made of what ``torch.load(weights_only=True)`` restores as is."""
    if obj is None or isinstance(obj, (bool, int, float, str, Tensor)):
        return True
    if isinstance(obj, (list, tuple)):
        return type(obj) in (list, tuple) and all(_is_plain(x) for x in obj)
    if isinstance(obj, dict):
        return type(obj) is dict and all(
            isinstance(k, (str, int)) and _is_plain(v) for k, v in obj.items()
        )
    return False
