"""hasten inside training frameworks: Hugging Face Transformers, Lightning, torchrun.

* :mod:`hasten.integrations.transformers` — ``enable_sifting(trainer, config)`` for the Hugging
  Face ``Trainer``: a pruning config puts a ``PruningSampler`` under it, a
  ``RelativeProbabilisticSiftConfig`` (with ``loss=``) a ``SiftingDataloader`` (needs
  ``hasten[hf]``).
* :mod:`hasten.integrations.lightning` — the ``Sifting(config)`` callback, either front-end from
  ``Trainer(callbacks=[...])``; ``sifting_dataloader`` for a ``LightningDataModule`` and the
  ``TrainingMetricsRecorder`` callback (needs ``hasten[lightning]`` or ``pytorch_lightning``).
* :mod:`hasten.integrations.epochs` — :class:`SiftedEpochs`, fixed-length epochs over a sifting
  loader, for any trainer that plans its loop by ``len(loader)``.
* :mod:`hasten.integrations.metrics` — sifting and pruning statistics as flat dicts, summed over
  ranks.

Nothing here is imported by ``import hasten``; the framework modules import their framework.
See ``docs/integrations.md``.
"""

from __future__ import annotations

from hasten.integrations._front_end import is_pruning_config
from hasten.integrations.epochs import SiftedEpochs, expected_batches
from hasten.integrations.metrics import (
    find_pruning_sampler,
    find_sifting_loader,
    pruning_metrics,
    sifting_metrics,
)

__all__ = [
    "SiftedEpochs",
    "expected_batches",
    "find_pruning_sampler",
    "find_sifting_loader",
    "is_pruning_config",
    "pruning_metrics",
    "sifting_metrics",
]
