"""Smart sifting in Lightning: a sifting loader from a ``LightningDataModule``, and its metrics.

The loader scores samples with the model being trained, so it needs the ``LightningModule``. A
``LightningDataModule`` reaches it through ``self.trainer.lightning_module`` once the Trainer has
attached both, which is the case when Lightning calls ``train_dataloader()``::

    from hasten.integrations.lightning import TrainingMetricsRecorder, sifting_dataloader

    class DataModule(L.LightningDataModule):
        def train_dataloader(self):
            loader = DataLoader(self.train_set, batch_size=32, shuffle=True)
            return sifting_dataloader(self.trainer, loader, sift_config, loss=PerSampleCrossEntropy())

    trainer = L.Trainer(max_epochs=3, callbacks=[TrainingMetricsRecorder()])
    trainer.fit(model, datamodule=DataModule())

What :func:`sifting_dataloader` takes care of:

* **Distributed sampler.** Lightning shards a plain ``DataLoader`` by swapping in a
  ``DistributedSampler`` (``use_distributed_sampler=True``, its default), but leaves any other
  iterable alone, so a sifting loader that wrapped an unsharded ``DataLoader`` would feed every
  rank the whole dataset. The inner loader gets the same treatment Lightning would give it,
  before it is wrapped; with ``use_distributed_sampler=False`` it is left as you built it.
* **Epoch length.** Lightning reads ``len(train_dataloader)`` once and ends each epoch after that
  many batches, cutting a longer sifting pass (its remaining kept samples never trained on) and
  planning schedules (``estimated_stepping_batches``) by it. The loader is returned as a
  :class:`~hasten.integrations.epochs.SiftedEpochs`: epochs of exactly that length over an
  endless stream of data passes; nothing is cut or lost. With ``max_epochs=E`` (and no
  ``max_steps``) an epoch is the expected sifted length of ``E`` passes divided by ``E``.
* **Epoch seeding.** Lightning calls ``set_epoch`` on the samplers it can see; the returned
  loader shows it none, and numbers and seeds the data passes itself (``set_epoch(p)`` on the
  inner sampler before pass ``p``), so a pass straddling two Lightning epochs keeps its order.
* **Checkpoints.** The returned loader has a ``state_dict``, so Lightning saves the sifted
  stream's state (loss history, counters, position in the data pass, kept rows not yet
  yielded, by position) in its checkpoints. The state is plain data, so checkpoints load with
  Lightning's default ``weights_only=True``, and ``trainer.fit(..., ckpt_path=...)`` continues
  the exact stream: mid-epoch (Lightning restores the state itself) and at an epoch boundary
  (Lightning skips loader states there, as a plain ``DataLoader`` starts a new epoch afresh,
  but the sifted stream crosses epochs, so :func:`sifting_dataloader` restores it). Under DDP
  Lightning saves rank 0's checkpoint only: every rank's state is gathered into it (one
  ``all_gather_object`` per checkpoint, which Lightning runs on every rank) and each rank
  resumes from its own, with the same number of processes. ``checkpoint=False`` leaves the
  state out: a resumed fit then starts a fresh sifted stream.

``hasten.compile(lightning_module)`` compiles the module in place before ``trainer.fit``; the
Trainer and the sifting scorer then both run the compiled module.
"""

from __future__ import annotations

from typing import Any

try:
    import lightning.pytorch as pl
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "hasten's Lightning integration needs lightning; install it with "
        "`pip install 'hasten[lightning]'`"
    ) from err

import torch
from torch import nn
from torch.utils.data import DataLoader

from hasten.integrations.epochs import SiftedEpochs, expected_batches
from hasten.integrations.lightning_metrics import TrainingMetricsRecorder
from hasten.sifting.loader import SiftingDataloader

__all__ = ["TrainingMetricsRecorder", "sifting_dataloader"]


def sifting_dataloader(
    trainer: pl.Trainer,
    dataloader: DataLoader,
    sift_config: Any,
    loss: Any,
    *,
    model: nn.Module | None = None,
    epoch_length: int | None = None,
    checkpoint: bool = True,
    **loader_kwargs: Any,
) -> Any:
    """A sifting loader for ``LightningDataModule.train_dataloader()`` (see the module docstring).

    Args:
        trainer: The Lightning ``Trainer`` (``self.trainer`` inside a DataModule).
        dataloader: The training ``DataLoader`` to sift.
        sift_config: A :class:`~hasten.sifting.RelativeProbabilisticSiftConfig` (or a dict).
        loss: Per-sample loss: a :class:`~hasten.sifting.Loss` or a callable ``fn(model, batch)``.
        model: The module that scores samples; default ``trainer.lightning_module``.
        epoch_length: Batches per Lightning epoch; default as described in the module docstring.
        checkpoint: Let Lightning save and restore the sifted stream's state (see the module
            docstring); ``False``: a resumed fit starts a fresh sifted stream.
        **loader_kwargs: Keyword arguments for :class:`~hasten.sifting.SiftingDataloader`.

    Returns:
        A :class:`~hasten.integrations.epochs.SiftedEpochs` over the sifting loader (the
        default), or with ``checkpoint=False`` a view of one without ``state_dict``; either has
        ``.loader``, ``.stats``, ``.data_epoch`` and an exact ``len()``.

    Raises:
        TypeError: ``trainer`` is not a Lightning ``Trainer``.
        ValueError: no model: the Trainer has no ``LightningModule`` attached yet.
    """
    if not isinstance(trainer, pl.Trainer):
        raise TypeError(
            f"sifting_dataloader needs the Lightning Trainer (self.trainer in a DataModule), got "
            f"{type(trainer).__name__}"
        )
    if model is None:
        model = _attached_module(trainer)
    if isinstance(dataloader, DataLoader):
        dataloader = _with_distributed_sampler(trainer, dataloader)
    sifted = SiftingDataloader(
        sift_config, dataloader, model=model, loss_impl=loss, **loader_kwargs
    )
    if epoch_length is not None:
        stream = _LightningEpochs(sifted, epoch_length)
    elif trainer.max_steps == -1 and trainer.max_epochs is not None and trainer.max_epochs > 0:
        stream = _LightningEpochs(sifted, passes=trainer.max_epochs)
    else:
        stream = _LightningEpochs(sifted, max(1, expected_batches(sifted, 1, delay=False)))
    if not checkpoint:
        return _WithoutState(stream)
    _restore_at_epoch_boundary(trainer, stream)
    return stream


