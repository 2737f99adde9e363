"""Contract cases for hasten's graph passes: modules a pass must rewrite without changing results.

Every registered pass needs an entry in :data:`PASS_CASES` (a test enforces it). A case builds a
module and its inputs; ``min_changes`` is how many changes the pass must report on it (0 for cases
it must leave alone). A pass that draws other random numbers than eager (dropout) cannot match
eager's outputs; its cases give ``check``, which tests what must hold for any draw instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tests._models import TinyLM


@dataclass(frozen=True)
class PassCase:
    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator], tuple[Any, ...]]
    min_changes: int
    slow: bool = False
    # (inputs, outputs, input gradients) -> None, asserting; replaces the comparison with eager
    check: Callable[[tuple[Any, ...], list[torch.Tensor], list[torch.Tensor]], None] | None = None


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


class TinyLMPredictions(TinyLM):
    """The logits feed only an argmax (no gradient flows there): nothing to split."""

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(torch.tanh(self.body(x)))
        return logits, (logits.argmax(-1) == labels).float().mean()


class LossOnlyLM(nn.Module):
    """Returns only the loss: the logits feed the cross-entropy and nothing else."""

    def __init__(self, vocab: int = 4096, bias: bool = True, **ce: Any) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, vocab, bias=bias)
        self.ce = ce

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(torch.tanh(self.body(x)))  # (batch, seq, vocab)
        return F.cross_entropy(
            logits.float().view(-1, logits.shape[-1]), labels.view(-1), **self.ce
        )


def _lm_rows(g: torch.Generator) -> tuple[Any, ...]:
    labels = torch.randint(0, 4096, (3, 100), generator=g)  # 300 x 4096 logits: over MIN_LOGITS
    labels[:, -1] = -100  # ignored positions, as in a shifted causal-LM batch
    return torch.randn(3, 100, 8, generator=g, requires_grad=True), labels


def _lm_batch_small3(g: torch.Generator) -> tuple[Any, ...]:
    return torch.randn(3, 100, 8, generator=g), torch.randint(0, 64, (3, 100), generator=g)


def _lm_tokens(g: torch.Generator) -> tuple[Any, ...]:
    ids = torch.randint(0, 8192, (2, 64), generator=g)  # 128 x 8192 logits: MIN_LOGITS
    return ids, torch.ones_like(ids)


def _hf_causal_loss_only() -> nn.Module:
    import transformers

    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, n_positions=64, vocab_size=8192, attn_pdrop=0.0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_implementation="eager",
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"  # as hasten.compile's trap fix sets it: no graph break
    return _LossOnly(model)


class _LossOnly(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=attention_mask, labels=ids).loss


def _lm_batch(g: torch.Generator) -> tuple[Any, ...]:
    return torch.randn(256, 8, generator=g), torch.randint(0, 4096, (256,), generator=g)


class TiedEmbeddingLM(nn.Module):
    """An output layer sharing the embedding's weight (GPT-2's ``wte``), padding token 0."""

    def __init__(self, tied: bool = True) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 16, padding_idx=0)
        self.head = nn.Linear(16, 64, bias=False)
        if tied:
            self.head.weight = self.emb.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.head(torch.tanh(self.emb(tokens)))
        return F.cross_entropy(logits.flatten(0, 1), tokens.flatten().roll(1))


def _tied_tokens(g: torch.Generator) -> tuple[Any, ...]:
    tokens = torch.randint(0, 64, (2, 24), generator=g)
    tokens[0, :4] = 0  # padding
    tokens[1, :6] = 5  # a repeated token
    return (tokens,)


class TanhMLP(nn.Module):
    """The first bias feeds tanh only (unfused); the second is the output (left fused)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


class MaskedAttentionDropout(nn.Module):
    """SDPA with dropout and a padding mask; v is given, so ``v = I`` shows the probabilities."""

    def __init__(self, p: float = 0.2) -> None:
        super().__init__()
        self.p = p

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=self.p)


def _dropout_inputs(g: torch.Generator) -> tuple[Any, ...]:
    return (torch.randn(64, 1024, generator=g).abs().add(0.1).requires_grad_(),)


