"""Training tasks on real data: a dataset, a model sized for it, and the training recipe.

Shared by ``hasten demo`` and the data-efficiency experiment (``hasten bench sift``), so both train
the same things the same way. Recipes are chosen so that the data is *not* saturated at the epoch
budget — training less visibly loses accuracy — which is what a data-efficiency method must beat.

=========  ==========================================  ===========================================
task       model                                       recipe
=========  ==========================================  ===========================================
digits     MLP 64-128-10 (GELU)                        AdamW, batch 32
mnist1d    1-D CNN, 3 conv layers x 32 ch + linear     AdamW, batch 64 (8,000 train samples)
mnist1d-   the same CNN, on MNIST-1D generated at      AdamW, batch 64 (50,000 train samples:
large      62,500 samples                              redundant, 10 templates randomly warped)
text       EmbeddingBag (mean, 64-d) + MLP head        AdamW, batch 32, on BBC News token ids
=========  ==========================================  ===========================================

``text_transformer`` (the demo's task): the first 128 tokens of the BBC News articles through a
2-layer, 64-d transformer encoder (:class:`TextTransformer`), AdamW, batch 32, 10 epochs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from hasten.bench.datasets import PAD, SplitData, load_dataset

__all__ = [
    "TASK_NAMES",
    "Conv1dNet",
    "EmbeddingBagClassifier",
    "Task",
    "TextTransformer",
    "get_task",
    "lr_at",
]


class Conv1dNet(nn.Module):
    """A small 1-D CNN for MNIST-1D: three 'same' conv layers with ReLU, then a linear head."""

    def __init__(self, length: int = 40, channels: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, channels, 5, padding=2),
            nn.ReLU(),
            nn.Conv1d(channels, channels, 3, padding=1, stride=2),
            nn.ReLU(),
            nn.Conv1d(channels, channels, 3, padding=1, stride=2),
            nn.ReLU(),
        )
        self.head = nn.Linear(channels * math.ceil(math.ceil(length / 2) / 2), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.unsqueeze(1)).flatten(1))


class EmbeddingBagClassifier(nn.Module):
    """Mean of token embeddings (padding ignored), then a one-hidden-layer MLP head."""

    def __init__(self, vocab_size: int, dim: int = 64, classes: int = 5) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab_size, dim, mode="mean", padding_idx=PAD)
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, classes))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


class _SelfAttention(nn.Module):
    """Multi-head self-attention written out by hand (``q @ kᵀ``, additive mask, softmax,
    dropout, ``@ v``), as in nanoGPT and many users' own models."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads) + mask
        att = self.drop(att.softmax(-1))
        return self.out((att @ v).transpose(1, 2).reshape(b, t, d))


class _TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _SelfAttention(dim, heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), mask)
        return x + self.mlp(self.norm2(x))


