"""Tiny models shared by tests in both suites (unit and integration)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def tiny_bert_classifier(**config: Any) -> nn.Module:
    """A one-layer, 16-wide ``BertForSequenceClassification`` over a 32-token vocabulary.

    Random weights, nothing downloaded; ``config`` overrides ``BertConfig`` fields (e.g.
    ``num_labels=3``, dropout probabilities). Needs ``transformers`` (callers importorskip it).
    """
    import transformers

    cfg = transformers.BertConfig(
        **{
            "num_hidden_layers": 1,
            "hidden_size": 16,
            "num_attention_heads": 2,
            "intermediate_size": 32,
            "vocab_size": 32,
            **config,
        }
    )
    return transformers.BertForSequenceClassification(cfg)


def tiny_vit_config(**config: Any) -> Any:
    """A one-layer, 16-wide ``ViTConfig`` over 16x16 images in 8x8 patches (4 patches).

    ``config`` overrides fields (``num_labels``, dropout probabilities). Needs ``transformers``.
    """
    import transformers

    return transformers.ViTConfig(
        **{
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 16,
            "image_size": 16,
            "patch_size": 8,
            **config,
        }
    )


class TinyLM(nn.Module):
    """Returns the loss and the logits it came from, as Transformers language models do."""

    def __init__(self, vocab: int = 4096) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, vocab)  # 256 tokens x 4096 = 2**20 logits: at the threshold

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(torch.tanh(self.body(x)))
        return F.cross_entropy(logits.float(), labels), logits