def _check_dropout(p: float) -> Callable[[tuple[Any, ...], list, list], None]:
    def check(inputs: tuple[Any, ...], outs: list, grads: list) -> None:
        (x,), (out,) = inputs, outs
        kept = out != 0
        # every element is dropped or scaled by 1/(1-p), exactly
        torch.testing.assert_close(out[kept], x.detach()[kept] / (1 - p), rtol=1e-6, atol=0)
        dropped = 1 - kept.float().mean().item()
        assert abs(dropped - p) < 0.01, dropped  # 65536 draws: 0.01 is over 5 sigma
        # the backward uses the same mask: d mean(out^2) / dx = 2 out / (1-p) / n where kept
        torch.testing.assert_close(grads[0], 2 * out / (1 - p) / out.numel() * kept)

    return check


def _attention_inputs(g: torch.Generator) -> tuple[Any, ...]:
    q, k = torch.randn(2, 2, 64, 8, generator=g), torch.randn(2, 2, 64, 8, generator=g)
    keep = torch.ones(2, 1, 64, 64, dtype=torch.bool)
    keep[1, ..., 40:] = False  # padded keys in the second sequence
    eye = torch.eye(64).expand(2, 2, 64, 64).clone().requires_grad_()
    return q, k, eye, keep


def _check_attention_dropout(inputs: tuple[Any, ...], outs: list, grads: list) -> None:
    q, k, _, keep = inputs
    (out,) = outs
    probs = F.scaled_dot_product_attention(q, k, torch.eye(64).expand(2, 2, 64, 64), keep)
    kept = out != 0
    torch.testing.assert_close(out[kept], probs[kept] / 0.8, rtol=1e-5, atol=1e-7)
    assert not kept[1, ..., 40:].any()  # masked keys stay masked
    live = probs > 0
    dropped = 1 - (kept & live).sum().item() / live.sum().item()
    assert abs(dropped - 0.2) < 0.02, dropped  # ~14000 live probabilities
    assert grads[-1].shape == out.shape and torch.isfinite(grads[-1]).all()


class ClsEncoder(nn.Module):
    """One post-norm encoder layer (SDPA over a per-query padding mask, GELU feed-forward) and a
    head reading the first token only, as BERT's pooler does; ``also_hidden`` returns the whole
    last layer too (so every row is needed), ``causal`` reads the last token after causal
    attention, ``mean_pool`` pools every token, ``by_hand`` writes the attention out (heads
    folded into the batch, ``masked_fill``, softmax, ``@``, a tanh-form GELU, an RMS norm)."""

    def __init__(
        self,
        d: int = 16,
        heads: int = 2,
        also_hidden: bool = False,
        causal: bool = False,
        mean_pool: bool = False,
        by_hand: bool = False,
    ):
        super().__init__()
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff1, self.ff2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.RMSNorm(d) if by_hand else nn.LayerNorm(d)
        self.head = nn.Linear(d, 3)
        self.heads, self.also_hidden, self.causal = heads, also_hidden, causal
        self.mean_pool, self.by_hand = mean_pool, by_hand

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> Any:
        b, s, d = x.shape
        q, k, v = (
            t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
            for t in self.qkv(x).split(d, dim=2)
        )
        if self.by_hand:
            hd = d // self.heads
            scores = (q.reshape(-1, s, hd) @ k.reshape(-1, s, hd).transpose(1, 2)) / hd**0.5
            scores = scores.view(b, self.heads, s, s).masked_fill(~keep, float("-inf"))
            a = (scores.softmax(-1).view(-1, s, s) @ v.reshape(-1, s, hd)).view(b, -1, s, hd)
        elif self.causal:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        h = self.norm1(x + self.out(a.permute(0, 2, 1, 3).reshape(b, s, d)))
        f = self.ff1(h)
        if self.by_hand:
            f = 0.5 * f * (1.0 + torch.tanh(0.79788456 * (f + 0.044715 * torch.pow(f, 3.0))))
        else:
            f = F.gelu(f)
        h = self.norm2(h + self.ff2(f))
        if self.mean_pool:
            pooled = h.mean(1)
        else:
            pooled = h[:, -1] if self.causal else h[:, 0]
        logits = self.head(torch.tanh(pooled))
        return (logits, h) if self.also_hidden else logits


def _cls_inputs(g: torch.Generator) -> tuple[Any, ...]:
    keep = torch.ones(3, 1, 8, 8, dtype=torch.bool)
    keep[1, :, :, 5:] = False  # padded keys in the second sequence
    keep[2, :, 0, 6:] = False  # the first query of the third sees fewer keys than the others
    return torch.randn(3, 8, 16, generator=g, requires_grad=True), keep


