"""Benchmark models built from configs with random weights, in three sizes.

=======  ===============================================  =====================================
size     meant for                                        examples
=======  ===============================================  =====================================
tiny     tests: compiles in seconds on 2 CPU cores        GPT-2 2 layers x 32 wide, seq 16
small    CPU benchmarks                                   GPT-2/BERT/RoBERTa 4 layers x 256, seq 128
base     real sizes (CPU and GPU)                         GPT-2 124M, BERT-base, a Llama-style
                                                          12 x 768 decoder (GQA); batch 2 x 256
=======  ===============================================  =====================================

Each model comes with a batch maker and a loss, so a benchmark or a test can run a full training
step without knowing the model family::

    from hasten.bench.models import get_model_spec

    spec = get_model_spec("gpt2", "tiny")
    model = spec.build(seed=0)
    batch = spec.make_batch(torch.Generator().manual_seed(0))
    spec.loss(model, batch).backward()

Transformers models are built from their configs (``GPT2Config``, ``BertConfig``,
``RobertaConfig``, ``LlamaConfig``); nothing is downloaded. The small sizes use an 8192-token vocabulary so the
embedding and LM head do not dominate a 256-wide model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hasten.bench._optional import require

__all__ = ["MODEL_NAMES", "SIZES", "ModelSpec", "SmallCNN", "get_model_spec"]

MODEL_NAMES = ("mlp", "cnn", "gpt2", "bert", "roberta", "llama")
SIZES = ("tiny", "small", "base")

Batch = Any


@dataclass(frozen=True)
class ModelSpec:
    """A model family at one size: how to build it, feed it and compute its training loss.

    Attributes:
        name: Model family (one of :data:`MODEL_NAMES`).
        size: One of :data:`SIZES`.
        batch_size: Default batch size of :meth:`make_batch`.
        seq_len: Sequence length for the transformer models, ``None`` for the others.
        hparams: The config values the model is built from (recorded with benchmark results).
    """

    name: str
    size: str
    batch_size: int
    seq_len: int | None
    hparams: dict[str, Any]
    _build: Callable[[], nn.Module] = field(repr=False)
    _make_batch: Callable[[int, torch.Generator], Batch] = field(repr=False)
    _per_sample_loss: Callable[[nn.Module, Batch], torch.Tensor] = field(repr=False)
    _loss: Callable[[nn.Module, Batch], torch.Tensor] = field(repr=False)

    def build(self, seed: int = 0) -> nn.Module:
        """A fresh model with random weights drawn from ``seed`` (the global RNG is left as it was)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self._build()

    def make_batch(
        self,
        generator: torch.Generator | None = None,
        batch_size: int | None = None,
        device: torch.device | str = "cpu",
    ) -> Batch:
        """A random batch (inputs and labels) on ``device``."""
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        batch = self._make_batch(batch_size or self.batch_size, gen)
        return _to(batch, torch.device(device))

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The scalar training loss, computed the way a user of this model family would."""
        return self._loss(model, batch)

    def per_sample_loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """One loss per sample (shape ``[batch]``), for sifting."""
        return self._per_sample_loss(model, batch)


def get_model_spec(name: str, size: str = "tiny") -> ModelSpec:
    """The :class:`ModelSpec` of model family ``name`` at ``size``.

    Raises:
        ValueError: for an unknown name or size.
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    return _FACTORIES[name](size)


def _to(batch: Batch, device: torch.device) -> Batch:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to(v, device) for v in batch)
    return batch


# --------------------------------------------------------------------------- MLP and CNN


def _classifier_losses(
    forward: Callable[[nn.Module, Batch], torch.Tensor],
) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
    def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(forward(model, batch), batch[1])

    def per_sample(model: nn.Module, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(forward(model, batch), batch[1], reduction="none")

    return loss, per_sample


def _mlp(size: str) -> ModelSpec:
    dims = {"tiny": (16, 32, 4), "small": (784, 1024, 10), "base": (1024, 4096, 10)}[size]
    batch_size = {"tiny": 8, "small": 128, "base": 512}[size]
    d_in, hidden, classes = dims

    def build() -> nn.Module:
        return nn.Sequential(
            nn.Linear(d_in, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, classes),
        )

    def make_batch(n: int, g: torch.Generator) -> Batch:
        return torch.randn(n, d_in, generator=g), torch.randint(0, classes, (n,), generator=g)

    loss, per_sample = _classifier_losses(lambda m, b: m(b[0]))
    hp = {"d_in": d_in, "hidden": hidden, "classes": classes, "depth": 3}
    return ModelSpec("mlp", size, batch_size, None, hp, build, make_batch, per_sample, loss)


class SmallCNN(nn.Module):
    """A ResNet-style image classifier: conv stem, residual stages with BatchNorm, global pool."""

    def __init__(self, widths: tuple[int, ...], classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(),
        )
        stages: list[nn.Module] = []
        prev = widths[0]
        for i, width in enumerate(widths):
            stages.append(_ResidualBlock(prev, width, stride=1 if i == 0 else 2))
            prev = width
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(prev, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class _ResidualBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


def _cnn(size: str) -> ModelSpec:
    widths, image, batch_size = {
        "tiny": ((8, 16), 16, 4),
        "small": ((32, 64, 128), 32, 32),
        "base": ((64, 128, 256, 512), 32, 256),
    }[size]

    def make_batch(n: int, g: torch.Generator) -> Batch:
        x = torch.randn(n, 3, image, image, generator=g)
        return x, torch.randint(0, 10, (n,), generator=g)

    loss, per_sample = _classifier_losses(lambda m, b: m(b[0]))
    hp = {"widths": list(widths), "image": image, "classes": 10}
    return ModelSpec(
        "cnn", size, batch_size, None, hp, lambda: SmallCNN(widths), make_batch, per_sample, loss
    )


# --------------------------------------------------------------------------- Transformers


_TRANSFORMER_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"layers": 2, "hidden": 32, "heads": 2, "vocab": 128, "seq": 16, "batch": 4},
    "small": {"layers": 4, "hidden": 256, "heads": 4, "vocab": 8192, "seq": 128, "batch": 8},
    # GPT-2 124M's shape at a batch a 2-core CPU trains in seconds (a step is ~394 GFLOP)
    "base": {"layers": 12, "hidden": 768, "heads": 12, "vocab": 50257, "seq": 256, "batch": 2},
}


