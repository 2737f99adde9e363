"""Tiny models shared by tests in both suites (unit and integration)."""

from __future__ import annotations

from typing import Any

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
