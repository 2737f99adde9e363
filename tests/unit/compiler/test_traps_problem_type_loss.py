"""problem_type set in a Transformers *loss function* (image classifiers), not in ``forward``.

ViT, Swin, ConvNeXt and ResNet classifiers call ``self.loss_function`` (Transformers'
``ForSequenceClassificationLoss``), which sets ``config.problem_type`` at the first call with
labels: a change TorchDynamo guards on, so the model recompiled at its second step. hasten's
trap must set it before the first call, to the value the loss would set. Tiny configs, random
weights, nothing downloaded, nothing compiled.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hasten.compiler.traps import call_fixes
from tests._models import tiny_vit_config

transformers = pytest.importorskip("transformers")


def _vit(num_labels: int) -> nn.Module:
    return transformers.ViTForImageClassification(tiny_vit_config(num_labels=num_labels))


def _swin(num_labels: int) -> nn.Module:
    cfg = transformers.SwinConfig(
        image_size=16,
        patch_size=4,
        embed_dim=8,
        depths=[1, 1],
        num_heads=[1, 2],
        window_size=2,
        num_labels=num_labels,
    )
    return transformers.SwinForImageClassification(cfg)


def _convnext(num_labels: int) -> nn.Module:
    cfg = transformers.ConvNextConfig(
        num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=num_labels
    )
    return transformers.ConvNextForImageClassification(cfg)


def _resnet(num_labels: int) -> nn.Module:
    cfg = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=num_labels
    )
    return transformers.ResNetForImageClassification(cfg)


LABELS = [
    (2, torch.tensor([0, 1]), "single_label_classification"),
    (1, torch.tensor([0.5, 1.0]), "regression"),
    (3, torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]), "multi_label_classification"),
]


@pytest.mark.parametrize("build", [_vit, _swin, _convnext, _resnet])
@pytest.mark.parametrize(("num_labels", "labels", "expected"), LABELS)
def test_problem_type_set_in_the_loss_function_is_set_before_the_first_call(
    build, num_labels, labels, expected
):
    torch.manual_seed(0)
    pixels = torch.randn(2, 3, 16, 16)
    eager = build(num_labels)
    assert eager.config.problem_type is None
    eager(pixel_values=pixels, labels=labels)
    assert eager.config.problem_type == expected  # Transformers sets it, in the loss function

    model = build(num_labels)
    fixes, notes = call_fixes(model)
    assert len(fixes) == 1 and notes == []
    assert fixes[0](model, (), {"pixel_values": pixels}) is False  # no labels: not yet
    assert model.config.problem_type is None
    assert fixes[0](model, (), {"pixel_values": pixels, "labels": labels}) is True
    assert model.config.problem_type == expected


def test_loss_function_trap_is_named_when_fixing_is_off():
    fixes, notes = call_fixes(_vit(2), fix=False)
    assert fixes == [] and "config.problem_type is None" in notes[0]
    assert "loss_function" in notes[0]


def test_a_loss_function_that_never_reads_problem_type_is_left_alone():
    model = _vit(2)
    model.loss_function = lambda labels, logits, config, **kw: logits.sum()  # the user's own
    assert call_fixes(model) == ([], [])
    masked = transformers.ViTForMaskedImageModeling(tiny_vit_config())
    assert call_fixes(masked) == ([], [])  # its loss has nothing to do with problem_type
