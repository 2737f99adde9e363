"""SageMaker's ``smart_sifting.metrics.lightning``: the ``TrainingMetricsRecorder`` callback.

The same class as :class:`hasten.integrations.lightning.TrainingMetricsRecorder`; it works with
``lightning`` (``lightning.pytorch``) and with the standalone ``pytorch_lightning`` SageMaker's
examples use (either one installed is enough).
"""

from __future__ import annotations

from hasten.integrations.lightning_metrics import TrainingMetricsRecorder

__all__ = ["TrainingMetricsRecorder"]