def _hf_classifier(kind: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        common = {
            "vocab_size": 66,  # ids + 2: none is RoBERTa's padding id (1)
            "num_hidden_layers": 2,
            "hidden_size": 32,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 40,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "num_labels": 3,
        }
        if kind == "bert":
            model = transformers.BertForSequenceClassification(transformers.BertConfig(**common))
        else:
            model = transformers.RobertaForSequenceClassification(
                transformers.RobertaConfig(**common)
            )
        return _Logits(model)

    return build


class _Logits(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids + 2, attention_mask=attention_mask).logits


def _lm_batch_small(g: torch.Generator) -> tuple[Any, ...]:
    return torch.randn(256, 8, generator=g), torch.randint(0, 64, (256,), generator=g)


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
    "cheap_dropout_rng": [
        PassCase("dropout", lambda: nn.Dropout(0.3), _dropout_inputs, 1, check=_check_dropout(0.3)),
        PassCase(
            "attention_dropout",
            MaskedAttentionDropout,
            _attention_inputs,
            1,
            check=_check_attention_dropout,
        ),
        PassCase("eval_dropout_left_alone", lambda: nn.Dropout(0.3).eval(), _dropout_inputs, 0),
        PassCase("no_attention_dropout", lambda: MaskedAttentionDropout(0.0), _attention_inputs, 0),
    ],
    "unfuse_bias_add": [PassCase("bias_into_tanh", TanhMLP, _x(4, 8), 1)],
    "tied_embedding_grad": [
        PassCase("tied_with_padding", TiedEmbeddingLM, _tied_tokens, 1),
        PassCase("untied_left_alone", lambda: TiedEmbeddingLM(tied=False), _tied_tokens, 0),
    ],
    "fused_linear_cross_entropy": [
        # (several chunks: tests/unit/compiler/test_linear_ce.py)
        PassCase("loss_only_mean_ignored_rows", LossOnlyLM, _lm_rows, 1),
        # (a sum's gradients are checked against float64 in test_linear_ce.py: eager's own fp32
        # rounding of them exceeds this harness's fp32 tolerance)
        PassCase("loss_only_no_bias", lambda: LossOnlyLM(bias=False), _lm_rows, 1),
        PassCase("logits_returned_left_alone", TinyLM, _lm_batch, 0),
        PassCase("small_logits_left_alone", lambda: LossOnlyLM(vocab=64), _lm_batch_small3, 0),
        PassCase(
            "label_smoothing_left_alone", lambda: LossOnlyLM(label_smoothing=0.1), _lm_rows, 0
        ),
        PassCase("hf_gpt2_loss_only", _hf_causal_loss_only, _lm_tokens, 1, slow=True),
    ],
    "split_at_returned_logits": [
        PassCase("loss_and_logits", TinyLM, _lm_batch, 1),
        PassCase("logits_only_predicted", TinyLMPredictions, _lm_batch, 0),
        PassCase("small_logits_left_alone", lambda: TinyLM(vocab=64), _lm_batch_small, 0),
    ],
    "simplify": [
        PassCase("noop_chain", NoOpChain, _x(2, 4, 8), 9),
        PassCase("mutated_copy_kept", MutatedAfterMulByOne, _x(2, 8), 0),
    ],
    "sink_token_select": [
        # linear, layer norm, GELU, residual adds, reshape, permute, SDPA (query row and mask row)
        PassCase("cls_head", ClsEncoder, _cls_inputs, 12),
        # matmul (batch and row), softmax, masked_fill, reshapes that fold the heads, pow
        PassCase("cls_head_attention_by_hand", lambda: ClsEncoder(by_hand=True), _cls_inputs, 20),
        # stops at the causal attention: the last query needs every key, the pass no query math
        PassCase("causal_last_token", lambda: ClsEncoder(causal=True), _cls_inputs, 6),
        PassCase("hidden_also_returned", lambda: ClsEncoder(also_hidden=True), _cls_inputs, 0),
        PassCase("mean_pool_left_alone", lambda: ClsEncoder(mean_pool=True), _cls_inputs, 0),
        PassCase("hf_bert_classifier", _hf_classifier("bert"), _tokens, 10, slow=True),
        PassCase("hf_roberta_classifier", _hf_classifier("roberta"), _tokens, 10, slow=True),
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
