"""Smart sifting in Lightning: the :class:`Sifting` callback, or a sifting loader from a
``LightningDataModule``, and the metrics callback.

The one switch, either front-end, nothing else edited::

    trainer = L.Trainer(max_epochs=8, callbacks=[Sifting(StaleRelativePruningConfig())])
    # the LightningModule's training_step returns {"loss": loss, "per_sample_loss": losses}

    trainer = L.Trainer(max_epochs=3, callbacks=[Sifting(sift_config, loss=PerSampleCrossEntropy())])

:class:`Sifting` takes the train dataloader wherever it comes from (DataModule, module, or
``trainer.fit(train_dataloaders=...)``) as Lightning requests it, and either puts a
:class:`~hasten.sifting.PruningSampler` under it (a pruning config) or wraps it with
:func:`sifting_dataloader` (a loader config); it logs the statistics as
:class:`TrainingMetricsRecorder` does. Works with ``lightning.pytorch`` and ``pytorch_lightning``.

The DataModule helper, for code that builds its own sifting loader: the loader scores samples with the model being trained, so it needs the ``LightningModule``. A
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
  :class:`~hasten.integrations.epochs.SiftedEpochs`: epochs of that length over a stream of
  data passes; nothing is cut or lost. With ``max_epochs=E`` (and no ``max_steps``) the fit
  trains ``E`` whole data passes, as SageMaker's loader does: an epoch is the expected sifted
  length of ``E`` passes, plus a headroom of at most 2.5 %, divided by ``E``, and the fit ends
  when the last pass does (its last epoch cut short there, the Trainer stopped), within about
  2.5 % of ``estimated_stepping_batches``. Passes that keep more than the plan holds are cut at
  its end, with a warning.
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

Compiling: ``Trainer(callbacks=[Compile()])`` compiles the ``LightningModule`` in place with
``hasten.compile`` when the fit starts, telling the compile plan (``regions="auto"``) the fit's
length, :func:`fit_training_calls`: ``estimated_stepping_batches`` optimizer steps of
``accumulate_grad_batches`` training calls each, so a short fit stays eager and a long one
compiles once its first eager steps are timed. ``hasten.compile(lightning_module)`` before ``trainer.fit`` compiles
the same way, the plan learning the length as the fit goes (``steps=`` tells it). Either way the
Trainer and the sifting scorer both run the compiled module.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

from hasten.integrations._front_end import is_pruning_config
from hasten.integrations.core import (
    PrunedPasses,
    RankState,
    catch_up,
    full_data_steps,
    training_calls,
)
from hasten.integrations.epochs import SiftedEpochs, expected_batches
from hasten.integrations.lightning_metrics import TrainingMetricsRecorder, _callback_bases
from hasten.sifting import (
    PruningSampler,
    SiftingDataloader,
    coerce_pruning_config,
    coerce_sift_config,
)

__all__ = [
    "Compile",
    "Sifting",
    "TrainingMetricsRecorder",
    "fit_training_calls",
    "sifting_dataloader",
]

# the Lightning distributions installed: the unified package and the standalone one
_PACKAGES: dict[str, Any] = {}
for _name in ("lightning.pytorch", "pytorch_lightning"):
    try:
        _PACKAGES[_name] = importlib.import_module(_name)
    except ImportError:
        continue
if not _PACKAGES:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "hasten's Lightning integration needs lightning (`pip install 'hasten[lightning]'`) or "
        "pytorch_lightning"
    )
_TRAINERS = tuple(pkg.Trainer for pkg in _PACKAGES.values())


def _package_of(trainer: Any) -> Any:
    """The Lightning package ``trainer`` comes from (``lightning.pytorch`` or
    ``pytorch_lightning``)."""
    name = "pytorch_lightning" if type(trainer).__module__.startswith("pytorch_lightning") else None
    return _PACKAGES.get(name or "lightning.pytorch") or next(iter(_PACKAGES.values()))


def sifting_dataloader(
    trainer: Any,
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
    if not isinstance(trainer, _TRAINERS):
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
        # by epochs: whole data passes, the fit ending with the last one
        stream = _LightningEpochs(sifted, passes=trainer.max_epochs, finish_passes=True)
        stream.trainer = trainer
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
    length kept. A fit by epochs stops its ``trainer`` once its last data pass is over (the
    epochs after it would be empty).
    """

    trainer: Any = None

    def _on_finished(self) -> None:
        if self.trainer is not None:
            self.trainer.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        return _STREAM_STATE.gather(super().state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        own = dict(_STREAM_STATE.own(state))
        own["epoch_length"] = self.epoch_length  # Lightning plans the epochs; see the class doc
        super().load_state_dict(own)


_STREAM_STATE = RankState(
    "ranks",
    not_ours="this Lightning checkpoint's train dataloader state is not a hasten sifting "
    "stream's; resume with the DataModule that wrote it, or pass checkpoint=False "
    "to sifting_dataloader to start a fresh sifted stream",
    other_world="the checkpoint's sifting state comes from {saved} process(es), this run "
    "has {world}: the sifted stream resumes exactly only with the same number of "
    "processes. Pass checkpoint=False to sifting_dataloader to start a fresh "
    "sifted stream instead",
)
"""Every rank's sifted stream in rank 0's checkpoint (Lightning saves rank 0's only)."""

_PRUNING_STATE = RankState(
    "pruning",
    not_ours="this checkpoint's train dataloader state is not a hasten pruning sampler's; "
    "resume with the same Sifting config, or pass Sifting(..., checkpoint=False) "
    "to start a fresh sampler",
    other_world="the checkpoint's pruning state comes from {saved} process(es), this run "
    "has {world}: resume with the same number of processes, or pass "
    "Sifting(..., checkpoint=False)",
)
"""Every rank's pruned passes in rank 0's checkpoint."""


def _restore_at_epoch_boundary(trainer: Any, stream: Any) -> None:
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


def _attached_module(trainer: Any) -> nn.Module:
    module = trainer.lightning_module
    if module is None:
        raise ValueError(
            "the Trainer has no LightningModule attached yet: call sifting_dataloader from "
            "LightningDataModule.train_dataloader() (Lightning calls it during fit), or pass "
            "model=<the module>"
        )
    return module


def _with_distributed_sampler(trainer: Any, dataloader: DataLoader) -> DataLoader:
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
    states = importlib.import_module(f"{_package_of(trainer).__name__}.trainer.states")
    return prepare(dataloader, shuffle=True, mode=states.RunningStage.TRAINING)


def _shards(dataloader: DataLoader) -> bool:
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    samplers = (dataloader.sampler, getattr(batch_sampler, "sampler", None))
    return any(isinstance(s, DistributedSampler) for s in samplers)


# ---------------------------------------------------------------------------------- the switch

_PRUNED_SAMPLERS = (RandomSampler, SequentialSampler, DistributedSampler)


class Sifting(TrainingMetricsRecorder):
    """Sift a Lightning fit from ``Trainer(callbacks=[Sifting(config, ...)])``: no DataModule or
    module code changes beyond handing over per-sample losses for a pruning config.

    The config picks the front-end:

    * **A pruning config** (:class:`~hasten.sifting.StaleRelativePruningConfig`,
      :class:`~hasten.sifting.UnbiasedPruningConfig`, or a dict with ``"policy"``): the train
      ``DataLoader`` is rebuilt with a :class:`~hasten.sifting.PruningSampler` as its sampler
      (same dataset, batch size, collate function, workers ...; the sampler shuffles and, under
      DDP, gives each rank an equal shard itself). The module's ``training_step`` hands its
      per-sample losses over by returning them beside the loss::

          def training_step(self, batch, batch_idx):
              losses = F.cross_entropy(self(x), y, reduction="none")
              return {"loss": losses.mean(), "per_sample_loss": losses}

      and the callback replaces ``"loss"`` with ``sampler.update(per_sample_loss)`` — the
      (for the unbiased rule, reweighted) mean — before Lightning's backward. Why this way: the
      losses come from the step's own forward (no extra one), the module stays a plain
      LightningModule that trains without the callback, and returning the weighted loss is the
      only point before the backward a callback can change it (``on_before_backward`` sees the
      loss but cannot replace it). Lightning calls the sampler's ``set_epoch``; each epoch is one
      pruned epoch, shorter than a full one. Train by ``max_epochs`` (the saving: fewer steps)
      or by ``max_steps`` (exactly that many steps; needs ``anneal_fraction=0``).
    * **A loader config** (:class:`~hasten.sifting.RelativeProbabilisticSiftConfig`): the train
      dataloader is wrapped with :func:`sifting_dataloader` (scoring every batch with ``loss``,
      an extra forward), which keeps Lightning's plan exact.

    Schedules: Lightning's ``estimated_stepping_batches`` counts full epochs. Training a
    pruning config by ``max_epochs`` takes fewer steps, so after every optimizer step the
    callback advances each ``interval="step"`` learning-rate scheduler to the steps a full-data
    run would have taken at this point of the fit: a schedule sized by
    ``estimated_stepping_batches`` (``OneCycleLR(total_steps=...)``, warm-up + decay) ends when
    the fit does. In full-data epochs that is the step just taken, so nothing changes.

    Checkpoints hold the sampler's state (every rank's, gathered into rank 0's checkpoint), so
    ``fit(ckpt_path=...)`` resumes the exact stream, mid-epoch or at an epoch boundary.

    Args:
        config: A pruning config or a loader config (see above).
        loss: Loader config only, required: the per-sample loss the loader scores with
            (:class:`~hasten.sifting.PerSampleCrossEntropy`, a ``Loss`` or ``fn(model,
            batch)``).
        seed: Pruning config: the sampler's seed (the same on every rank).
        shuffle: Pruning config: shuffle the kept indices every epoch.
        scorer: Pruning config: rescoring of stale losses (``max_loss_age``), see
            :class:`~hasten.sifting.PruningSampler`.
        loss_key: Pruning config: the key of ``training_step``'s output holding the losses.
        epoch_length: Loader config: batches per epoch (see :func:`sifting_dataloader`).
        checkpoint: Save and restore the sifting state with Lightning's checkpoints.
        every_n_steps, prefix, prog_bar: Logging, as :class:`TrainingMetricsRecorder`.
        **loader_kwargs: Loader config: :class:`~hasten.sifting.SiftingDataloader` keywords.

    Attributes:
        sampler: The :class:`~hasten.sifting.PruningSampler` (pruning config, once the fit has
            requested its train dataloader), else ``None``.
    """

    def __init__(
        self,
        config: Any,
        loss: Any = None,
        *,
        seed: int = 0,
        shuffle: bool = True,
        scorer: Any = None,
        loss_key: str = "per_sample_loss",
        epoch_length: int | None = None,
        checkpoint: bool = True,
        every_n_steps: int | None = None,
        prefix: str = "sift/",
        prog_bar: bool = False,
        **loader_kwargs: Any,
    ) -> None:
        super().__init__(every_n_steps=every_n_steps, prefix=prefix, prog_bar=prog_bar)
        self.pruning = is_pruning_config(config)
        if self.pruning:
            self.config = coerce_pruning_config(config)
            if loss is not None or loader_kwargs or epoch_length is not None:
                raise TypeError(
                    "a pruning config trains on the losses training_step returns (as "
                    f"{loss_key!r}): loss=, epoch_length= and SiftingDataloader keywords belong "
                    "to a loader config"
                )
        else:
            self.config = coerce_sift_config(config)
            if loss is None:
                raise TypeError(
                    "a SiftingDataloader config scores every batch with a per-sample loss: pass "
                    "Sifting(config, loss=PerSampleCrossEntropy()) (or your own)"
                )
        self.loss = loss
        self.seed = seed
        self.shuffle = shuffle
        self.scorer = scorer
        self.loss_key = loss_key
        self.epoch_length = epoch_length
        self.checkpoint = checkpoint
        self.loader_kwargs = loader_kwargs
        self.sampler: PruningSampler | None = None
        self._loader: _PrunedLoader | None = None
        self._undo: list[Any] = []

    # ------------------------------------------------------------------ hooks

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if str(getattr(stage, "value", stage)) != "fit":
            return
        if self.pruning and not pl_module.automatic_optimization:
            raise ValueError(
                "Sifting with a pruning config replaces the loss training_step returns, which "
                "manual optimization does not use: call loss = callback.sampler.update("
                "per_sample_losses) in training_step yourself, and backpropagate that"
            )
        self._patch_data_source(trainer, pl_module)
        if self.pruning:
            self._patch_training_step(pl_module)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if str(getattr(stage, "value", stage)) != "fit":
            return
        while self._undo:
            self._undo.pop()()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.pruning and self._loader is not None and trainer.max_steps == -1:
            self._catch_up_schedules(trainer, self._loader)

    # ------------------------------------------------------------------ data

    def _patch_data_source(self, trainer: Any, pl_module: Any) -> None:
        source = getattr(trainer.fit_loop, "_data_source", None)
        if source is not None and callable(getattr(source, "dataloader", None)):
            original = source.dataloader  # DataModule's, module's or fit()'s loaders alike
            source.dataloader = lambda: self._wrap(trainer, pl_module, original())
            self._undo.append(lambda: vars(source).pop("dataloader", None))
            return
        owner = trainer.datamodule if trainer.datamodule is not None else pl_module
        hook = owner.train_dataloader  # a Lightning without the data source: the hook itself

        @functools.wraps(hook)
        def train_dataloader() -> Any:
            return self._wrap(trainer, pl_module, hook())

        owner.train_dataloader = train_dataloader
        self._undo.append(lambda: vars(owner).pop("train_dataloader", None))

    def _wrap(self, trainer: Any, pl_module: Any, loader: Any) -> Any:
        if isinstance(loader, (Mapping, list, tuple)):
            raise TypeError(
                f"Sifting sifts one train dataloader, got a {type(loader).__name__} of "
                "them; return the one to sift from train_dataloader()"
            )
        if not self.pruning:
            return sifting_dataloader(
                trainer,
                loader,
                self.config,
                self.loss,
                model=pl_module,
                epoch_length=self.epoch_length,
                checkpoint=self.checkpoint,
                **self.loader_kwargs,
            )
        loader = self._pruned_loader(trainer, loader)
        if self.checkpoint:
            _restore_at_epoch_boundary(trainer, loader)
        return loader

    def _pruned_loader(self, trainer: Any, loader: Any) -> _PrunedLoader:
        if not isinstance(loader, DataLoader):
            raise TypeError(
                f"Sifting with a pruning config puts a sampler under the train DataLoader, got a "
                f"{type(loader).__name__}; return a torch DataLoader from train_dataloader(), or "
                "use a loader config (RelativeProbabilisticSiftConfig)"
            )
        dataset = loader.dataset
        if isinstance(dataset, torch.utils.data.IterableDataset) or loader.batch_size is None:
            raise TypeError(
                "the pruning sampler picks dataset indices: it needs a map-style dataset and a "
                "DataLoader built with batch_size= (no custom batch_sampler); use a loader "
                "config (RelativeProbabilisticSiftConfig) otherwise"
            )
        if not isinstance(loader.sampler, _PRUNED_SAMPLERS):
            raise TypeError(
                f"the train DataLoader has a {type(loader.sampler).__name__}, which the pruning "
                "sampler would replace; build the DataLoader with shuffle=True (or no sampler)"
            )
        if self.sampler is None:
            self.sampler = self._make_sampler(trainer, dataset, loader.batch_size)
        elif self.sampler.size != len(dataset):
            raise ValueError(
                f"the reloaded train dataset has {len(dataset)} samples, the pruning sampler "
                f"{self.sampler.size}: reloading must keep the dataset"
            )
        rebuilt = _with_sampler(loader, self.sampler)
        cls = _StatefulPrunedLoader if self.checkpoint else _PrunedLoader
        previous, self._loader = self._loader, cls(rebuilt, self.sampler)
        if previous is not None:  # a reloaded loader: the passes go on where they were
            self._loader.continue_from(previous)
        return self._loader

    def _make_sampler(self, trainer: Any, dataset: Any, batch_size: int) -> PruningSampler:
        by_epochs = trainer.max_epochs is not None and trainer.max_epochs > 0
        anneal = float(getattr(self.config, "anneal_fraction", 0.0))
        if not by_epochs and anneal > 0:
            raise ValueError(
                f"{type(self.config).__name__}(anneal_fraction={anneal}) trains the last epochs "
                f"on all data, but the Trainer trains by max_steps={trainer.max_steps} with no "
                "max_epochs, so the number of epochs is not known: pass max_epochs, or set "
                "anneal_fraction=0"
            )
        return PruningSampler(
            dataset,
            self.config,
            num_epochs=trainer.max_epochs if by_epochs else None,
            seed=self.seed,
            shuffle=self.shuffle,
            scorer=self.scorer,
            num_replicas=trainer.world_size,
            rank=trainer.global_rank,
            batch_size=batch_size,
        )

    # ------------------------------------------------------------------ feedback

    def _patch_training_step(self, pl_module: Any) -> None:
        original = pl_module.training_step
        key = self.loss_key

        @functools.wraps(original)
        def training_step(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            losses = out.get(key) if isinstance(out, Mapping) else None
            if losses is None:
                raise ValueError(
                    f"Sifting with a pruning config needs training_step to return its "
                    f"per-sample losses: return {{'loss': losses.mean(), {key!r}: losses}} "
                    "with losses = the step's loss per sample (reduction='none'); got "
                    f"{type(out).__name__}"
                )
            if self._loader is None:
                raise RuntimeError(
                    "training_step ran before the pruning sampler was built: Sifting builds it "
                    "when Lightning requests the train dataloader"
                )
            return {**out, "loss": self._loader.feed_back(losses)}

        pl_module.training_step = training_step
        self._undo.append(lambda: vars(pl_module).pop("training_step", None))

    # ------------------------------------------------------------------ schedules

    def _catch_up_schedules(self, trainer: Any, stream: PrunedPasses) -> None:
        """Advance step schedulers to the steps a full-data fit would have taken by now."""
        accumulate = max(1, int(trainer.accumulate_grad_batches))
        done, m = stream.fed_back, stream.pass_length
        if m <= 0 or (done % accumulate and done < m):
            return  # not at an optimizer step
        target = full_data_steps(stream.pass_index, done, m, stream.planned, accumulate)
        schedulers = [
            config.scheduler
            for config in trainer.lr_scheduler_configs
            if config.interval == "step" and config.frequency == 1
        ]
        cap = trainer.estimated_stepping_batches
        catch_up(schedulers, target, cap if isinstance(cap, (int, float)) else None)


def _with_sampler(loader: DataLoader, sampler: PruningSampler) -> DataLoader:
    """``loader``'s settings on the same dataset, with ``sampler``."""
    kwargs: dict[str, Any] = {
        "batch_size": loader.batch_size,
        "sampler": sampler,
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "drop_last": loader.drop_last,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return DataLoader(loader.dataset, **kwargs)


class _PrunedLoader(PrunedPasses):
    """The train DataLoader on the pruning sampler, as Lightning sees it: the core's
    :class:`~hasten.integrations.core.PrunedPasses`, one pruned epoch per Lightning epoch (no
    trimming: Lightning steps a short last accumulation itself). Not a ``DataLoader`` (so
    Lightning leaves its sampler alone: the sampler shards for DDP itself), with the sampler as
    ``.sampler`` (so Lightning's ``set_epoch`` plans each epoch), iterated lazily (Lightning's
    probe ``iter()`` before the fit starts no epoch). ``len()`` is the epoch's own (the
    sampler's plan, which Lightning's ``set_epoch`` made): Lightning's data fetcher knows the
    last batch of an epoch by it, and steps a short last accumulation there; the first, full
    epoch is what ``estimated_stepping_batches`` counts."""

    def __init__(self, loader: DataLoader, sampler: PruningSampler) -> None:
        super().__init__(loader, sampler, accumulation=1, by_steps=False)

    def __len__(self) -> int:
        return len(self.loader)


class _StatefulPrunedLoader(_PrunedLoader):
    """A :class:`_PrunedLoader` Lightning checkpoints: every rank's passes (Lightning saves rank
    0's checkpoint only), each rank resuming from its own."""

    def state_dict(self) -> dict[str, Any]:
        return _PRUNING_STATE.gather(super().state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        own = _PRUNING_STATE.own(state)
        if isinstance(own, dict) and "sampler" not in own and "table" in own:
            self._load_sampler_state(own)  # an earlier hasten saved the sampler's state alone
            return
        super().load_state_dict(own)

    def _load_sampler_state(self, state: dict[str, Any]) -> None:
        """Restore a bare sampler state; the pass counters follow from its plan."""
        self.sampler.load_state_dict(state)
        plan = self.sampler._plan
        if plan is None:
            return
        batch = max(1, int(self.loader.batch_size or 1))
        self.pass_index = plan.epoch
        self.pass_length = len(self.loader)  # the restored plan's batches
        self.fed_back = -(-plan.cursor // batch)
        self._resume = True


# ---------------------------------------------------------------------------------- compiling


def fit_training_calls(trainer: Any) -> int | None:
    """Training calls (micro-batches) the Lightning ``trainer``'s fit will make, if known:
    ``estimated_stepping_batches * accumulate_grad_batches`` (``None`` for an endless fit).

    Call it once the fit has started (a callback's ``on_fit_start`` or later): Lightning loads the
    train dataloader to count its batches. A sifted fit by epochs takes about that many (the loader
    front-end ends within 2.5 % of it); a pruned one fewer, so the compile plan is told the most
    the fit can take.
    """
    accumulate = max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
    return training_calls(trainer.estimated_stepping_batches, accumulate)


class Compile(*_callback_bases()):  # type: ignore[misc]
    """Compile the ``LightningModule`` with ``hasten.compile`` when the fit starts, for the fit's
    length: ``Trainer(callbacks=[Compile()])``.

    At ``on_fit_start`` (after ``configure_optimizers``, before the sanity check's first forward)
    the module is compiled in place with ``steps=`` :func:`fit_training_calls`, so the compile
    plan (``regions="auto"``, :mod:`hasten.compiler.plan`) decides from the fit's length whether
    compiling pays, as ``compile_trainer`` does for the Hugging Face Trainer. Its optimizers' Adam,
    AdamW, SGD and Adagrad step fused where their flags leave it to PyTorch (``hasten.compile``'s
    ``fused_optimizer``). A module already compiled by hasten is left as it is.

    Args:
        config: A :class:`hasten.CompileConfig` (``None``: the defaults). Its ``steps``, when
            set, wins over the fit's length.
        **settings: ``hasten.compile`` keywords (``precision="bf16"``, ``steps=``,
            ``fused_optimizer=False`` ...); ``steps`` given wins over the fit's length.

    Attributes:
        steps: The run length given to the plan (``None`` before the fit starts, or when the fit
            is endless and the plan learns it as the fit goes).
    """

    def __init__(self, config: Any = None, **settings: Any) -> None:
        super().__init__()
        from hasten.compiler.config import CompileConfig

        if config is not None and not isinstance(config, CompileConfig):
            raise TypeError(
                f"Compile(config=...) takes a hasten.CompileConfig, got {type(config).__name__}; "
                "pass hasten.compile keywords as Compile(precision='bf16', ...)"
            )
        self.config = config
        self.settings = settings
        self.steps: int | None = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        import hasten
        from hasten.compiler import compile_report

        try:
            compile_report(pl_module)
        except ValueError:  # not compiled by hasten yet
            pass
        else:
            return
        settings = dict(self.settings)
        if "steps" not in settings and (self.config is None or self.config.steps is None):
            steps = fit_training_calls(trainer)
            if steps is not None:
                settings["steps"] = steps  # regions="auto" plans for the fit
        self.steps = settings.get("steps", None if self.config is None else self.config.steps)
        hasten.compile(pl_module, self.config, **settings)