def _token_batch(
    vocab: int, seq: int, with_labels: bool
) -> Callable[[int, torch.Generator], Batch]:
    def make_batch(n: int, g: torch.Generator) -> Batch:
        ids = torch.randint(0, vocab, (n, seq), generator=g)
        labels = ids.clone() if with_labels else torch.randint(0, 2, (n,), generator=g)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}

    return make_batch


def _hf_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(**batch).loss


def _lm_per_sample(model: nn.Module, batch: Batch) -> torch.Tensor:
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = model(**inputs).logits[:, :-1]
    targets = batch["labels"][:, 1:]
    tok = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    return tok.mean(dim=1)


def _cls_per_sample(model: nn.Module, batch: Batch) -> torch.Tensor:
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    return F.cross_entropy(model(**inputs).logits, batch["labels"], reduction="none")


def _gpt2(size: str) -> ModelSpec:
    s = _TRANSFORMER_SIZES[size]
    transformers = require("transformers", "hf")

    def build() -> nn.Module:
        cfg = transformers.GPT2Config(
            n_layer=s["layers"],
            n_embd=s["hidden"],
            n_head=s["heads"],
            vocab_size=s["vocab"],
            n_positions=max(s["seq"], 64),
            # GPT-2's special token (50256) must exist in the smaller vocabularies too.
            bos_token_id=min(50256, s["vocab"] - 1),
            eos_token_id=min(50256, s["vocab"] - 1),
        )
        return transformers.GPT2LMHeadModel(cfg)

    return ModelSpec(
        "gpt2",
        size,
        s["batch"],
        s["seq"],
        dict(s),
        build,
        _token_batch(s["vocab"], s["seq"], with_labels=True),
        _lm_per_sample,
        _hf_loss,
    )


def _encoder(name: str, size: str) -> ModelSpec:
    s = dict(_TRANSFORMER_SIZES[size])
    if size == "base":
        s["vocab"] = 30522 if name == "bert" else 50265
    transformers = require("transformers", "hf")

    def build() -> nn.Module:
        common = {
            "num_hidden_layers": s["layers"],
            "hidden_size": s["hidden"],
            "num_attention_heads": s["heads"],
            "intermediate_size": 4 * s["hidden"],
            "vocab_size": s["vocab"],
            "num_labels": 2,
        }
        if name == "bert":
            cfg = transformers.BertConfig(max_position_embeddings=max(s["seq"], 64), **common)
            return transformers.BertForSequenceClassification(cfg)
        # RoBERTa offsets positions by padding_idx + 1, so it needs two extra position slots.
        cfg = transformers.RobertaConfig(max_position_embeddings=max(s["seq"], 64) + 2, **common)
        return transformers.RobertaForSequenceClassification(cfg)

    return ModelSpec(
        name,
        size,
        s["batch"],
        s["seq"],
        s,
        build,
        _token_batch(s["vocab"], s["seq"], with_labels=False),
        _cls_per_sample,
        _hf_loss,
    )


def _llama(size: str) -> ModelSpec:
    """A Llama-style decoder (RMSNorm, rotary positions, SwiGLU, grouped-query attention with a
    third as many key/value heads as query heads) at the transformer sizes above."""
    s = dict(_TRANSFORMER_SIZES[size])
    if size == "base":
        s["vocab"] = 32000  # Llama 2's vocabulary
    s["kv_heads"] = max(1, s["heads"] // 3)
    s["intermediate"] = 8 * s["hidden"] // 3 // 64 * 64 or 4 * s["hidden"]
    transformers = require("transformers", "hf")

    def build() -> nn.Module:
        cfg = transformers.LlamaConfig(
            num_hidden_layers=s["layers"],
            hidden_size=s["hidden"],
            num_attention_heads=s["heads"],
            num_key_value_heads=s["kv_heads"],
            intermediate_size=s["intermediate"],
            vocab_size=s["vocab"],
            max_position_embeddings=max(s["seq"], 64),
            bos_token_id=0,
            eos_token_id=min(1, s["vocab"] - 1),
            pad_token_id=None,
        )
        return transformers.LlamaForCausalLM(cfg)

    return ModelSpec(
        "llama",
        size,
        s["batch"],
        s["seq"],
        s,
        build,
        _token_batch(s["vocab"], s["seq"], with_labels=True),
        _lm_per_sample,
        _hf_loss,
    )


_FACTORIES: dict[str, Callable[[str], ModelSpec]] = {
    "mlp": _mlp,
    "cnn": _cnn,
    "gpt2": _gpt2,
    "bert": lambda size: _encoder("bert", size),
    "roberta": lambda size: _encoder("roberta", size),
    "llama": _llama,
}
