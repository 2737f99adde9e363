"""Smart sifting: train on full batches of the samples the model still gets wrong.

``SiftingDataloader`` wraps a DataLoader, scores every sample's loss with the model as batches go
by, drops low-loss samples by a selection policy and yields full batches of the kept ones. The API
matches Amazon SageMaker's ``smart_sifting`` (also importable under its module paths from
:mod:`hasten.smart_sifting`), so migrating means changing imports::

    from hasten.sifting import RelativeProbabilisticSiftConfig, SiftingDataloader

    loader = SiftingDataloader(
        sift_config=RelativeProbabilisticSiftConfig(beta_value=1.0, loss_history_length=500),
        orig_dataloader=train_loader,
        model=model,
        loss_impl=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1], reduction="none"),
    )

The pieces, each usable alone: :mod:`~hasten.sifting.batch` (split/select/concat any batch),
:mod:`~hasten.sifting.history` (loss ring buffer, percentiles), :mod:`~hasten.sifting.policy`
(pure selection rules), :mod:`~hasten.sifting.loader` (the wrapper). See ``docs/sifting.md``.

Beyond SageMaker, ``PruningSampler`` prunes with no extra forward: the training step feeds its
per-sample losses back (``loss = sampler.update(losses)``) and the sampler leaves samples out of
the next epochs before they are loaded, with InfoBatch's unbiased rule
(``UnbiasedPruningConfig``) or SageMaker's rule on stored losses
(``StaleRelativePruningConfig``, rescoring stale ones with a ``Scorer``):
:mod:`~hasten.sifting.pruning`, :mod:`~hasten.sifting.feedback`, :mod:`~hasten.sifting.unbiased`,
:mod:`~hasten.sifting.scoring`.
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
from hasten.sifting.history import LossHistory, percentile_of
from hasten.sifting.loader import SiftingDataloader
from hasten.sifting.loss import CallableLoss, Loss, PerSampleCrossEntropy
from hasten.sifting.policy import Selection, policy_for, relative_probabilistic_select
from hasten.sifting.pruning import PruningSampler, PruningStats
from hasten.sifting.pruning_config import (
    StaleRelativePruningConfig,
    UnbiasedPruningConfig,
    coerce_pruning_config,
)
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
