"""hasten inside training frameworks: Hugging Face Transformers, Lightning, torchrun.

* :mod:`hasten.integrations.transformers` — ``enable_sifting(trainer, sift_config, loss)`` for the
  Hugging Face ``Trainer`` (needs ``hasten[hf]``).
* :mod:`hasten.integrations.lightning` — ``sifting_dataloader`` for a ``LightningDataModule`` and
  the ``TrainingMetricsRecorder`` callback (needs ``hasten[lightning]``).
* :mod:`hasten.integrations.epochs` — :class:`SiftedEpochs`, fixed-length epochs over a sifting
  loader, for any trainer that plans its loop by ``len(loader)``.
* :mod:`hasten.integrations.metrics` — sifting statistics as flat dicts, summed over ranks.

Nothing here is imported by ``import hasten``; the framework modules import their framework.
See ``docs/integrations.md``.
"""

from __future__ import annotations

from hasten.integrations.epochs import SiftedEpochs, expected_batches
from hasten.integrations.metrics import find_sifting_loader, sifting_metrics

__all__ = ["SiftedEpochs", "expected_batches", "find_sifting_loader", "sifting_metrics"]
