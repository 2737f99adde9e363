"""SageMaker's ``smart_sifting.metrics.lightning``: the ``TrainingMetricsRecorder`` callback.

The same class as :class:`hasten.integrations.lightning.TrainingMetricsRecorder`; importing this
module needs ``lightning`` (``pip install 'hasten[lightning]'``).
"""

from __future__ import annotations

from hasten.integrations.lightning import TrainingMetricsRecorder

__all__ = ["TrainingMetricsRecorder"]