class TextTransformer(nn.Module):
    """A small pre-norm transformer encoder for text classification: token and learned position
    embeddings, ``layers`` blocks with hand-written attention (padding masked), mean over the
    non-padding tokens, a linear head."""

    def __init__(
        self,
        vocab_size: int,
        classes: int,
        dim: int = 64,
        heads: int = 4,
        layers: int = 2,
        max_len: int = 128,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, dim, padding_idx=PAD)
        self.pos = nn.Parameter(torch.zeros(max_len, dim))
        nn.init.normal_(self.pos, std=0.02)
        self.blocks = nn.ModuleList(_TransformerBlock(dim, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        keep = ids != PAD
        x = self.tok(ids) + self.pos[: ids.shape[1]]
        mask = (~keep)[:, None, None, :].to(x.dtype) * -1e9  # padding keys get no attention
        for block in self.blocks:
            x = block(x, mask)
        w = keep.unsqueeze(-1).to(x.dtype)
        return self.head((self.norm(x) * w).sum(1) / w.sum(1).clamp_min(1.0))


@dataclass(frozen=True)
class Task:
    """A dataset with the model and recipe used to train on it.

    Attributes:
        name: Task name (see :data:`TASK_NAMES`).
        dataset: Dataset name for :func:`~hasten.bench.datasets.load_dataset`.
        dataset_kwargs: Options for the dataset loader.
        epochs: Epoch budget of the full-data run.
        batch_size: Training batch size.
        lr: Peak learning rate (AdamW).
        weight_decay: AdamW weight decay.
        warmup: Fraction of training spent warming the learning rate up linearly.
    """

    name: str
    dataset: str
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float = 0.0
    warmup: float = 0.05
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    _build: Callable[[SplitData], nn.Module] | None = field(default=None, repr=False)

    def data(self) -> SplitData:
        return load_dataset(self.dataset, **self.dataset_kwargs)

    def build_model(self, seed: int, data: SplitData | None = None) -> nn.Module:
        """A freshly initialised model; the same ``seed`` gives the same weights."""
        data = data or self.data()
        assert self._build is not None  # set by every task in this module
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self._build(data)

    def with_(self, **changes: Any) -> Task:
        """A copy with some fields changed (for example a shorter budget in tests)."""
        return replace(self, **changes)


def lr_at(progress: float, peak: float, warmup: float) -> float:
    """Learning rate at ``progress`` ∈ [0, 1] of a run: linear warm-up, then cosine decay to 0."""
    progress = min(max(progress, 0.0), 1.0)
    if warmup > 0 and progress < warmup:
        return peak * progress / warmup
    span = max(1e-12, 1.0 - warmup)
    return peak * 0.5 * (1.0 + math.cos(math.pi * (progress - warmup) / span))


EPOCHS_MNIST1D_LARGE = 12
"""Epoch budget of ``mnist1d-large``: short enough that a run costs ~30 s at 1 CPU thread,
long enough that training less visibly loses accuracy (see ``docs/bench.md``)."""


def _mlp(data: SplitData) -> nn.Module:
    d_in = data.feature_shape[0]
    return nn.Sequential(nn.Linear(d_in, 128), nn.GELU(), nn.Linear(128, data.num_classes))


_TASKS: dict[str, Task] = {
    "digits": Task("digits", "digits", epochs=10, batch_size=32, lr=3e-3, _build=_mlp),
    "mnist1d": Task(
        "mnist1d",
        "mnist1d",
        epochs=20,
        batch_size=64,
        lr=3e-3,
        weight_decay=1e-4,
        dataset_kwargs={"num_samples": 10000},
        _build=lambda d: Conv1dNet(d.feature_shape[0], 32, d.num_classes),
    ),
    # The large, redundant one: MNIST-1D's generator at 62,500 samples (50,000 train, 12,500
    # test; the same 10 templates under random shifts, scales and noise, so many near-repeats).
    "mnist1d-large": Task(
        "mnist1d-large",
        "mnist1d",
        epochs=EPOCHS_MNIST1D_LARGE,
        batch_size=64,
        lr=3e-3,
        weight_decay=1e-4,
        dataset_kwargs={"num_samples": 62500},
        _build=lambda d: Conv1dNet(d.feature_shape[0], 32, d.num_classes),
    ),
    "text": Task(
        "text",
        "bbc_news",
        epochs=6,
        batch_size=32,
        lr=1e-2,
        _build=lambda d: EmbeddingBagClassifier(len(d.vocab or ()), 64, d.num_classes),
    ),
    # The demo's task: the same articles (first 128 tokens) through a small transformer, the
    # kind of model whose training step a compiler can fuse (a 1-D CNN's step is oneDNN
    # convolutions either way: measured no faster compiled on this CPU).
    "text_transformer": Task(
        "text_transformer",
        "bbc_news",
        epochs=10,
        batch_size=32,
        lr=3e-3,
        weight_decay=0.01,
        dataset_kwargs={"max_tokens": 128},
        _build=lambda d: TextTransformer(len(d.vocab or ()), d.num_classes, max_len=128),
    ),
}
TASK_NAMES: tuple[str, ...] = tuple(_TASKS)


def get_task(name: str) -> Task:
    """The :class:`Task` called ``name``.

    Raises:
        ValueError: for an unknown task.
    """
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASK_NAMES)}")
    return _TASKS[name]
