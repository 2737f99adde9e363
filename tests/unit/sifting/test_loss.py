from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hasten.sifting import CallableLoss, Loss, PerSampleCrossEntropy
from hasten.sifting.loss import as_loss, per_sample_cross_entropy


def test_tuple_batch_matches_unreduced_cross_entropy():
    model = nn.Linear(4, 3)
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    out = PerSampleCrossEntropy().loss(model, (x, y))
    torch.testing.assert_close(out, F.cross_entropy(model(x), y, reduction="none"))


def test_dict_batch_uses_logits_attribute_and_label_key():
    class HFLike(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, input_ids, attention_mask):
            return SimpleNamespace(logits=self.lin(input_ids * attention_mask))

    model = HFLike()
    batch = {
        "input_ids": torch.randn(5, 4),
        "attention_mask": torch.ones(5, 4),
        "y": torch.arange(5) % 3,
    }
    out = PerSampleCrossEntropy(label_key="y").loss(model, batch)
    ref = F.cross_entropy(model.lin(batch["input_ids"]), batch["y"], reduction="none")
    torch.testing.assert_close(out, ref)
    with pytest.raises(KeyError, match="label_key"):
        PerSampleCrossEntropy().loss(model, batch)


def test_token_logits_mean_over_non_ignored_tokens_and_shift():
    logits = torch.randn(2, 4, 5)
    labels = torch.tensor([[1, 2, -100, -100], [0, 1, 2, 3]])
    out = per_sample_cross_entropy(logits, labels)
    tok = F.cross_entropy(logits.reshape(-1, 5), labels.reshape(-1), reduction="none").reshape(2, 4)
    torch.testing.assert_close(out, torch.stack([tok[0, :2].mean(), tok[1].mean()]))
    shifted = per_sample_cross_entropy(logits, labels, shift=True)
    tok = F.cross_entropy(
        logits[:, :-1].reshape(-1, 5), labels[:, 1:].reshape(-1), reduction="none"
    )
    tok = tok.reshape(2, 3)
    torch.testing.assert_close(shifted, torch.stack([tok[0, :1].mean(), tok[1].mean()]))


def test_unsupported_layout_names_alternatives():
    with pytest.raises(TypeError, match="CallableLoss"):
        PerSampleCrossEntropy().loss(nn.Linear(2, 2), torch.zeros(3, 2))


def test_callable_adapter_and_as_loss():
    fn = lambda model, batch: batch[0][:, 0]  # noqa: E731
    wrapped = as_loss(fn)
    assert isinstance(wrapped, CallableLoss) and "lambda" in repr(wrapped)
    torch.testing.assert_close(wrapped.loss(None, (torch.ones(3, 2),)), torch.ones(3))
    mine = PerSampleCrossEntropy()
    assert as_loss(mine) is mine and isinstance(mine, Loss)
    assert as_loss(3) is None and as_loss(None) is None
    with pytest.raises(TypeError):
        CallableLoss(3)
