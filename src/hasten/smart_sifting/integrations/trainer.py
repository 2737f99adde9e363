"""SageMaker's ``smart_sifting.integrations.trainer``: ``enable_sifting`` for the Hugging Face Trainer.

The same function as :func:`hasten.integrations.transformers.enable_sifting`; importing this
module needs ``transformers`` (``pip install 'hasten[hf]'``).
"""

from __future__ import annotations

from hasten.integrations.transformers import SiftingCallback, enable_sifting

__all__ = ["SiftingCallback", "enable_sifting"]