class _LightningEpochs(SiftedEpochs):
    """:class:`SiftedEpochs` whose state holds every rank's (Lightning saves rank 0's only).

    Lightning counts the batches of an epoch itself, so a resumed fit may also plan epochs of
    another length (``max_epochs`` raised, say): the stream's position is restored and the new
    length kept.
    """

    def state_dict(self) -> dict[str, Any]:
        return {"world_size": _world_size(), "ranks": _gather(super().state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ranks = state.get("ranks") if isinstance(state, dict) else None
        if not isinstance(ranks, list):
            raise ValueError(
                "this Lightning checkpoint's train dataloader state is not a hasten sifting "
                "stream's; resume with the DataModule that wrote it, or pass checkpoint=False "
                "to sifting_dataloader to start a fresh sifted stream"
            )
        world = _world_size()
        if len(ranks) != world:
            raise ValueError(
                f"the checkpoint's sifting state comes from {len(ranks)} process(es), this run "
                f"has {world}: the sifted stream resumes exactly only with the same number of "
                "processes. Pass checkpoint=False to sifting_dataloader to start a fresh "
                "sifted stream instead"
            )
        own = dict(ranks[_rank()])
        own["epoch_length"] = self.epoch_length  # Lightning plans the epochs; see the class doc
        super().load_state_dict(own)


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _gather(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``state`` (a collective: every rank must call it)."""
    world = _world_size()
    if world == 1:
        return [state]
    out: list[Any] = [None] * world
    torch.distributed.all_gather_object(out, state)
    return out


def _restore_at_epoch_boundary(trainer: pl.Trainer, stream: SiftedEpochs) -> None:
    """Load the stream state of a checkpoint saved at an epoch boundary.

    Lightning restores train dataloader states only when it resumes mid-epoch (or trains by
    ``max_steps``); at an epoch boundary it keeps them unused, as a ``DataLoader`` starts the
    next epoch afresh. A sifted stream continues across epochs, so its state is loaded here,
    from where Lightning keeps it (``fit_loop._combined_loader_states_to_load``; a Lightning
    without that attribute restores mid-epoch only).
    """
    loop = trainer.fit_loop
    pending = getattr(loop, "_combined_loader_states_to_load", None)
    if not pending or loop.restarting:  # nothing to load, or Lightning loads it next
        return
    if len(pending) != 1:  # several stateful loaders: which one is ours is Lightning's call
        return
    stream.load_state_dict(pending[0])
    loop._combined_loader_states_to_load = []  # loaded once (a reloaded loader starts anew)


class _WithoutState:
    """A :class:`SiftedEpochs` without ``state_dict``, so Lightning does not checkpoint it."""

    def __init__(self, stream: SiftedEpochs) -> None:
        self.stream = stream
        self.loader = stream.loader

    def __iter__(self) -> Any:
        return iter(self.stream)

    def __len__(self) -> int:
        return len(self.stream)

    def set_epoch(self, epoch: int) -> None:
        self.stream.set_epoch(epoch)

    @property
    def stats(self) -> Any:
        return self.stream.stats

    @property
    def data_epoch(self) -> int:
        return self.stream.data_epoch

    def __repr__(self) -> str:
        return repr(self.stream)


def _attached_module(trainer: pl.Trainer) -> nn.Module:
    module = trainer.lightning_module
    if module is None:
        raise ValueError(
            "the Trainer has no LightningModule attached yet: call sifting_dataloader from "
            "LightningDataModule.train_dataloader() (Lightning calls it during fit), or pass "
            "model=<the module>"
        )
    return module


def _with_distributed_sampler(trainer: pl.Trainer, dataloader: DataLoader) -> DataLoader:
    """``dataloader`` as Lightning would shard it had it been returned directly."""
    connector = getattr(trainer, "_data_connector", None)
    prepare = getattr(connector, "_prepare_dataloader", None)
    if prepare is None:  # a Lightning without the hook: shard by hand or disable the sampler
        if trainer.world_size > 1 and not _shards(dataloader):
            raise ValueError(
                "cannot add a DistributedSampler to the sifting loader's DataLoader with this "
                "Lightning version; build the DataLoader with sampler=DistributedSampler(dataset)"
            )
        return dataloader
    from lightning.pytorch.trainer.states import RunningStage

    return prepare(dataloader, shuffle=True, mode=RunningStage.TRAINING)


def _shards(dataloader: DataLoader) -> bool:
    from torch.utils.data import DistributedSampler

    batch_sampler = getattr(dataloader, "batch_sampler", None)
    samplers = (dataloader.sampler, getattr(batch_sampler, "sampler", None))
    return any(isinstance(s, DistributedSampler) for s in samplers)
