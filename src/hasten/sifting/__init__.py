"""Smart sifting: train on the samples the model still gets wrong, and skip the rest.

Two front-ends over one core. Both ask a *rule* which samples to keep, from per-sample losses;
they differ in where the losses come from and when the rule is asked.

Which to use when
-----------------

- :class:`PruningSampler` (per epoch, from the training step's own losses): a map-style
  dataset, and one line in the training step, ``loss = sampler.update(per_sample_losses)``.
  No extra forward, and the unbiased rule reweights what it keeps. It saves the most: see
  ``benchmarks/results/sift-policies.md`` for the measured compute and accuracy.
- :class:`SiftingDataloader` (per batch, from a scoring forward): SageMaker's two lines; any
  re-iterable of batches (streams and ``IterableDataset`` included), nothing to change in the
  training step. Every incoming sample pays a forward without gradient, so it saves less.

The walk of one batch
---------------------

The same story in both, step by step (``core``: shared; the rest belongs to one front-end)::

                      SiftingDataloader                  PruningSampler
                      (hasten.sifting.loader)            (hasten.sifting.sampler)
    when the rule     every incoming batch               set_epoch(e): once per epoch, the
    is asked                                             whole dataset
    losses from       a scoring forward now              the table the training step filled
                      (core.forward: eval mode,          (feedback.SampleLosses; rescoring
                      inference_mode, checked)           stale ones: scoring.Scorer)
    the rule          core.rules: config -> pure policy (losses, history, generator) -> keep
                      mask (+ weights); history = recent losses (history.LossHistory) in the
                      loader, all stored losses in the sampler
    what is kept      kept rows of the batch go to a     kept indices are shuffled and
                      buffer (buffer.KeptBuffer) and     sharded; the DataLoader loads only
                      come out as full batches           those (any workers, collate)
                      (batch: split/select/concat any
                      structure; padding for ragged)
    the training      trains on the yielded batch as     loss = sampler.update(losses):
    step              usual                              stores the losses, returns the
                                                         (weighted) mean to backpropagate
    length            core.length: len() planned at      len() = kept indices of the epoch
                      the rule's nominal keep rate
    DDP               core.dist: ranks agree on the      core.dist: ranks merge their losses
                      batch count (one all_gather per    and plan the same epoch (all_reduce
                      incoming batch)                    when an epoch is planned)
    resume            state_dict(): core.state, from     state_dict(): core.state, from the
                      the loader's _Position dataclass   epoch's _Plan dataclass

Which rule runs where is the registry's answer (:mod:`hasten.sifting.core.rules`): SageMaker's
``RelativeProbabilisticSiftConfig`` in the loader, its stored-loss twin
``StaleRelativePruningConfig`` and InfoBatch's ``UnbiasedPruningConfig`` in the sampler; a
config given to the other front-end raises, naming the one to use.

Layout
------

- the front-ends: :mod:`~hasten.sifting.loader` (with :mod:`~hasten.sifting.batch`,
  :mod:`~hasten.sifting.padding`, :mod:`~hasten.sifting.buffer`,
  :mod:`~hasten.sifting.history`, :mod:`~hasten.sifting.stats`) and
  :mod:`~hasten.sifting.sampler` (with :mod:`~hasten.sifting.feedback`,
  :mod:`~hasten.sifting.scoring`);
- the rules: configs in :mod:`~hasten.sifting.config` (SageMaker's names) and
  :mod:`~hasten.sifting.pruning_config`, pure policies in :mod:`~hasten.sifting.policy` and
  :mod:`~hasten.sifting.unbiased`, all registered in :mod:`~hasten.sifting.core.rules`;
- the shared core: :mod:`hasten.sifting.core` (rules, fields, dist, length, forward, state);
- SageMaker's module paths: :mod:`hasten.smart_sifting` (re-exports; migrating means changing
  the import prefix)::

    from hasten.sifting import RelativeProbabilisticSiftConfig, SiftingDataloader

    loader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(beta_value=1.0, loss_history_length=500),
        orig_dataloader=train_loader,
        model=model,
        loss_impl=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1], reduction="none"),
    )

See ``docs/sifting.md``.
"""

from __future__ import annotations

from hasten.sifting.batch import (
    DefaultBatchTransform,
    ListBatch,
    SiftingBatch,
    SiftingBatchTransform,
    TensorBatch,
    TreeBatch,
    batch_size_of,
    concat_batches,
    select_rows,
    split_batch,
)
from hasten.sifting.config import (
    LossConfig,
    RelativeProbabilisticSiftConfig,
    SiftingBaseConfig,
    coerce_sift_config,
)
from hasten.sifting.exceptions import (
    LossImplementationNotProvidedException,
    SiftConfigValidationException,
    UnsupportedDataFormatException,
)
from hasten.sifting.feedback import SampleLosses
from hasten.sifting.guard import PruningGuard
from hasten.sifting.history import LossHistory, percentile_of
from hasten.sifting.loader import SiftingDataloader
from hasten.sifting.loss import CallableLoss, Loss, PerSampleCrossEntropy
from hasten.sifting.policy import Selection, policy_for, relative_probabilistic_select
from hasten.sifting.pruning_config import (
    StaleRelativePruningConfig,
    UnbiasedPruningConfig,
    coerce_pruning_config,
)
from hasten.sifting.sampler import PruningSampler, PruningStats
from hasten.sifting.scoring import Scorer, scoring_mode
from hasten.sifting.stats import SiftingStats
from hasten.sifting.unbiased import loss_threshold, unbiased_select

__all__ = [
    "CallableLoss",
    "DefaultBatchTransform",
    "ListBatch",
    "Loss",
    "LossConfig",
    "LossHistory",
    "LossImplementationNotProvidedException",
    "PerSampleCrossEntropy",
    "PruningGuard",
    "PruningSampler",
    "PruningStats",
    "RelativeProbabilisticSiftConfig",
    "SampleLosses",
    "Scorer",
    "Selection",
    "SiftConfigValidationException",
    "SiftingBaseConfig",
    "SiftingBatch",
    "SiftingBatchTransform",
    "SiftingDataloader",
    "SiftingStats",
    "StaleRelativePruningConfig",
    "TensorBatch",
    "TreeBatch",
    "UnbiasedPruningConfig",
    "UnsupportedDataFormatException",
    "batch_size_of",
    "coerce_pruning_config",
    "coerce_sift_config",
    "concat_batches",
    "loss_threshold",
    "percentile_of",
    "policy_for",
    "relative_probabilistic_select",
    "scoring_mode",
    "select_rows",
    "split_batch",
    "unbiased_select",
]
