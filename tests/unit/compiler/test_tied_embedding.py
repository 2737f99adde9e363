"""``tied_embedding_grad``: the embedding's rows scattered into the tied output layer's gradient.

A tiny language model whose output layer shares the embedding's weight, compiled whole, against
the same model eagerly: the pass fires once (and not on an untied model), and the parameters after
a few AdamW steps match eager's. fp32: the same sum in another order (each token's row added to
the dense gradient in turn), rtol 1e-5 / atol 1e-6; bf16 (autocast): the compiled model against
eager autocast, rtol 2e-2 / atol 2e-3 after the steps, the cast points being the same.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hasten
from hasten.compiler import compile_report
from tests._helpers import NEEDS_NATIVE_BF16

VOCAB, HIDDEN = 97, 16
TOL = {"fp32": (1e-5, 1e-6), "bf16": (2e-2, 2e-3)}


class TinyLM(nn.Module):
    def __init__(self, tied: bool = True, padding_idx: int | None = 0) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, HIDDEN, padding_idx=padding_idx)
        self.mix = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        if tied:
            self.head.weight = self.emb.weight

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.mix(self.emb(tokens)))
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (3, 40), generator=g)
    tokens[0, :5] = 0  # padding tokens: their rows are left out of the embedding's gradient
    tokens[1, :] = 7  # one token repeated: its rows add up
    return tokens, torch.randint(0, VOCAB, (3, 40), generator=g)


def _train(model: nn.Module, steps: int, bf16: bool) -> None:
    tokens, labels = _batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(tokens, labels)
        loss.backward()
        opt.step()


def _rewrites(model: nn.Module) -> int:
    stats = compile_report(model).pass_stats
    return sum(s.changes["tied_embedding_grad_scattered"] for s in stats)


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=NEEDS_NATIVE_BF16)])
@pytest.mark.parametrize("padding_idx", [0, None])
def test_a_tied_models_training_matches_eager(precision, padding_idx, tmp_path):
    torch.manual_seed(0)
    eager = TinyLM(padding_idx=padding_idx)
    compiled = TinyLM(padding_idx=padding_idx)
    compiled.load_state_dict(eager.state_dict())
    # an empty cache: a cached graph would skip the post-grad passes (and their count)
    hasten.compile(
        compiled,
        regions="whole",
        precision=precision,
        verify_first_call=False,
        cache_dir=tmp_path,
    )
    _train(eager, 4, bf16=precision == "bf16")
    _train(compiled, 4, bf16=False)  # hasten's bf16 autocasts inside the compiled model
    assert _rewrites(compiled) == 1
    assert compiled.head.weight is compiled.emb.weight  # still tied
    rtol, atol = TOL[precision]
    for (name, a), (_, b) in zip(eager.named_parameters(), compiled.named_parameters()):
        torch.testing.assert_close(b, a, rtol=rtol, atol=atol, msg=name)


def test_an_untied_model_and_the_opt_out_are_left_alone(tmp_path):
    untied = TinyLM(tied=False)
    hasten.compile(untied, regions="whole", verify_first_call=False, cache_dir=tmp_path / "a")
    _train(untied, 1, bf16=False)
    assert _rewrites(untied) == 0
    off = TinyLM()
    hasten.compile(
        off,
        regions="whole",
        verify_first_call=False,
        passes={"tied_embedding_grad": False},
        cache_dir=tmp_path / "b",
    )
    _train(off, 1, bf16=False)
    assert _rewrites(off) == 0
