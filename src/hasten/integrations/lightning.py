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
* **Checkpoints.** By default the returned loader offers Lightning no ``state_dict``, so
  Lightning checkpoints load as usual (``weights_only=True``) and a resumed fit starts a fresh
  sifted stream (new loss history, data passes numbered from 0). ``checkpoint=True`` lets
  Lightning save the stream's state; Lightning restores it only when resuming mid-epoch, and the
  state holds buffered rows as sifting batch objects, so the checkpoint must then be loaded with
  ``trainer.fit(..., ckpt_path=..., weights_only=False)`` (your own checkpoints only).

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

from torch import nn
from torch.utils.data import DataLoader

from hasten.integrations.epochs import SiftedEpochs, expected_batches
from hasten.integrations.metrics import find_sifting_loader, sifting_metrics
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
    checkpoint: bool = False,
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
            docstring: needs ``weights_only=False`` to resume).
        **loader_kwargs: Keyword arguments for :class:`~hasten.sifting.SiftingDataloader`.

    Returns:
        A :class:`~hasten.integrations.epochs.SiftedEpochs` over the sifting loader (with
        ``checkpoint=True``), or a view of one without ``state_dict`` (the default); either has
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
        stream = SiftedEpochs(sifted, epoch_length)
    elif trainer.max_steps == -1 and trainer.max_epochs is not None and trainer.max_epochs > 0:
        stream = SiftedEpochs(sifted, passes=trainer.max_epochs)
    else:
        stream = SiftedEpochs(sifted, max(1, expected_batches(sifted, 1, delay=False)))
    return stream if checkpoint else _WithoutState(stream)


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


class TrainingMetricsRecorder(pl.Callback):
    """Logs the sifting statistics through Lightning's loggers (SageMaker's callback name).

    Every ``every_n_steps`` optimizer steps (default: the Trainer's ``log_every_n_steps``) it logs
    ``sift/keep_rate``, ``sift/samples_seen`` ... (see
    :func:`~hasten.integrations.metrics.sifting_metrics`) with ``LightningModule.log_dict``, so
    they reach every logger, ``trainer.callback_metrics`` and ``trainer.logged_metrics``. Counts
    are summed over ranks first (one small ``all_reduce``, run by every rank at the same step).
    It finds the sifting loader in ``trainer.train_dataloader``; without one it does nothing.

    Args:
        every_n_steps: Log every this many optimizer steps (default: ``log_every_n_steps``).
        prefix: Put before every name (default ``"sift/"``).
        prog_bar: Also show the keep rate in the progress bar.
    """

    def __init__(
        self, every_n_steps: int | None = None, prefix: str = "sift/", prog_bar: bool = False
    ) -> None:
        if every_n_steps is not None and (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, int)
            or every_n_steps < 1
        ):
            raise ValueError(f"every_n_steps must be an int >= 1 or None, got {every_n_steps!r}")
        self.every_n_steps = every_n_steps
        self.prefix = prefix
        self.prog_bar = prog_bar
        self._last_step = -1

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        every = self.every_n_steps or trainer.log_every_n_steps or 1
        if step == self._last_step or step % every:
            return
        loader = find_sifting_loader(trainer.train_dataloader)
        if loader is None:
            return
        self._last_step = step
        metrics = sifting_metrics(loader, self.prefix)
        keep = f"{self.prefix}keep_rate"
        if self.prog_bar and keep in metrics:
            pl_module.log(
                keep, metrics.pop(keep), prog_bar=True, on_step=True, on_epoch=False, batch_size=1
            )
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)
