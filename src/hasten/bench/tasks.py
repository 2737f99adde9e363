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
finetune-  the mnist1d CNN, its conv layers pretrained AdamW 1e-3, batch 64, 6 epochs: MNIST-1D
mnist1d    on MNIST-1D digits 0-4 (another generation, digits 5-9 (8,007 train signals), from the
           seed 7, 15,925 signals), a fresh head      checkpoint
finetune-  the text EmbeddingBag, its embeddings       AdamW 3e-3, batch 32, 4 epochs: topics of
text       pretrained by CBOW (±32 words, no labels)  64-token passages (4,800 train) of other
           on 846 BBC articles, a fresh head          articles, from the checkpoint
=========  ==========================================  ===========================================

The fine-tunes' checkpoints (:class:`Pretraining`) are made offline, deterministically, the
first time a run needs one, and read from a cache after that (:func:`pretrained_checkpoint`),
as a downloaded checkpoint would be.

``text_transformer`` (the demo's task): the first 128 tokens of the BBC News articles through a
2-layer, 64-d transformer encoder (:class:`TextTransformer`), AdamW, batch 32, 10 epochs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hasten.bench.datasets import PAD, SplitData, bbc_passage_split, load_dataset

__all__ = [
    "TASK_NAMES",
    "Conv1dNet",
    "EmbeddingBagClassifier",
    "Pretraining",
    "Task",
    "TextTransformer",
    "get_task",
    "lr_at",
    "pretrained_checkpoint",
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
        pretrain: For a fine-tune: how its starting checkpoint is made (offline,
            deterministically, cached on disk: :func:`pretrained_checkpoint`); the model is
            then built from the checkpoint with a fresh head drawn from the run's seed.
    """

    name: str
    dataset: str
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float = 0.0
    warmup: float = 0.05
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    pretrain: Pretraining | None = None
    _build: Callable[..., nn.Module] | None = field(default=None, repr=False)

    def data(self) -> SplitData:
        return load_dataset(self.dataset, **self.dataset_kwargs)

    def build_model(self, seed: int, data: SplitData | None = None) -> nn.Module:
        """A freshly initialised model; the same ``seed`` gives the same weights (for a
        fine-tune: the checkpoint's, with a head drawn from ``seed``)."""
        data = data or self.data()
        assert self._build is not None  # set by every task in this module
        checkpoint = None if self.pretrain is None else pretrained_checkpoint(self.pretrain)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if checkpoint is None:
                return self._build(data)
            return self._build(data, checkpoint["state"])

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


# --------------------------------------------------------------------------- pretraining


@dataclass(frozen=True)
class Pretraining:
    """How a fine-tune task's checkpoint is made: offline, from a fixed seed, on one thread.

    Attributes:
        name: The checkpoint's name (its file is ``<name>-<hash of these fields>.pt``).
        objective: ``"classify"``: a :class:`Conv1dNet` trained on ``dataset`` (its labels);
            ``"cbow"``: an ``EmbeddingBag`` trained to predict each word of the BBC News
            pretraining corpus (:func:`~hasten.bench.datasets.bbc_passage_split`) from the mean
            embedding of the ``window`` words either side (CBOW, word2vec's), no labels.
        dataset: The pretraining data (``"classify"``: a dataset name; ``"cbow"``: ignored,
            the corpus of ``dataset_kwargs``' passage split).
        dataset_kwargs: Its loader's options.
        epochs: Passes over the pretraining data.
        batch_size: Pretraining batch size.
        lr: Peak learning rate (AdamW, linear warm-up 5 %, cosine decay).
        weight_decay: AdamW weight decay.
        window: CBOW context words on each side.
        targets: CBOW predicts only the ``targets`` most frequent words (the rest are context).
        seed: Seeds the initial weights and the data order.
    """

    name: str
    objective: str
    dataset: str
    dataset_kwargs: dict[str, Any]
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float = 0.0
    window: int = 8
    targets: int = 4000
    seed: int = 0

    def key(self) -> str:
        """A short hash of every field and of the dataset's revision
        (:data:`PRETRAINING_DATA_REVISIONS`): a change of recipe, or of the data a loader gives,
        makes a new checkpoint."""
        revision = PRETRAINING_DATA_REVISIONS.get(self.dataset, 1)
        fields = asdict(self) | ({"data_revision": revision} if revision > 1 else {})
        text = json.dumps(fields, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


PRETRAINING_DATA_REVISIONS: dict[str, int] = {"bbc_passages": 2}
"""Per pretraining dataset, bumped when its loader's output changes, so a cached checkpoint of
the old data is not read as the new one's (``bbc_passages`` 2: the corpus leaves out the
near-repeats of fine-tune and test articles). Revision 1 adds nothing to the key."""


def _cache_dir() -> Path:
    root = os.environ.get("HASTEN_PRETRAINED_DIR")
    return Path(root) if root else Path(tempfile.gettempdir()) / "hasten-pretrained"


def _fit(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    spec: Pretraining,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    gen = torch.Generator().manual_seed(spec.seed)
    steps_per_epoch = math.ceil(len(y) / spec.batch_size)
    total = spec.epochs * steps_per_epoch
    step = 0
    model.train()
    for _ in range(spec.epochs):
        order = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), spec.batch_size):
            idx = order[i : i + spec.batch_size]
            for group in opt.param_groups:
                group["lr"] = lr_at(step / total, spec.lr, 0.05)
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()
            step += 1


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    correct = sum(
        int((model(x[i : i + 1024]).argmax(1) == y[i : i + 1024]).sum())
        for i in range(0, len(y), 1024)
    )
    model.train()
    return correct / max(1, len(y))


def _cbow_windows(corpus: torch.Tensor, window: int, targets: int) -> tuple[torch.Tensor, ...]:
    """``(contexts [n, 2 * window], centres [n])`` of every word of ``corpus`` that is one of
    the ``targets`` most frequent (ids ``2 .. targets - 1``; 0 pad, 1 unknown)."""
    padded = F.pad(corpus, (window, window), value=PAD)
    win = padded.unfold(1, 2 * window + 1, 1).reshape(-1, 2 * window + 1)
    centre = win[:, window]
    keep = (centre >= 2) & (centre < targets)
    ctx = torch.cat([win[:, :window], win[:, window + 1 :]], 1)
    return ctx[keep], centre[keep]


def _pretrain(spec: Pretraining) -> dict[str, Any]:
    """Train the checkpoint ``spec`` describes; its state and what it reached."""
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        if spec.objective == "classify":
            data = load_dataset(spec.dataset, **spec.dataset_kwargs)
            model: nn.Module = Conv1dNet(data.feature_shape[0], 32, data.num_classes)
            _fit(model, data.x_train, data.y_train, spec, F.cross_entropy)
            info = {
                "samples": len(data.y_train),
                "test_acc": _accuracy(model, data.x_test, data.y_test),
                "source": data.source,
            }
            state = {k: v for k, v in model.state_dict().items() if k.startswith("features.")}
        elif spec.objective == "cbow":
            split = bbc_passage_split(**spec.dataset_kwargs)
            vocab = len(split.task.vocab or ())
            targets = min(spec.targets, vocab)
            ctx, centre = _cbow_windows(split.corpus, spec.window, targets)
            n_held = len(centre) // 20  # 5 % of the windows (the corpus' last) say what it learned
            model = nn.Sequential(
                nn.EmbeddingBag(vocab, 64, mode="mean", padding_idx=PAD), nn.Linear(64, targets)
            )
            _fit(model, ctx[:-n_held], centre[:-n_held], spec, F.cross_entropy)
            info = {
                "samples": len(centre) - n_held,
                "corpus_articles": len(split.corpus),
                "held_out_word_acc": _accuracy(model, ctx[-n_held:], centre[-n_held:]),
                "targets": targets,
                "vocab": vocab,
            }
            state = {"embed.weight": model[0].weight.detach().clone()}
        else:
            raise ValueError(f"unknown pretraining objective {spec.objective!r}")
    info["seconds"] = time.perf_counter() - t0
    info["torch_threads"] = torch.get_num_threads()
    digest = hashlib.sha256()
    for k in sorted(state):
        digest.update(k.encode())
        digest.update(state[k].contiguous().numpy().tobytes())
    info["sha256"] = digest.hexdigest()
    return {"state": state, "info": info, "spec": asdict(spec)}


_LOADED: dict[str, dict[str, Any]] = {}


def _load_or_build(spec: Pretraining, file: Path) -> dict[str, Any]:
    if file.exists():
        ckpt = torch.load(file, weights_only=True)
        ckpt["info"]["loaded_from"] = str(file)
        return ckpt
    ckpt = _pretrain(spec)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(f".tmp{os.getpid()}")
    torch.save(ckpt, tmp)
    tmp.replace(file)  # atomic: a concurrent process reads a whole file or builds its own
    ckpt["info"]["saved_to"] = str(file)
    return ckpt


def pretrained_checkpoint(spec: Pretraining) -> dict[str, Any]:
    """The checkpoint ``spec`` describes: ``{"state", "info", "spec"}``, ``state`` the weights
    a fine-tune starts from (no head). Built once and cached in
    ``$HASTEN_PRETRAINED_DIR`` (default ``<tmp>/hasten-pretrained``) under a hash of the recipe,
    then read from there, as a downloaded checkpoint would be; ``info`` says what pretraining
    reached, how long it took and the weights' sha256 (equal across machines only where the
    arithmetic is)."""
    if not isinstance(spec.dataset_kwargs, dict):
        raise TypeError("Pretraining.dataset_kwargs must be a dict")
    path = str(_cache_dir() / f"{spec.name}-{spec.key()}.pt")
    if path not in _LOADED:
        _LOADED[path] = _load_or_build(spec, Path(path))
    return _LOADED[path]


def _load_body(model: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    """``model`` with the checkpoint's weights; the parts it has none for (the head) keep
    their fresh initialisation."""
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"the checkpoint has weights this model lacks: {result.unexpected_keys}")
    return model


def _finetune_conv1d(data: SplitData, state: dict[str, torch.Tensor]) -> nn.Module:
    return _load_body(Conv1dNet(data.feature_shape[0], 32, data.num_classes), state)


def _finetune_bag(data: SplitData, state: dict[str, torch.Tensor]) -> nn.Module:
    return _load_body(EmbeddingBagClassifier(len(data.vocab or ()), 64, data.num_classes), state)


EPOCHS_MNIST1D_LARGE = 12
"""Epoch budget of ``mnist1d-large``: short enough that a run costs ~30 s at 1 CPU thread,
long enough that training less visibly loses accuracy (see ``docs/bench.md``)."""


FINETUNE_EPOCHS = {"finetune-mnist1d": 6, "finetune-text": 4}
"""Epoch budgets of the fine-tunes: a few epochs, as a user fine-tunes a checkpoint."""


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
    # Pretrained fine-tunes (the regime where data is redundant): a checkpoint made offline on
    # one task, fine-tuned for a few epochs on another, with a fresh head (pretrained_checkpoint).
    "finetune-mnist1d": Task(
        "finetune-mnist1d",
        "mnist1d_classes",
        epochs=FINETUNE_EPOCHS["finetune-mnist1d"],
        batch_size=64,
        lr=1e-3,
        weight_decay=1e-4,
        dataset_kwargs={"num_samples": 20000, "seed": 42, "classes": (5, 6, 7, 8, 9)},
        pretrain=Pretraining(
            "conv1d-mnist1d-0to4",
            "classify",
            "mnist1d_classes",
            {"num_samples": 40000, "seed": 7, "classes": (0, 1, 2, 3, 4)},
            epochs=15,
            batch_size=64,
            lr=3e-3,
            weight_decay=1e-4,
        ),
        _build=_finetune_conv1d,
    ),
    "finetune-text": Task(
        "finetune-text",
        "bbc_passages",
        epochs=FINETUNE_EPOCHS["finetune-text"],
        batch_size=32,
        lr=3e-3,
        # CBOW with a wide window (±32 words): topical embeddings; ±8 gave none of the gain
        # (4 epochs from scratch matched it), ±32 +1.6 points over scratch (2 seeds, pilot)
        pretrain=Pretraining("bag-bbc-cbow", "cbow", "bbc_passages", {}, 3, 512, 3e-3, window=32),
        _build=_finetune_bag,
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
