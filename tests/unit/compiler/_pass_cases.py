"""Contract cases for hasten's graph passes: modules a pass must rewrite without changing results.

Every registered pass needs an entry in :data:`PASS_CASES` (a test enforces it). A case builds a
module and its inputs; ``min_changes`` is how many changes the pass must report on it (0 for cases
it must leave alone).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class PassCase:
    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator], tuple[Any, ...]]
    min_changes: int
    slow: bool = False


class NanoGPTAttention(nn.Module):
    """nanoGPT's hand-written causal self-attention (masked_fill with a buffer mask)."""

    def __init__(self, d: int = 32, heads: int = 4, block: int = 16, dropout: float = 0.0):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.attn_dropout = nn.Dropout(dropout)
        self.heads, self.d = heads, d
        self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.d, dim=2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class AdditiveMaskThenScale(nn.Module):
    """Mask added before the scale (the mask must be scaled too), torch.matmul, float mask."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
        scores = torch.matmul(q, k.transpose(2, 3)) + mask
        probs = torch.softmax(scores / math.sqrt(q.shape[-1]), dim=-1)
        return torch.matmul(probs.float(), v)


class WhereKeepQueryScaled(nn.Module):
    """torch.where(keep, scores, finfo.min) with the scale applied to q; padded batch."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 2, -1).transpose(1, 2).chunk(3, dim=-1)
        scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
        scores = torch.where(keep, scores, torch.finfo(scores.dtype).min)
        return scores.softmax(dim=-1) @ v


class ReturnsAttentionWeights(nn.Module):
    """The weights are an output too: the chain must stay."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
        w = F.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1)
        return w @ v, w


class NoOpChain(nn.Module):
    """Casts, views, transposes, dropout and arithmetic that all return their input."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x).float().contiguous().view(x.shape)
        h = h.transpose(1, 2).transpose(1, 2).permute(0, 2, 1).permute(0, 2, 1)
        h = F.dropout(h, p=0.0, training=True) * 1 + 0
        h = h.to(torch.float32) / 1 - 0
        return self.lin(h)


class MutatedAfterMulByOne(nn.Module):
    """``y = h * 1`` is a new tensor: mutating it must not touch ``h``."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        y = h * 1
        y.add_(1.0)
        return h + y


def _x(*shape: int) -> Callable[[torch.Generator], tuple[Any, ...]]:
    return lambda g: (torch.randn(*shape, generator=g, requires_grad=True),)


def _hf(kind: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        common = {"vocab_size": 64, "attn_implementation": "eager"}
        if kind == "gpt2":
            cfg = transformers.GPT2Config(
                n_layer=2,
                n_embd=32,
                n_head=2,
                n_positions=16,
                attn_pdrop=0.0,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                **common,
            )
            model = transformers.GPT2LMHeadModel(cfg)
        else:
            cfg = transformers.BertConfig(
                num_hidden_layers=2,
                hidden_size=32,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=16,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                **common,
            )
            model = transformers.BertModel(cfg)
        assert model.config._attn_implementation == "eager"
        return _LastHidden(model)

    return build


class _LastHidden(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=attention_mask, use_cache=False)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits


def _tokens(g: torch.Generator) -> tuple[Any, ...]:
    ids = torch.randint(0, 64, (2, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0  # a padded row, so the padding mask matters
    return ids, mask


def _padded_keep(g: torch.Generator) -> tuple[Any, ...]:
    keep = torch.ones(3, 1, 8, 8, dtype=torch.bool)
    keep[1, :, :, 5:] = False
    return torch.randn(3, 8, 16, generator=g, requires_grad=True), keep


def _additive(g: torch.Generator) -> tuple[Any, ...]:
    mask = torch.zeros(2, 1, 1, 8)
    mask[0, ..., 6:] = torch.finfo(torch.float32).min
    return torch.randn(2, 8, 16, generator=g, requires_grad=True), mask


PASS_CASES: dict[str, list[PassCase]] = {
    "simplify": [
        PassCase("noop_chain", NoOpChain, _x(2, 4, 8), 9),
        PassCase("mutated_copy_kept", MutatedAfterMulByOne, _x(2, 8), 0),
    ],
    "attention_to_sdpa": [
        PassCase("nanogpt_causal", NanoGPTAttention, _x(2, 16, 32), 1),
        PassCase("additive_mask_then_scale", AdditiveMaskThenScale, _additive, 1),
        PassCase("where_keep_query_scaled", WhereKeepQueryScaled, _padded_keep, 1),
        PassCase("returns_weights_left_alone", ReturnsAttentionWeights, _x(2, 8, 16), 0),
        PassCase("hf_gpt2_eager", _hf("gpt2"), _tokens, 2, slow=True),
        PassCase("hf_bert_eager", _hf("bert"), _tokens, 2, slow=True),
    ],
}
