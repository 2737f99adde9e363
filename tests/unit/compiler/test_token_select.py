"""``sink_token_select``: a classifier reading one token computes only that token's row.

The dropout the pass moves past keeps each kept row's mask bit for bit (noise drawn for the whole
tensor, the row kept), so a compiled BERT classifier trained with dropout follows an eager twin
whose dropout draws the way hasten's compiled dropout does (the first-call check's reference):
fp32, rtol 1e-5 / atol 1e-6 on the losses and the parameters after 3 SGD steps (matrix products
of one row instead of all may round differently in the last bit; SGD, not AdamW, whose first step
turns the rounding noise of a gradient that is zero in exact arithmetic, such as a key bias's,
into a full step of either sign).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import hasten
from hasten.compiler import compile_report
from hasten.compiler.check import _eager_dropout_like_compiled
from hasten.compiler.passes.dropout import cheap_dropout, cheap_dropout_attention
from hasten.compiler.passes.token_select import dropout_rows

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _seeded(seed: int, fn, *args, **kwargs):
    torch.manual_seed(seed)
    return fn(*args, **kwargs)


@pytest.mark.parametrize(("dim", "index"), [(1, 0), (1, 5), (0, 2)])
def test_hashed_dropout_of_a_row_is_that_row_of_the_whole_tensors_dropout(dim, index):
    full = torch.randn(3, 7, 33)
    whole = _seeded(0, cheap_dropout, full, 0.3)
    row = full.select(dim, index)
    got = _seeded(0, cheap_dropout, row, 0.3, rows_of=(full.shape, dim, index))
    torch.testing.assert_close(got, whole.select(dim, index), rtol=0, atol=0)
    assert (got == 0).any() and (got != 0).any()


def test_aten_dropout_of_a_row_is_that_row_of_the_whole_tensors_dropout():
    full = torch.randn(4, 9, 16)
    whole = _seeded(0, F.dropout, full, 0.25, True)
    got = _seeded(0, dropout_rows, full.select(1, 3), 0.25, full.shape, 1, 3)
    torch.testing.assert_close(got, whole.select(1, 3), rtol=0, atol=0)


def test_hashed_attention_dropout_of_one_query_is_that_querys_row():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, 10, 8, generator=g) for _ in range(3))
    keep = torch.ones(2, 1, 10, 10, dtype=torch.bool)
    keep[1, ..., 7:] = False
    whole = _seeded(0, cheap_dropout_attention, q, k, v, keep, 0.4)
    got = _seeded(
        0,
        cheap_dropout_attention,
        q[:, :, 4:5],
        k,
        v,
        keep[:, :, 4:5],
        0.4,
        query_of=(10, 4),
    )
    torch.testing.assert_close(got, whole[:, :, 4:5], rtol=1e-6, atol=1e-7)


def _bert(dropout: float):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        num_labels=3,
    )
    return transformers.BertForSequenceClassification(cfg)


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 100, (4, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0  # a padded sequence
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 2, 0])}


def _train(model, steps: int) -> list[float]:
    batch, losses = _batch(), []
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        torch.manual_seed(100 + step)
        opt.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _moves(model) -> int:
    return sum(s.changes["selection_moved"] for s in compile_report(model).pass_stats)


@pytest.mark.parametrize("hashed", [True, False], ids=["hashed_dropout", "aten_dropout"])
def test_a_bert_classifier_with_dropout_trains_as_eager_does(hashed, tmp_path):
    torch.manual_seed(0)
    eager, compiled = _bert(0.1), _bert(0.1)
    compiled.load_state_dict(eager.state_dict())
    passes = {} if hashed else {"cheap_dropout_rng": False}
    hasten.compile(compiled, regions="whole", passes=passes, cache_dir=tmp_path)
    with _eager_dropout_like_compiled(hashed):
        expected = _train(eager.train(), 3)
    got = _train(compiled.train(), 3)
    # the last layer: output dropouts, norms, feed-forward, output projection and, with the
    # hashed dropout, attention and the query (ATen's dropout inside SDPA stops it there)
    assert _moves(compiled) >= (15 if hashed else 10)
    report = compile_report(compiled)
    assert report.checks and all("matches eager" in line for line in report.checks), report.checks
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    for (name, a), (_, b) in zip(eager.named_parameters(), compiled.named_parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


def test_the_opt_out_leaves_every_row(tmp_path):
    model = _bert(0.0)
    hasten.compile(
        model,
        regions="whole",
        passes={"sink_token_select": False},
        verify_first_call=False,
        cache_dir=tmp_path,
    )
    _train(model.train(), 1)
    assert _moves(model) == 0
